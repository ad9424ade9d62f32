package localnats

import (
	"errors"
	"testing"

	"github.com/meshbox/meshbox/appliance/programs"
)

func TestReplyAllowed(t *testing.T) {
	progs := []programs.Program{
		{Name: "caller", Call: []string{"echo"}},
		{Name: "other", Call: []string{"echo"}, Submit: []string{"s3"}},
		{Name: "victim", Subscribe: []string{"alarm.off"}},
	}
	var closed, open Rights
	closed.set(progs, false)
	open.set(progs, true)
	for _, tt := range []struct {
		name           string
		subject, reply string
		closed, open   bool // allowed
	}{
		{"own inbox", "cap.echo", "_INBOX.caller.abc.1", true, true},
		{"on a named node", "node.beta.cap.echo", "_INBOX.caller.abc", true, true},
		{"inbox of a program that may send it too", "cap.echo", "_INBOX.other.x", true, true},
		{"inbox of a program that may not send it", "cap.echo", "_INBOX.victim.x", false, true},
		{"a program's bare prefix", "cap.echo", "_INBOX.caller", false, true},
		{"an inbox of the node's own clients", "cap.echo", "_INBOX.Zx81kQ3.7", true, true},
		{"the JetStream API", "cap.echo", "$JS.API.STREAM.CREATE.X", false, false},
		{"the node's own subjects", "cap.echo", "$MESH.module.control", false, false},
		{"an event topic", "cap.echo", "evt.alarm.off", false, false},
		{"a stage", "cap.echo", "cmd.s3", false, false},
		{"a wildcard", "cap.echo", "_INBOX.caller.>", false, false},
		{"the root alone", "cap.echo", "_INBOX.", false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, c := range []struct {
				r    *Rights
				want bool
				mode string
			}{{&closed, tt.closed, "credentials"}, {&open, tt.open, "open"}} {
				err := c.r.ReplyAllowed(tt.subject, tt.reply)
				if (err == nil) != c.want || (err != nil && !errors.Is(err, ErrReplyRefused)) {
					t.Errorf("%s: ReplyAllowed(%q, %q) = %v, want allowed %v", c.mode, tt.subject, tt.reply, err, c.want)
				}
			}
		})
	}
}

func TestResultTopicAllowed(t *testing.T) {
	var r Rights
	r.set([]programs.Program{
		{Name: "narrow", Submit: []string{"s3"}, Publish: []string{"s3.done"}},
		{Name: "wide", Submit: []string{"*"}, Publish: []string{"s3.done", "alarm.>"}},
		{Name: "bystander", Publish: []string{"x"}},
	}, false)
	for _, tt := range []struct {
		stage, topic string
		want         bool
	}{
		{"s3", "s3.done", true},    // every submitter of s3 may publish it
		{"s3", "alarm.off", false}, // narrow may submit to s3 but not publish alarm.off
		{"s4", "alarm.off", true},  // only wide submits to s4
		{"s4", "other", false},     // wide may not publish other
		{"a.b", "anything", true},  // only the node's own clients submit there (cmd.* is one token)
	} {
		err := r.ResultTopicAllowed(tt.stage, tt.topic)
		if (err == nil) != tt.want || (err != nil && !errors.Is(err, ErrResultTopicRefused)) {
			t.Errorf("ResultTopicAllowed(%q, %q) = %v, want allowed %v", tt.stage, tt.topic, err, tt.want)
		}
	}
}
