package bridge

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meshbox/meshbox/bridge/flow"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/bridge/outbox"
)

// handlerPoll is how often a command waiting for a local handler (none
// subscribed to work.<stage> right now) looks again.
const handlerPoll = 250 * time.Millisecond

// cmdCall is a command delivery at the local handler. Exactly one of the
// handler's reply, the timer or the session's end settles it; while no
// handler is subscribed the timer polls for one.
type cmdCall struct {
	stage    string
	flow     *flow.StageFlow
	sent     time.Time     // when last sent to the handler
	ack      codec.CmdAck  // settles its part of the delivery
	unopened bool          // not opened (a key this node lacks): never published again by this node
	d        amqp.Delivery // for a dead letter
	env      *codec.Envelope
	msg      *nats.Msg
	started  time.Time // when first handed to the handler, this attempt
	deadline time.Time // of this attempt: moved by the handler's progress (lease.go)
	extended int       // progress messages that moved the deadline
	timer    *time.Timer
	order    string // stage and Meshbox-Order-Key ("": none): one at a time at the handler (order.go)
	seq      uint64 // keyed: its place among the keyed commands read (order.go)
}

// readCommands passes the commands of one consumer of a stage to the local
// handler without waiting: its reply arrives on the session's command inbox
// (onCmdReply). The consumer's prefetch bounds how many are open. Exits
// when the consumer's delivery channel closes (session end or cancel).
func (s *session) readCommands(f *flow.StageFlow, ds <-chan amqp.Delivery) {
	for d := range ds {
		s.readDelivery(f, d)
		s.orderedSeen(d.DeliveryTag)
	}
}

// readDelivery passes a delivery's command, or each command of its batch,
// to the local handler.
func (s *session) readDelivery(f *flow.StageFlow, d amqp.Delivery) {
	if d.Type != codec.TypeCommandBatch {
		f.DeliveredMsg(1)
		s.readCommand(f, d, codec.CmdAck{Tag: d.DeliveryTag})
		return
	}
	entries, err := codec.DecodeBatch(&d, codec.MaxCommandBatch, codec.BatchLimit(s.b.maxPayload()))
	if derr := codec.CheckDeaths(codec.TypeCommandBatch, d.RoutingKey, d.Headers); derr != nil {
		err = derr // refused whole (replay.go)
	}
	if err != nil { // dead-lettered whole, with the reason
		bad := d
		s.work(func() { s.deadCommand(&bad, codec.CmdAck{Tag: bad.DeliveryTag}, f.Stage, err, nil) })
		return
	}
	f.DeliveredMsg(len(entries))
	left := &codec.BatchLeft{}
	left.N.Store(int32(len(entries)))
	for _, e := range entries {
		s.readCommand(f, e, codec.CmdAck{Tag: d.DeliveryTag, Batch: left})
	}
}

// readCommand passes one command to the local handler; a settles its
// part of the delivery.
func (s *session) readCommand(f *flow.StageFlow, d amqp.Delivery, a codec.CmdAck) {
	b := s.b
	stage := f.Stage
	env, err := s.decode(codec.TypeCommand, &d)
	if ue := codec.AsUnseal(err); ue != nil && ue.Lagging && ue.Env.Attempt < b.cfg.RetryBudget {
		// This node's bindings may not bind the stage to the scope it
		// was sealed for yet: given back after a pause, like a command of
		// a generation this node has not read yet, and refused only when
		// its budget is spent.
		s.requeueLater(&cmdCall{stage: stage, flow: f, ack: a, d: d, env: ue.Env, unopened: true})
		return
	}
	if ue := codec.AsUnseal(err); ue != nil {
		b.unsealFailed(codec.TypeCommand, ue)
		if ue.Reason == codec.UnsealUnknownKey && ue.Env.Attempt < b.cfg.RetryBudget {
			// This node may not have received the key yet (it just
			// joined, or a rotation is under way): given back after a
			// pause, for a node that holds it or for this one later.
			s.cmdFailed(&cmdCall{stage: stage, flow: f, ack: a, d: d, env: ue.Env, unopened: true}, ue)
			return
		}
	}
	if fg := codec.AsForged(err); fg != nil && fg.Cause == causeNewerGeneration && env != nil && env.Attempt < b.cfg.RetryBudget {
		b.askBindings()
		// This node's bindings may not list a rotation's new generation
		// yet (senders.go): given back after a pause, like a command
		// sealed with a key this node does not hold yet.
		s.requeueLater(&cmdCall{stage: stage, flow: f, ack: a, d: d, env: env, unopened: true})
		return
	}
	if err != nil { // dead-lettered with the reason
		bad := d // a copy: taking d's address would move every delivery to the heap
		s.work(func() { s.deadCommand(&bad, a, stage, err, nil) })
		return
	}
	b.m.msg(codec.TypeCommand, "in")
	b.noteDeliveryAge(stage, env.Sent)
	if env.Retry.ReplayedSealed != "" {
		env.Retry.ReplayedText = b.openReason(codec.HeaderReplayed, codec.CommandKey(stage), env.MsgID, env.Retry.Replayed, env.Retry.ReplayedSealed)
	}
	if b.files.done != nil && b.completedBefore(stage, env.MsgID) {
		s.ackCmd(a, opAck) // completed here before: not called again
		return
	}
	f.Delivered()
	seen := b.cmds.handed.Add(env.MsgID) // handed out before, though the broker may not know it
	now := time.Now()
	c := &cmdCall{stage: stage, flow: f, ack: a, d: d, env: env, started: now, deadline: now.Add(b.cfg.CommandTimeout),
		msg: env.CommandMsg(stage, seen)}
	if key := env.Header.Get(codec.HeaderOrderKey); key != "" {
		c.order = stage + " " + key
		s.orderedArrive(c)
		return
	}
	s.sendCmd(newID(), c)
}

