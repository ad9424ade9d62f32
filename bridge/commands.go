package bridge

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/bridge/outbox"
	"github.com/meshbox/meshbox/internal/backoff"
	"github.com/meshbox/meshbox/internal/wire"
)

// handlerPoll is how often a command waiting for a local handler (none
// subscribed to work.<stage> right now) looks again.
const handlerPoll = 250 * time.Millisecond

// cmdCall is a command delivery at the local handler. Exactly one of the
// handler's reply, the timer or the session's end settles it; while no
// handler is subscribed the timer polls for one.
type cmdCall struct {
	stage    string
	flow     *stageFlow
	sent     time.Time     // when last sent to the handler
	ack      cmdAck        // settles its part of the delivery
	unopened bool          // not opened (a key this node lacks): never published again by this node
	d        amqp.Delivery // for a dead letter
	env      *envelope
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
func (s *session) readCommands(f *stageFlow, ds <-chan amqp.Delivery) {
	for d := range ds {
		s.readDelivery(f, d)
		s.orderedSeen(d.DeliveryTag)
	}
}

// readDelivery passes a delivery's command, or each command of its batch,
// to the local handler.
func (s *session) readDelivery(f *stageFlow, d amqp.Delivery) {
	if d.Type != typeCommandBatch {
		f.deliveredMsg(1)
		s.readCommand(f, d, cmdAck{tag: d.DeliveryTag})
		return
	}
	entries, err := decodeBatch(&d, MaxCommandBatch, batchLimit(s.b.maxPayload()))
	if derr := checkDeaths(typeCommandBatch, d.RoutingKey, d.Headers); derr != nil {
		err = derr // refused whole (replay.go)
	}
	if err != nil { // dead-lettered whole, with the reason
		bad := d
		s.work(func() { s.deadCommand(&bad, cmdAck{tag: bad.DeliveryTag}, f.stage, err, nil) })
		return
	}
	f.deliveredMsg(len(entries))
	left := &batchLeft{}
	left.n.Store(int32(len(entries)))
	for _, e := range entries {
		s.readCommand(f, e, cmdAck{tag: d.DeliveryTag, batch: left})
	}
}

// readCommand passes one command to the local handler; a settles its
// part of the delivery.
func (s *session) readCommand(f *stageFlow, d amqp.Delivery, a cmdAck) {
	b := s.b
	stage := f.stage
	env, err := s.decode(typeCommand, &d)
	if ue := asUnseal(err); ue != nil && ue.lagging && ue.env.attempt < b.cfg.RetryBudget {
		// This node's bindings may not bind the stage to the scope it
		// was sealed for yet: given back after a pause, like a command of
		// a generation this node has not read yet, and refused only when
		// its budget is spent.
		s.requeueLater(&cmdCall{stage: stage, flow: f, ack: a, d: d, env: ue.env, unopened: true})
		return
	}
	if ue := asUnseal(err); ue != nil {
		b.unsealFailed(typeCommand, ue)
		if ue.reason == unsealUnknownKey && ue.env.attempt < b.cfg.RetryBudget {
			// This node may not have received the key yet (it just
			// joined, or a rotation is under way): given back after a
			// pause, for a node that holds it or for this one later.
			s.cmdFailed(&cmdCall{stage: stage, flow: f, ack: a, d: d, env: ue.env, unopened: true}, ue)
			return
		}
	}
	if fg := asForged(err); fg != nil && fg.cause == causeNewerGeneration && env != nil && env.attempt < b.cfg.RetryBudget {
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
	b.m.msg(typeCommand, "in")
	b.noteDeliveryAge(stage, env.sent)
	if env.retry.replayedSealed != "" {
		env.retry.replayedText = b.openReason(HeaderReplayed, commandKey(stage), env.msgID, env.retry.replayed, env.retry.replayedSealed)
	}
	if b.files.done != nil && b.completedBefore(stage, env.msgID) {
		s.ackCmd(a, opAck) // completed here before: not called again
		return
	}
	f.delivered()
	seen := b.cmds.handed.add(env.msgID) // handed out before, though the broker may not know it
	now := time.Now()
	c := &cmdCall{stage: stage, flow: f, ack: a, d: d, env: env, started: now, deadline: now.Add(b.cfg.CommandTimeout),
		msg: env.commandMsg(stage, seen)}
	if key := env.header.Get(HeaderOrderKey); key != "" {
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

// onCmdReply receives a handler's reply (or "no responders") for an open
// command.
func (s *session) onCmdReply(m *nats.Msg) {
	b := s.b
	token := m.Subject[len(s.local.cmdInbox):]
	if isProgress(m.Header) {
		s.extendCmd(token)
		return
	}
	c := s.takeCmd(token)
	if c == nil {
		b.m.err(errKindLateReply)
		return
	}
	failure := handlerFailure(m.Header, c.stage, b.cfg.Node)
	switch {
	case wire.NoResponders(m.Header, m.Data):
		// No handler subscribed right now: wait for one while the stage is
		// hosted here, up to the attempt's deadline; otherwise give it back.
		if !s.consumes(c.stage) {
			c.flow.gone()
			s.giveBack(c)
			s.orderedNext(c)
			return
		}
		if time.Until(c.deadline) <= handlerPoll {
			s.answered(c)
			s.cmdFailed(c, fmt.Errorf("no handler for stage %s on node %s within %s", c.stage, b.cfg.Node, b.cfg.CommandTimeout))
			return
		}
		s.local.mu.Lock()
		if !s.local.ended {
			s.local.cmds[token] = c
			c.timer = s.after(handlerPoll, func() {
				if c := s.takeCmd(token); c != nil {
					s.sendCmd(token, c)
				}
			})
		}
		s.local.mu.Unlock()
	case failure != nil:
		s.answered(c)
		s.cmdFailed(c, failure)
	default:
		s.answered(c)
		if c.env.resultTopic != "" && len(m.Data) > 0 {
			b.publishResult(c.stage, c.env.resultTopic, c.env.msgID, c.env.origin, m)
		}
		if b.dedupes(c.stage) {
			// Recorded before the ack: a crash between the two brings a
			// redelivery this node recognises. Marked at once: a delivery
			// right behind is recognised while the write runs.
			b.files.done.begin(c.stage, c.env.msgID)
			s.con.unacked.Add(1) // until the ack is queued
			if !s.work(func() {
				defer s.con.unacked.Add(-1)
				b.completedNow(c.stage, c.env.msgID)
				s.ackCmd(c.ack, opAck)
			}) {
				s.con.unacked.Add(-1)
			}
			return
		}
		s.ackCmd(c.ack, opAck)
	}
}

// cmdTimeout settles a command whose handler did not answer in time.
func (s *session) cmdTimeout(token string) {
	if c := s.takeCmd(token); c != nil {
		s.answered(c)
		s.cmdFailed(c, fmt.Errorf("handler of stage %s on node %s did not answer within its lease (%s, %d progress messages)",
			c.stage, s.b.cfg.Node, time.Since(c.started).Round(time.Millisecond), c.extended))
	}
}

// cmdFailed retries a failed command or dead-letters it with the reason:
// at once when the failure is permanent; once its attempts are spent
// (the stage's retry policy, else RetryBudget); otherwise it waits in the
// stage's retry queue (a policy) or is requeued after a short pause.
func (s *session) cmdFailed(c *cmdCall, failure error) {
	b := s.b
	b.m.err(errKindHandler)
	p, delayed := s.retryPolicy(c.stage)
	if asUnseal(failure) != nil {
		delayed = false // not opened: nothing to seal again; the broker keeps it
	}
	budget := b.cfg.RetryBudget
	if delayed {
		budget = p.Attempts
	}
	var reason *deadReason
	switch {
	case isPermanent(failure):
		reason = reasonf(fmt.Sprintf("permanent failure at attempt %d: ", c.env.attempt), failure)
	case c.env.attempt >= budget:
		reason = reasonf(fmt.Sprintf("attempt %d of %d failed: ", c.env.attempt, budget), failure)
	case delayed:
		s.work(func() { s.retryLater(c, p, failure) })
		return
	default:
		s.requeueLater(c)
		return
	}
	extra := map[string]string{HeaderAttempts: strconv.Itoa(c.env.attempt)}
	if c.env.retry.firstFail != "" {
		extra[HeaderFirstFail] = c.env.retry.firstFail
	}
	s.work(func() { s.deadCommand(&c.d, c.ack, c.stage, reason, extra) })
}

// requeueLater gives c back to its queue after a pause that grows with its
// attempts; the next delivery counts the attempt.
func (s *session) requeueLater(c *cmdCall) {
	// Kept under a token of its own while it waits: a late reply of the
	// handler (under the old token) finds nothing.
	token := retryTokenPrefix + newID()
	s.local.mu.Lock()
	if !s.local.ended {
		s.local.cmds[token] = c
		c.timer = s.after(retryDelay(c.env.attempt), func() {
			if c := s.takeCmd(token); c != nil {
				s.giveBack(c)
			}
		})
	}
	s.local.mu.Unlock()
}

// retryTokenPrefix starts the token of a failed command waiting for its
// requeue.
const retryTokenPrefix = "retry."

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

// setCommandHeaders sets the headers a handler sees with a command on h.
// The keys are canonical already; the four values share one allocation
// (this runs for every command).
func setCommandHeaders(h nats.Header, id, origin string, attempt int, redelivered bool) {
	v := [...]string{id, origin, strconv.Itoa(attempt), strconv.FormatBool(redelivered)}
	vs := v[:]
	h[HeaderMsgID] = vs[0:1:1]
	h[HeaderOrigin] = vs[1:2:2]
	h[HeaderAttempt] = vs[2:3:3]
	h[HeaderRedelivered] = vs[3:4:4]
}

// commandMsg builds the NATS message that carries a command delivery to
// the local handler of stage; seen says this node handed the same id out
// before (a possible duplicate the broker did not mark).
func (e *envelope) commandMsg(stage string, seen bool) *nats.Msg {
	m := &nats.Msg{Subject: subjWorkPrefix + stage, Data: e.body, Header: make(nats.Header, len(e.header)+4)}
	for k, vs := range e.header {
		if !serverHeader(k) { // a peer's word: never the local server's bookkeeping
			m.Header[k] = vs
		}
	}
	setCommandHeaders(m.Header, e.msgID, e.origin, e.attempt, e.redelivered || e.attempt > 1 || seen)
	if e.resultTopic != "" {
		m.Header[HeaderResultTopic] = []string{e.resultTopic}
	}
	if r := cmp.Or(e.retry.replayedText, e.retry.replayed); r != "" {
		m.Header[HeaderReplayed] = []string{r}
	}
	if e.retry.firstOrigin != "" {
		m.Header[HeaderFirstOrigin] = []string{e.retry.firstOrigin}
	}
	return m
}

// commandRetry is the pause before a failed command is requeued: from 250ms
// doubling up to 5s, jittered so that the commands of one failure do not
// come back together.
var commandRetry = backoff.Policy{Min: 250 * time.Millisecond, Max: 5 * time.Second}

// retryDelay is the pause before a failed command is requeued.
func retryDelay(attempt int) time.Duration { return commandRetry.Delay(attempt) }

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
		msg := &nats.Msg{Subject: subjWorkPrefix + r.Name, Data: r.Body, Header: make(nats.Header, len(r.Header)+4)}
		for k, vs := range r.Header {
			msg.Header[k] = vs
		}
		setCommandHeaders(msg.Header, r.MsgID, b.cfg.Node, attempt, attempt > 1 || r.Republished)
		b.noteDeliveryAge(r.Name, r.Created)
		if b.completedBefore(r.Name, r.MsgID) {
			b.files.ob.Wait(ctx, func(done func(error)) { b.files.ob.Delete(r.Seq, r.Size, done) })
			return true
		}
		resp, failure := b.runHandler(ctx, r.Name, msg, func() bool {
			st, _ := b.linkState()
			return st != StateConnected || b.hostsStage(r.Name)
		})
		if ctx.Err() != nil {
			return false
		}
		switch {
		case failure == nil:
			b.m.msg(typeCommand, "local")
			if topic := r.Header.Get(HeaderResultTopic); topic != "" && len(resp.Data) > 0 {
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
			reason := reasonf(fmt.Sprintf("attempt %d of %d failed: ", attempt, budget), failure)
			if isPermanent(failure) {
				reason = reasonf(fmt.Sprintf("permanent failure at attempt %d: ", attempt), failure)
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
