package bridge

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	brokerlink "github.com/meshbox/meshbox/bridge/link"

	"github.com/meshbox/meshbox/bridge/codec"

	amqp "github.com/rabbitmq/amqp091-go"
)

// readEvents republishes mesh events to local subscribers, in order, and
// acks each once published. Exits when the delivery channel closes.
func (s *session) readEvents(ds <-chan amqp.Delivery) {
	for d := range ds {
		s.orderedSeen(d.DeliveryTag) // no command: nothing of a key to wait for
		if err := s.republishEvent(&d); err != nil {
			s.deadLetter(&d, codec.EventQueue(s.b.cfg.Node), err)
			continue
		}
		s.ack(d.DeliveryTag, opAck)
	}
}

// republishEvent publishes a mesh event to local subscribers. The node's
// own events come back through the shared binding and are dropped here
// (no echo), as is an event that does not open. A non-nil error is the
// reason to dead-letter the delivery.
func (s *session) republishEvent(d *amqp.Delivery) error {
	b := s.b
	env, err := s.decode(codec.TypeEvent, d)
	// This node's bindings may not bind the topic to the scope the event
	// was sealed for yet: it waits for them a moment (bindingLag), holding
	// the events behind it, before it refuses the event — once per change
	// of its bindings (con.lagSpent), so that a member sending mis-scoped
	// events cannot hold the stream up once per event.
	if ue := codec.AsUnseal(err); ue != nil && ue.Lagging && s.con.lagSpent != b.cfg.Keys.Bindings() {
		for wait := time.Now().Add(bindingLag); ; {
			if !time.Now().Before(wait) {
				s.con.lagSpent = b.cfg.Keys.Bindings()
				break
			}
			select {
			case <-s.ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
			env, err = s.decode(codec.TypeEvent, d)
			if ue := codec.AsUnseal(err); ue == nil || !ue.Lagging || s.ctx.Err() != nil {
				break
			}
		}
	}
	if ue := codec.AsUnseal(err); ue != nil {
		b.unsealFailed(codec.TypeEvent, ue)
		return nil
	}
	if err != nil {
		return err
	}
	if env.Origin == b.cfg.Node {
		return nil
	}
	if b.cfg.Keys != nil {
		if reason := b.events.Admit(env.Origin, env.Name, env.MsgID, env.SealedAt, time.Now()); reason != "" {
			b.replayRefused(&codec.ReplayError{Shape: codec.TypeEvent, Reason: reason, Detail: fmt.Sprintf(
				"event %s of node %s sealed %s", env.MsgID, env.Origin, codec.SealedText(env.SealedAt))}, env.Origin)
			return nil
		}
	}
	b.m.msg(codec.TypeEvent, "in")
	meta := map[string]string{codec.HeaderOrigin: env.Origin, codec.HeaderMsgID: env.MsgID}
	if env.Redelivered {
		meta[codec.HeaderRedelivered] = "true"
	}
	if err := b.bc.PublishMsg(env.NatsMsg(codec.SubjEvtPrefix+env.Name, meta)); err != nil {
		return codec.PlainReason("cannot publish locally: " + err.Error())
	}
	return nil
}

// sysMsg is a system message for Config.OnSystem.
type sysMsg struct {
	key, origin string
	body        []byte
}

// readSystem hands system messages from other nodes to runSystem (auto-acked:
// system messages are ephemeral). Exits when the delivery channel closes.
func (s *session) readSystem(ds <-chan amqp.Delivery) {
	b := s.b
	probe := brokerlink.ProbeKey(b.cfg.Node)
	for d := range ds {
		if d.RoutingKey == probe {
			b.m.msg(codec.TypeSystem, "in") // a peer's probe: routed here is all it asked
			continue
		}
		s.takeSystem(&d, false)
	}
}

// takeSystem hands one system message to runSystem; held: it waited for
// the bindings once already (holdForRotation).
func (s *session) takeSystem(d *amqp.Delivery, held bool) {
	b := s.b
	env, err := s.decode(codec.TypeSystem, d)
	if !held && s.holdForRotation(err, d, func(d *amqp.Delivery) { s.takeSystem(d, true) }) {
		return
	}
	if err != nil {
		s.reject(d, codec.SystemQueue(b.cfg.Node), err)
		return
	}
	if env.Origin == b.cfg.Node {
		return
	}
	if env.Verified {
		b.peers.creds.Seen(env.Origin, d.UserId)
	}
	b.m.msg(codec.TypeSystem, "in")
	if b.cfg.OnSystem == nil {
		return
	}
	select {
	case b.sysQ <- sysMsg{key: env.Name, origin: env.Origin, body: env.Body}:
	default:
		b.m.err(errKindDropped)
	}
}

// runSystem calls Config.OnSystem for each system message, in order. Exits
// when the bridge closes.
func (b *Bridge) runSystem() {
	for {
		select {
		case <-b.quit:
			return
		case m := <-b.sysQ:
			b.cfg.OnSystem(m.key, m.body, m.origin)
		}
	}
}

// PublishSystem broadcasts a system message (sys.<key>) to every other
// node and returns once the broker confirmed it. It fails at once with
// ErrLinkDown when the link is not connected: system messages are not kept.
func (b *Bridge) PublishSystem(ctx context.Context, key string, body []byte) error {
	if !codec.ValidName(key) {
		return fmt.Errorf("publish system message: %w: %q is not a valid key", codec.ErrBadInput, key)
	}
	return b.publishSystem(ctx, codec.SystemKey(key), false, body)
}

// SendSystem sends a system message to one node (to.<node>.sys.<key>). It
// fails with ErrNoRoute when that node is not connected.
func (b *Bridge) SendSystem(ctx context.Context, node, key string, body []byte) error {
	if !codec.ValidName(key) || !codec.ValidNodeName(node) {
		return fmt.Errorf("send system message: %w: node %q, key %q", codec.ErrBadInput, node, key)
	}
	return b.publishSystem(ctx, codec.AddressedSystemKey(node, key), true, body)
}

func (b *Bridge) publishSystem(ctx context.Context, rkey string, mandatory bool, body []byte) error {
	sess := b.link.sess.Load()
	if st, _ := b.link.Current(); st != StateConnected || sess == nil {
		return ErrLinkDown
	}
	out := &codec.Outgoing{Exchange: codec.ExchangeMesh, Key: rkey, Mandatory: mandatory, Kind: codec.TypeSystem,
		MsgID: newID(), Body: body, At: time.Now()}
	if err := sess.publishWait(ctx, out); err != nil {
		return fmt.Errorf("system message %s: %w", rkey, err)
	}
	return nil
}

// publishDead publishes the dead letter of d: to dead.<stage> when stage
// is set and its queue is declared in this session, else to mesh.dlx (and
// so mesh.dead). It reports whether the broker confirmed it.
func (s *session) publishDead(d *amqp.Delivery, queue string, reason error, stage string, extra map[string]string) bool {
	b := s.b
	if re := codec.AsReplay(reason); re != nil {
		// Dropped: a dead letter per replay would let the replayer fill
		// the dead-letter queues.
		origin, _, _ := ParseBrokerUser(d.UserId)
		b.replayRefused(re, origin)
		return true
	}
	var mf *codec.Malformed
	switch {
	case codec.IsForged(reason):
		b.m.err(errKindForged)
		b.forgedRefused(codec.AsForged(reason), d.Type, d.UserId)
	case errors.As(reason, &mf):
		b.m.err(errKindMalformed)
	default:
		b.m.err(errKindDeadLetter)
	}
	b.logDead(queue, d.MessageId, reason.Error())
	h := amqp.Table{}
	for k, v := range d.Headers {
		h[k] = v
	}
	for k, v := range extra {
		h[k] = v
	}
	if _, ok := h[codec.HeaderOrigin]; !ok {
		// Its publisher, for the dead letter's readers: published again by
		// this node, the dead letter's user_id is this node's.
		if node, _, ok := ParseBrokerUser(d.UserId); ok {
			h[codec.HeaderOrigin] = node
		}
	}
	// A command's reason is bound to the key its stage is sealed for.
	kind, rkey := d.Type, d.RoutingKey
	if stage != "" {
		kind, rkey = codec.TypeCommand, codec.CommandKey(stage)
	}
	delete(h, codec.HeaderDeadReasonSealed) // only this node's own
	if plain, sealed := b.reasonHeaders(codec.HeaderDeadReason, kind, rkey, d.MessageId, reason.Error(), codec.FailureClass(reason)); sealed != "" {
		h[codec.HeaderDeadReason], h[codec.HeaderDeadReasonSealed] = plain, sealed
	} else {
		h[codec.HeaderDeadReason] = plain
	}
	h[codec.HeaderDeadNode] = b.cfg.Node
	h[codec.HeaderDeadQueue] = queue
	h[codec.HeaderDeadAt] = codec.StampTime(time.Now())
	if h.Validate() != nil { // keep only what can be published again
		for k, v := range h {
			if (amqp.Table{k: v}).Validate() != nil {
				delete(h, k)
			}
		}
	}
	p := amqp.Publishing{
		Headers: h, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		DeliveryMode: amqp.Persistent, CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo,
		MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type, AppId: d.AppId, Body: d.Body,
	}
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	if stage != "" && s.hasAux(stage, auxDead) {
		out := &codec.Outgoing{Exchange: codec.ExchangeMesh, Key: codec.DeadKey(stage), Mandatory: true, Kind: "dead", MsgID: d.MessageId, Raw: &p}
		err := s.publishWait(ctx, out)
		if err == nil {
			b.deadAdded(stage)
			return true
		}
		if !errors.Is(err, ErrNoRoute) {
			return false
		}
		// The stage's dead-letter queue is gone: mesh.dead takes it.
	}
	out := &codec.Outgoing{Exchange: codec.ExchangeDLX, Key: d.RoutingKey, Kind: "dead", Raw: &p}
	return s.publishWait(ctx, out) == nil
}

// logDead logs dead letters sparingly: the 1st, 10th, 100th... of a
// process's life (the metric counts them all).
func (b *Bridge) logDead(where, id, reason string) {
	n := b.cmds.deadLogged.Add(1)
	for p := uint64(1); p <= n; p *= 10 {
		if p == n {
			b.log.Warn("message dead-lettered", "where", where, "msg_id", id, "reason", reason, "dead_letters", strconv.FormatUint(n, 10))
			return
		}
	}
}