// sendCmd registers c under token and sends it to the local handler.
func (s *session) sendCmd(token string, c *cmdCall) {
	c.msg.Reply = s.local.cmdInbox + token
	c.sent = time.Now()
	s.local.mu.Lock()
	if s.local.ended {
		s.local.mu.Unlock()
		return // the broker requeues it
	}
	s.local.cmds[token] = c
	c.timer = s.after(time.Until(c.deadline), func() { s.cmdTimeout(token) })
	s.local.mu.Unlock()
	if err := s.b.bc.PublishMsg(c.msg); err != nil {
		if c := s.takeCmd(token); c != nil {
			s.answered(c)
			s.cmdFailed(c, fmt.Errorf("calling the handler of stage %s: %v", c.stage, err))
		}
	}
}

// takeCmd removes and returns the open command token (nil: settled).
func (s *session) takeCmd(token string) *cmdCall {
	s.local.mu.Lock()
	defer s.local.mu.Unlock()
	c := s.local.cmds[token]
	if c != nil {
		delete(s.local.cmds, token)
		s.cancelTimer(c.timer)
	}
	return c
}

// endCmds forgets the open commands of an ended session: the broker
// requeues them.
func (s *session) endCmds() {
	s.local.mu.Lock()
	defer s.local.mu.Unlock()
	s.local.ended = true
	for token, c := range s.local.cmds {
		s.cancelTimer(c.timer)
		delete(s.local.cmds, token)
	}
}

// errNotHostedHere means the stage stopped being hosted on this node while
// a command waited for a handler.
var errNotHostedHere = errors.New("stage no longer hosted here")

// consumes reports whether the session still consumes stage.
func (s *session) consumes(stage string) bool {
	s.flows.mu.Lock()
	defer s.flows.mu.Unlock()
	return s.flows.stages[stage] != nil && s.b.hostsStage(stage)
}

// runLocal runs the commands accepted for local stages while the link was
// down, in order, with the same attempts and retry budget as mesh commands.
// Exits when the bridge closes.
func (b *Bridge) runLocal() {
	ctx, cancel := b.withQuit(context.Background())
	defer cancel()
	var cursor uint64
	for {
		recs, err := b.files.ob.ReadAfter(cursor, 64, outbox.KindsOf(outbox.Local))
		if err != nil {
			b.log.Error("read outbox", "err", err)
			recs = nil
		}
		if len(recs) == 0 {
			if cursor != 0 {
				cursor = 0
				continue
			}
			select {
			case <-b.quit:
				return
			case <-b.sub.localSignal:
			}
			continue
		}
		for _, r := range recs {
			if !b.runLocalRecord(ctx, r) {
				return
			}
			cursor = r.Seq
		}
	}
}

