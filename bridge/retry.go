package bridge

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/internal/wire"
)

// This file is a stage's retry policy (Config.Retry) and the permanent
// failures of handlers.
//
// RabbitMQ has no delayed delivery. A failed attempt of a stage with a
// policy is therefore published again, by the node that saw it fail, to
// the stage's retry queue retry.<stage> with its backoff as the message's
// expiration; the retry queue has no consumer and dead-letters what
// expires to exchange mesh with key cmd.<stage>: back to the stage queue,
// for whichever node takes it next. The failed delivery is acked only once
// the broker confirmed the copy, so a crash in between brings the original
// back instead of losing it.
//
// The copy is a new message on the broker: its publisher is the node that
// retried it. So it is sealed again by that node (sealing.go), for
// cmd.<stage> and with the same message id, headers and body: the body
// stays sealed on its way through the retry queue, and its origin, as with
// every message, is the broker user that published it. The node headers
// Meshbox-Attempts (attempts failed so far), Meshbox-First-Failure,
// Meshbox-Last-Failure, Meshbox-Last-Reason (its class, and the handler's
// own words sealed beside it in a mesh that seals: reasons.go) and
// Meshbox-First-Origin (the origin of the first delivery, as the retrying
// node read it) travel with it, and the next delivery's attempt is
// Meshbox-Attempts + 1.

// RetryPolicy is how a stage's failed commands are tried again.
type RetryPolicy struct {
	// Attempts is how many attempts a command gets in all (1: none
	// again); the last failure dead-letters it.
	Attempts int
	// Backoff is the wait before the second attempt; each further one
	// waits twice the one before, up to MaxBackoff (0: Backoff, a fixed
	// wait).
	Backoff    time.Duration
	MaxBackoff time.Duration
}

// delay is the wait after failed attempt n (1 for the first): Backoff
// doubled n-1 times, at most MaxBackoff. No jitter: a retry waits at least
// its backoff, and a retry queue expires messages only at its head, so
// jitter would only reorder them.
func (p RetryPolicy) delay(n int) time.Duration {
	limit := max(p.MaxBackoff, p.Backoff)
	d := p.Backoff
	for i := 1; i < n && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}

// permanent is a handler's failure that must not be tried again: it replied
// with Nats-Service-Error-Code CodePermanent.
type permanent struct{ err error }

func (e *permanent) Error() string { return e.err.Error() }
func (e *permanent) Unwrap() error { return e.err }

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

// retryPolicy returns the policy of stage when its retry queue is
// declared in this session.
func (s *session) retryPolicy(stage string) (RetryPolicy, bool) {
	p, ok := s.b.cfg.Retry[stage]
	if !ok {
		return p, false
	}
	return p, s.hasAux(stage, auxRetry)
}

// hasAux reports whether this session declared the aux queue bit of
// stage.
func (s *session) hasAux(stage string, bit int) bool {
	s.flows.mu.Lock()
	defer s.flows.mu.Unlock()
	return s.flows.aux[stage]&bit != 0
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

// commandMeta returns the node headers that travel with a command from
// one message of it to the next (a retry copy, a dead letter, a replay).
func commandMeta(e *codec.Envelope) map[string]string {
	m := make(map[string]string, 8)
	for k, v := range map[string]string{codec.HeaderFirstFail: e.Retry.FirstFail, codec.HeaderLastFail: e.Retry.LastFail, codec.HeaderLastReason: e.Retry.LastReason,
		codec.HeaderLastReasonSealed: e.Retry.LastReasonSealed, codec.HeaderFirstOrigin: e.Retry.FirstOrigin, codec.HeaderReplayed: e.Retry.Replayed,
		codec.HeaderReplayedSealed: e.Retry.ReplayedSealed, codec.HeaderResultTopic: e.ResultTopic} {
		if v != "" {
			m[k] = v
		}
	}
	return m
}

// maxReason bounds a failure's reason in a node header.
const maxReason = 1024

// clip shortens s to at most n bytes.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// Aux queues of a stage declared in a session (stageFlows.aux).
const (
	auxRetry = 1 << iota // retry.<stage>
	auxDead              // dead.<stage>
)

// declareAux declares the retry queue (a stage with a policy) and the
// dead-letter queue of stage and returns which exist. A broker user
// without the rights to them (a node whose permissions predate them) gets
// none: its stage works as before, its dead letters go to mesh.dead.
func (s *session) declareAux(decl **amqp.Channel, stage string) int {
	var have int
	type aux struct {
		bit   int
		queue string
		key   string
		args  amqp.Table
	}
	list := []aux{{auxDead, codec.DeadQueue(stage), codec.DeadKey(stage), deadQueueArgs()}}
	if _, ok := s.b.cfg.Retry[stage]; ok {
		list = append(list, aux{auxRetry, codec.RetryQueue(stage), codec.RetryKey(stage), retryQueueArgs(stage)})
	}
	for _, a := range list {
		err := s.findOrDeclare(decl, a.queue, func() error {
			_, err := (*decl).QueueDeclare(a.queue, true, false, false, false, a.args)
			return err
		})
		if err == nil {
			err = (*decl).QueueBind(a.queue, a.key, codec.ExchangeMesh, false, nil)
		}
		if err != nil {
			s.b.log.Warn("cannot declare a stage's queue; the stage goes on without it (are the node's broker permissions current, is the queue's broker node up?)",
				"stage", stage, "queue", a.queue, "err", err)
			if (*decl).IsClosed() {
				nc, cerr := s.con.conn.Channel()
				if cerr != nil {
					return have
				}
				*decl = nc
			}
			continue
		}
		have |= a.bit
	}
	return have
}
