package bridge

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"
	"github.com/meshbox/meshbox/internal/backoff"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Settling a command. Every way a command delivered to this node ends is
// decided here: its handler's reply (a result acks it, after the result is
// published and a deduping stage recorded its id; progress extends its
// lease), a failure or a timeout (retried: requeued after a pause, or
// published to the stage's retry queue under a retry policy; or
// dead-lettered with the reason once its attempts are spent or the
// failure is permanent), and the ack or requeue itself, which batches
// settle once all their commands are settled. The acker (consume.go) only
// carries the decisions to the broker.

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
			c.flow.Gone()
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
		if c.env.ResultTopic != "" && len(m.Data) > 0 {
			b.publishResult(c.stage, c.env.ResultTopic, c.env.MsgID, c.env.Origin, m)
		}
		if b.dedupes(c.stage) {
			// Recorded before the ack: a crash between the two brings a
			// redelivery this node recognises. Marked at once: a delivery
			// right behind is recognised while the write runs.
			b.files.done.Begin(c.stage, c.env.MsgID)
			release := s.con.acker.Hold() // until the ack is queued
			if !s.work(func() {
				defer release()
				b.completedNow(c.stage, c.env.MsgID)
				s.ackCmd(c.ack, opAck)
			}) {
				release()
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
	if codec.AsUnseal(failure) != nil {
		delayed = false // not opened: nothing to seal again; the broker keeps it
	}
	budget := b.cfg.RetryBudget
	if delayed {
		budget = p.Attempts
	}
	var reason *codec.DeadReason
	switch {
	case isPermanent(failure):
		reason = codec.Reasonf(fmt.Sprintf("permanent failure at attempt %d: ", c.env.Attempt), failure)
	case c.env.Attempt >= budget:
		reason = codec.Reasonf(fmt.Sprintf("attempt %d of %d failed: ", c.env.Attempt, budget), failure)
	case delayed:
		s.work(func() { s.retryLater(c, p, failure) })
		return
	default:
		s.requeueLater(c)
		return
	}
	extra := map[string]string{codec.HeaderAttempts: strconv.Itoa(c.env.Attempt)}
	if c.env.Retry.FirstFail != "" {
		extra[codec.HeaderFirstFail] = c.env.Retry.FirstFail
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
		c.timer = s.after(retryDelay(c.env.Attempt), func() {
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

// commandRetry is the pause before a failed command is requeued: from 250ms
// doubling up to 5s, jittered so that the commands of one failure do not
// come back together.
var commandRetry = backoff.Policy{Min: 250 * time.Millisecond, Max: 5 * time.Second}

// retryDelay is the pause before a failed command is requeued.
func retryDelay(attempt int) time.Duration { return commandRetry.Delay(attempt) }

// ackCmd settles one command of a delivery: a command alone is acked or
// requeued at once; a batch is acked (or, when one of its commands could
// not be opened, requeued) once its last command is settled.
func (s *session) ackCmd(a codec.CmdAck, op ackOp) {
	if a.Batch == nil {
		s.ack(a.Tag, op)
		return
	}
	if op == opRequeue {
		a.Batch.Requeue.Store(true)
	}
	if a.Batch.N.Add(-1) != 0 {
		return
	}
	if a.Batch.Requeue.Load() {
		s.ack(a.Tag, opRequeue)
		return
	}
	s.ack(a.Tag, opAck)
}

// giveBack returns a command to its stage queue for another attempt: a
// command alone is requeued; one of a batch that was opened is published
// again alone (requeueAlone), so that the rest of its batch is not tried
// again with it.
func (s *session) giveBack(c *cmdCall) {
	if c.ack.Batch == nil || c.unopened {
		s.ackCmd(c.ack, opRequeue)
		return
	}
	// When the session is ending, work refuses: the broker requeues the
	// batch.
	s.work(func() { s.requeueAlone(c) })
}

// requeueAlone publishes a copy of c, a command of a batch, to its stage
// queue, with the attempts it used so far, and settles c once the broker
// confirmed the copy. When the copy cannot go out, the whole batch goes
// back (a duplicate of its settled commands rather than a lost one). Runs
// on a worker.
func (s *session) requeueAlone(c *cmdCall) {
	b := s.b
	meta := commandMeta(c.env)
	meta[codec.HeaderAttempts] = strconv.Itoa(c.env.Attempt)
	if c.env.Retry.FirstOrigin == "" {
		meta[codec.HeaderFirstOrigin] = c.env.Origin
	}
	out := &codec.Outgoing{Exchange: codec.ExchangeMesh, Key: codec.CommandKey(c.stage), Mandatory: true, Kind: codec.TypeCommand,
		MsgID: c.env.MsgID, Persist: true, Header: c.env.Header, Meta: meta, Body: c.env.Body, At: time.Now()}
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	err := s.publishWait(ctx, out)
	switch {
	case err == nil:
		b.m.batchSplits.Inc()
		s.ackCmd(c.ack, opAck)
	case s.ctx.Err() != nil:
		// The session ended: the broker requeues the batch.
	default:
		b.log.Warn("cannot publish a command of a batch again alone; its whole batch goes back", "stage", c.stage, "msg_id", c.env.MsgID, "err", err)
		s.ackCmd(c.ack, opRequeue)
	}
}

// isPermanent reports whether failure is a permanent one.
func isPermanent(failure error) bool {
	var p *permanent
	return errors.As(failure, &p)
}

// handlerFailure is the failure a handler's error reply stands for, or nil
// when the reply is a result.
func handlerFailure(h nats.Header, stage, node string) error {
	code, e, failed := wire.ReadError(h)
	if !failed {
		return nil
	}
	err := &codec.HandlerError{Stage: stage, Node: node, Code: code, Text: e}
	if code == strconv.Itoa(codec.CodePermanent) {
		return &permanent{err: err}
	}
	return err
}

// retryLater publishes the copy of c's failed attempt to the retry queue
// of its stage with the policy's backoff, and acks c once the broker
// confirmed it. When the copy cannot go out (no retry queue on the broker
// any more), c is requeued after the usual pause instead; when the session
// ends first, the broker requeues c. Runs on a worker.
func (s *session) retryLater(c *cmdCall, p RetryPolicy, failure error) {
	b := s.b
	now := codec.StampTime(time.Now())
	meta := commandMeta(c.env)
	meta[codec.HeaderAttempts] = strconv.Itoa(c.env.Attempt)
	meta[codec.HeaderLastFail] = now
	meta[codec.HeaderLastReason], meta[codec.HeaderLastReasonSealed] = b.reasonHeaders(codec.HeaderLastReason, codec.TypeCommand, codec.CommandKey(c.stage),
		c.env.MsgID, failure.Error(), codec.FailureClass(failure))
	if meta[codec.HeaderLastReasonSealed] == "" {
		delete(meta, codec.HeaderLastReasonSealed)
	}
	if c.env.Retry.FirstFail == "" {
		meta[codec.HeaderFirstFail] = now
	}
	if c.env.Retry.FirstOrigin == "" {
		meta[codec.HeaderFirstOrigin] = c.env.Origin
	}
	out := &codec.Outgoing{Exchange: codec.ExchangeMesh, Key: codec.CommandKey(c.stage), Route: codec.RetryKey(c.stage), Mandatory: true,
		Kind: codec.TypeCommand, MsgID: c.env.MsgID, Persist: true, Header: c.env.Header, Meta: meta,
		Body: c.env.Body, At: time.Now(), TTL: p.delay(c.env.Attempt)}
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	err := s.publishWait(ctx, out)
	switch {
	case err == nil:
		b.m.retries.WithLabelValues(c.stage).Inc()
		s.ackCmd(c.ack, opAck)
	case s.ctx.Err() != nil:
		// The session ended: the broker requeues c.
	default:
		b.log.Warn("cannot publish a command to its retry queue; requeued instead", "stage", c.stage, "msg_id", c.env.MsgID, "err", err)
		s.requeueLater(c)
	}
}

// deadLetter publishes a copy of delivery d to the dead-letter exchange
// with the reason, waits for the broker's confirm, then acks d. If the
// session ends first, d is left to the broker to requeue.
func (s *session) deadLetter(d *amqp.Delivery, queue string, reason error) {
	if s.publishDead(d, queue, reason, "", nil) {
		s.ack(d.DeliveryTag, opAck)
	}
}

// deadCommand dead-letters a command of stage like deadLetter, into the
// stage's dead-letter queue when this session declared it (mesh.dead
// otherwise), with extra node headers (attempts, failures).
func (s *session) deadCommand(d *amqp.Delivery, a codec.CmdAck, stage string, reason error, extra map[string]string) {
	if s.publishDead(d, codec.StageQueue(stage), reason, stage, extra) {
		s.ackCmd(a, opAck)
	}
}

// reject dead-letters an auto-acked delivery (nothing to ack).
func (s *session) reject(d *amqp.Delivery, queue string, reason error) {
	s.publishDead(d, queue, reason, "", nil)
}
