package bridge

import (
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
)

// LocalRights tells the bridge what the local clients that may have sent a
// message may do themselves (the appliance answers from its programs'
// permissions). A local client's word is input: the bridge publishes on a
// client's behalf only where that client could have published itself.
type LocalRights interface {
	// ReplyAllowed returns nil when a message published on subject may
	// be answered at reply: an inbox a party allowed to publish subject
	// may receive on.
	ReplyAllowed(subject, reply string) error
	// ResultTopicAllowed returns nil when every party that may submit to
	// stage may publish event topic too.
	ResultTopicAllowed(stage, topic string) error
}

// replyOK checks a local client's reply subject before the bridge acts on
// the message. A refused message is dropped (its reply subject is the one
// place the bridge will not write to), counted under "forbidden" and
// logged once per cause.
func (b *Bridge) replyOK(msg *nats.Msg) bool {
	if msg.Reply == "" || b.cfg.Local == nil {
		return true
	}
	err := b.cfg.Local.ReplyAllowed(msg.Subject, msg.Reply)
	if err == nil {
		return true
	}
	b.refusedLocal("reply", inboxOwner(msg.Reply), err)
	return false
}

// resultTopicOK checks a command's Meshbox-Result-Topic against the rights
// of the parties that may submit to its stage.
func (b *Bridge) resultTopicOK(stage, topic string) error {
	if b.cfg.Local == nil {
		return nil
	}
	err := b.cfg.Local.ResultTopicAllowed(stage, topic)
	if err == nil {
		return nil
	}
	b.refusedLocal("result_topic", stage, err)
	return &localRefusal{&ServiceError{Code: CodeForbidden, Text: fmt.Sprintf("header %s: %v", HeaderResultTopic, err)}}
}

// localRefusal is a 403 refusedLocal has counted already.
type localRefusal struct{ se *ServiceError }

func (e *localRefusal) Error() string { return e.se.Error() }
func (e *localRefusal) Unwrap() error { return e.se }

// refusedLocal counts a refused local message and logs the first of each
// cause (the check and whose inbox or which stage: a bounded set).
func (b *Bridge) refusedLocal(check, whose string, err error) {
	b.m.err(errKindForbidden)
	key := check + "/" + whose
	if b.localSeenN.Load() >= maxLocalCauses {
		key = check + "/*" // a client inventing inboxes: one line more at most
	}
	if _, seen := b.localSeen.LoadOrStore(key, true); !seen {
		b.localSeenN.Add(1)
		b.log.Warn("local message refused (logged once per cause; meshbox_errors_total{kind=\"forbidden\"} counts them all)",
			"check", check, "err", err)
	}
}

// isForbidden reports whether err is a refusal of refusedLocal's (already
// counted).
func isForbidden(err error) bool {
	var lr *localRefusal
	return errors.As(err, &lr)
}

// maxLocalCauses bounds the causes refusedLocal remembers.
const maxLocalCauses = 128

// inboxOwner is the second token of an inbox subject (a program's name,
// or a client's random inbox), or "-" for a subject that is no inbox.
func inboxOwner(reply string) string {
	rest, ok := strings.CutPrefix(reply, "_INBOX.")
	if !ok {
		return "-"
	}
	owner, _, _ := strings.Cut(rest, ".")
	return owner
}
