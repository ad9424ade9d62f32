package bridge

import (
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/bridge/outbox"
	"github.com/meshbox/meshbox/internal/seal"
)

// This file publishes commands' results as events. A submitter names an
// event topic in the command's Meshbox-Result-Topic header (checked with
// package names when submitted). It travels as a node header, sealed with
// the command in a mesh that seals (sealing.go): nobody on the way can
// send the result to another topic, say one outside the command's scope;
// a handler node of an older meshbox refuses such a command as malformed. When the handler of such a command replies
// with a result that has a body, the node that ran it publishes the body,
// with the reply's headers, as an event on that topic: to its local
// subscribers at once and to the mesh like a program's event (sealed, with
// the scope's key when the topic is bound to a scope; kept in the outbox
// while the link is down). The event's Meshbox-Msg-Id is the command's
// message id, so a result that comes twice (the command ran twice) can be
// recognised. The event is handed to the broker or the outbox before the
// command is acked; a node that crashes between the two loses the result
// of a command that completed.

// publishResult publishes the result reply of command msgID of stage,
// submitted by node origin, as an event on topic (see above). A result that cannot be published is
// counted and logged; the command still completed.
func (b *Bridge) publishResult(stage, topic, msgID, origin string, reply *nats.Msg) {
	fail := func(why string) {
		b.m.err(errKindDropped)
		b.log.Warn("result not published", "stage", stage, "msg_id", msgID, "topic", topic, "reason", why)
	}
	if err := b.notInScope(seal.BindTopic, topic, "publish to"); err != nil {
		fail(err.Error())
		return
	}
	if err := b.resultOrigin(topic, origin); err != nil {
		fail(err.Error())
		return
	}
	if len(reply.Data) > b.maxPayload() {
		fail("the result is larger than the payload limit")
		return
	}
	hdr, err := codec.CallerHeaders(reply.Header)
	if err != nil {
		fail(err.Error())
		return
	}
	for k := range hdr {
		if strings.HasPrefix(k, "Nats-") {
			delete(hdr, k)
		}
	}
	body := append([]byte(nil), reply.Data...)
	local := &nats.Msg{Subject: codec.SubjEvtPrefix + topic, Data: body, Header: make(nats.Header, len(hdr)+2)}
	maps.Copy(local.Header, hdr)
	local.Header.Set(codec.HeaderOrigin, b.cfg.Node)
	local.Header.Set(codec.HeaderMsgID, msgID)
	if err := b.bc.PublishMsg(local); err != nil {
		fail("local subscribers: " + err.Error())
	}
	b.m.results.Inc()
	b.accept(&outbox.Record{Kind: outbox.Event, Name: topic, MsgID: msgID, Header: hdr, Body: body, Created: time.Now()}, "")
}

// resultOrigin refuses a result topic bound to a scope the command's
// submitter (origin) is not in. Whoever submitted the command held its
// stage's key, not necessarily the topic's: a peer outside scope vault
// must not make a handler inside it publish on vault's topics (the
// handler would seal the result with vault's key, as its own event). The
// submitting node checks the same of itself before it accepts the command.
func (b *Bridge) resultOrigin(topic, origin string) error {
	if b.inScopeOf(seal.BindTopic, topic, origin) {
		return nil
	}
	return &ServiceError{Code: CodeForbidden, Text: fmt.Sprintf(
		"header %s: topic %s is bound to scope %s, which the command's submitter %s is not in",
		codec.HeaderResultTopic, topic, b.cfg.Keys.ScopeOf(seal.BindTopic, topic), origin)}
}