// runLocalRecord runs one local command to its end: success (deleted),
// handed to the mesh (no handler here any more and the link is up), or
// dead-lettered. It returns false when the bridge is closing.
func (b *Bridge) runLocalRecord(ctx context.Context, r *outbox.Record) bool {
	for {
		attempt := int(r.Attempt) + 1
		msg := &nats.Msg{Subject: codec.SubjWorkPrefix + r.Name, Data: r.Body, Header: make(nats.Header, len(r.Header)+4)}
		for k, vs := range r.Header {
			msg.Header[k] = vs
		}
		codec.SetCommandHeaders(msg.Header, r.MsgID, b.cfg.Node, attempt, attempt > 1 || r.Republished)
		b.noteDeliveryAge(r.Name, r.Created)
		if b.completedBefore(r.Name, r.MsgID) {
			b.files.ob.Wait(ctx, func(done func(error)) { b.files.ob.Delete(r.Seq, r.Size, done) })
			return true
		}
		resp, failure := b.runHandler(ctx, r.Name, msg, func() bool {
			st, _ := b.link.Current()
			return st != StateConnected || b.hostsStage(r.Name)
		})
		if ctx.Err() != nil {
			return false
		}
		switch {
		case failure == nil:
			b.m.msg(codec.TypeCommand, "local")
			if topic := r.Header.Get(codec.HeaderResultTopic); topic != "" && len(resp.Data) > 0 {
				b.publishResult(r.Name, topic, r.MsgID, b.cfg.Node, resp)
			}
			b.completedNow(r.Name, r.MsgID)
			b.files.ob.Wait(ctx, func(done func(error)) { b.files.ob.Delete(r.Seq, r.Size, done) })
			return true
		case errors.Is(failure, errNotHostedHere):
			// The link is up and nobody here serves the stage: let the mesh run it.
			if err := b.moveToMesh(ctx, r); err != nil {
				// Kept as it is: it is tried again after a pause.
				b.log.Error("cannot move a local command to the mesh; kept for later", "stage", r.Name, "msg_id", r.MsgID, "err", err)
				select {
				case <-time.After(time.Second):
				case <-b.quit:
					return false
				}
			}
			return true
		}
		b.m.err(errKindHandler)
		r.Attempt++
		budget, delay := b.cfg.RetryBudget, retryDelay(attempt)
		if p, ok := b.cfg.Retry[r.Name]; ok {
			budget, delay = p.Attempts, p.delay(attempt)
		}
		if int(r.Attempt) >= budget || isPermanent(failure) {
			// The original is deleted only once its dead letter is
			// committed: a failed write keeps the command, tried again
			// after a pause.
			reason := codec.Reasonf(fmt.Sprintf("attempt %d of %d failed: ", attempt, budget), failure)
			if isPermanent(failure) {
				reason = codec.Reasonf(fmt.Sprintf("permanent failure at attempt %d: ", attempt), failure)
			}
			if err := b.files.ob.Wait(ctx, func(done func(error)) { b.deadRecord(r, reason, done) }); err != nil {
				b.log.Error("cannot store the dead letter of a local command; kept for later", "stage", r.Name, "msg_id", r.MsgID, "err", err)
				select {
				case <-time.After(time.Second):
				case <-b.quit:
					return false
				}
				return true
			}
			b.files.ob.Wait(ctx, func(done func(error)) { b.files.ob.Delete(r.Seq, r.Size, done) })
			return true
		}
		b.files.ob.Wait(ctx, func(done func(error)) { b.files.ob.Replace(r, r.Size, done) }) // persists the attempt count; sets r.Size
		select {
		case <-time.After(delay):
		case <-b.quit:
			return false
		}
	}
}

// moveToMesh stores a copy of the local command r as a mesh command, and
// deletes r only once the copy is committed: a failed write loses nothing.
// meshPending counts the copy only while it may be stored.
func (b *Bridge) moveToMesh(ctx context.Context, r *outbox.Record) error {
	moved := *r
	moved.Seq = b.sub.nextSeq()
	moved.Kind = outbox.Command
	data := moved.Encode()
	b.files.ob.ReserveAlways(int64(len(data)))
	b.sub.meshPending.Add(1)
	err := b.files.ob.Wait(ctx, func(done func(error)) {
		b.files.ob.Put(&moved, data, func(err error) {
			if err != nil {
				b.sub.meshPending.Add(-1)
				b.m.err(errKindOutboxWrite)
			}
			done(err)
		})
	})
	if err != nil {
		return err
	}
	return b.files.ob.Wait(ctx, func(done func(error)) { b.files.ob.Delete(r.Seq, r.Size, done) })
}
