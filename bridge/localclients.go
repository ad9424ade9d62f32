package bridge

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"github.com/meshbox/meshbox/bridge/codec"

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
	// CallAllowed returns nil when the local client that receives on
	// reply may call capability on a node named in the subject: some of
	// the node's own capabilities answer its administrator alone, on any
	// node.
	CallAllowed(capability, reply string) error
}

// localOK checks a local message before the bridge acts on it: that a
// client published it (not JetStream, see jetStreamMade) and that its
// reply subject is one its sender may receive on. A refused message is
// dropped (its reply subject is the one place the bridge will not write
// to), counted under "forbidden" and logged once per cause.
func (b *Bridge) localOK(msg *nats.Msg) bool {
	if why := jetStreamMade(msg); why != "" {
		b.refusedLocal("jetstream", why, fmt.Errorf("a message on %s made by JetStream (%s), not published by a client", msg.Subject, why))
		return false
	}
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

// nodeCallOK checks a call of capability on a named node against the
// rights of the local client that made it; a refusal is answered 403,
// counted under "forbidden" and logged once per cause.
func (b *Bridge) nodeCallOK(msg *nats.Msg, capability string) bool {
	if b.cfg.Local == nil {
		return true
	}
	err := b.cfg.Local.CallAllowed(capability, msg.Reply)
	if err == nil {
		return true
	}
	b.refusedLocal("node_cap", inboxOwner(msg.Reply)+"/"+capability, err)
	b.replyError(msg.Reply, &ServiceError{Code: CodeForbidden, Text: err.Error()})
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
	return &localRefusal{&ServiceError{Code: CodeForbidden, Text: fmt.Sprintf("header %s: %v", codec.HeaderResultTopic, err)}}
}

// localRefusal is a 403 refusedLocal has counted already.
type localRefusal struct{ se *ServiceError }

func (e *localRefusal) Error() string { return e.se.Error() }
func (e *localRefusal) Unwrap() error { return e.se }

// refusedLocal counts a refused local message and logs the first of each
// cause (the check and whose inbox or which stage: a bounded set).
func (b *Bridge) refusedLocal(check, whose string, err error) {
	b.m.err(errKindForbidden)
	if b.seen.local.First(check + "/" + whose) {
		b.log.Warn("local message refused (logged once per cause; meshbox_errors_total{kind=\"forbidden\"} counts them all)",
			"check", check, "err", err)
	}
}

// jetStreamMade says why msg was published by the NATS server's
// JetStream rather than by a client ("" when it was not). JetStream
// answers its API on whatever reply subject the requester gave and
// delivers a push consumer's messages to whatever subject it names, and
// the server checks neither against the requester's rights: a program
// allowed the blob store could otherwise store bytes and have JetStream
// publish them as a command or an event, which the bridge would carry to
// the mesh as this node's. What JetStream publishes is marked: a
// delivery's reply subject is $JS.ACK.… (flow control: $JS.FC.…), a
// direct get's answer carries Nats-Stream and Nats-Sequence, heartbeats
// and flow control a Status, and every other API answer is a JSON object
// of an io.nats.jetstream.api.v1 type.
func jetStreamMade(msg *nats.Msg) string {
	switch {
	case strings.HasPrefix(msg.Reply, "$JS."):
		return "a JetStream reply subject"
	case msg.Header.Get("Nats-Stream") != "" || msg.Header.Get("Nats-Sequence") != "":
		return "a stream's message"
	case msg.Header.Get("Status") != "":
		return "a status message"
	case bytes.HasPrefix(msg.Data, jsAPIResponse):
		return "a JetStream API answer"
	}
	return ""
}

// jsAPIResponse starts every JetStream API answer.
var jsAPIResponse = []byte(`{"type":"io.nats.jetstream.api.v1.`)

// isForbidden reports whether err is a refusal of refusedLocal's (already
// counted).
func isForbidden(err error) bool {
	var lr *localRefusal
	return errors.As(err, &lr)
}

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
