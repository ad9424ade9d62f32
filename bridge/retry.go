package bridge

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/internal/names"
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
	err := &handlerError{stage: stage, node: node, code: code, text: e}
	if code == strconv.Itoa(CodePermanent) {
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

// stampTime formats a failure's time in the node headers.
func stampTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z07:00") }

// retryLater publishes the copy of c's failed attempt to the retry queue
// of its stage with the policy's backoff, and acks c once the broker
// confirmed it. When the copy cannot go out (no retry queue on the broker
// any more), c is requeued after the usual pause instead; when the session
// ends first, the broker requeues c. Runs on a worker.
func (s *session) retryLater(c *cmdCall, p RetryPolicy, failure error) {
	b := s.b
	now := stampTime(time.Now())
	meta := commandMeta(c.env)
	meta[HeaderAttempts] = strconv.Itoa(c.env.attempt)
	meta[HeaderLastFail] = now
	meta[HeaderLastReason], meta[HeaderLastReasonSealed] = b.reasonHeaders(HeaderLastReason, typeCommand, commandKey(c.stage),
		c.env.msgID, failure.Error(), failureClass(failure))
	if meta[HeaderLastReasonSealed] == "" {
		delete(meta, HeaderLastReasonSealed)
	}
	if c.env.retry.firstFail == "" {
		meta[HeaderFirstFail] = now
	}
	if c.env.retry.firstOrigin == "" {
		meta[HeaderFirstOrigin] = c.env.origin
	}
	out := &outgoing{exchange: exchangeMesh, key: commandKey(c.stage), route: retryKey(c.stage), mandatory: true,
		kind: typeCommand, msgID: c.env.msgID, persist: true, header: c.env.header, meta: meta,
		body: c.env.body, at: time.Now(), ttl: p.delay(c.env.attempt)}
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
		b.log.Warn("cannot publish a command to its retry queue; requeued instead", "stage", c.stage, "msg_id", c.env.msgID, "err", err)
		s.requeueLater(c)
	}
}

// commandMeta returns the node headers that travel with a command from
// one message of it to the next (a retry copy, a dead letter, a replay).
func commandMeta(e *envelope) map[string]string {
	m := make(map[string]string, 8)
	for k, v := range map[string]string{HeaderFirstFail: e.retry.firstFail, HeaderLastFail: e.retry.lastFail, HeaderLastReason: e.retry.lastReason,
		HeaderLastReasonSealed: e.retry.lastReasonSealed, HeaderFirstOrigin: e.retry.firstOrigin, HeaderReplayed: e.retry.replayed,
		HeaderReplayedSealed: e.retry.replayedSealed, HeaderResultTopic: e.resultTopic} {
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

// commandHeader reads one of the node headers a command carries (see
// above); anything else in the Meshbox-* namespace is ignored.
func (e *envelope) commandHeader(k, v string) error {
	switch {
	case strings.EqualFold(k, HeaderAttempts):
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > maxRetryAttempts {
			return bad("header %s: %q is not a number of attempts", k, v)
		}
		e.retry.failed = n
	case strings.EqualFold(k, HeaderFirstFail):
		e.retry.firstFail = v
	case strings.EqualFold(k, HeaderLastFail):
		e.retry.lastFail = v
	case strings.EqualFold(k, HeaderLastReason):
		e.retry.lastReason = v
	case strings.EqualFold(k, HeaderLastReasonSealed):
		e.retry.lastReasonSealed = v
	case strings.EqualFold(k, HeaderReplayedSealed):
		e.retry.replayedSealed = v
	case strings.EqualFold(k, HeaderFirstOrigin):
		if !validNodeName(v) {
			return bad("header %s: %q is not a node name", k, v)
		}
		e.retry.firstOrigin = v
	case strings.EqualFold(k, HeaderReplayed):
		e.retry.replayed = v
	case strings.EqualFold(k, HeaderResultTopic):
		if err := names.Topic(v); err != nil {
			return bad("header %s: %v", k, err)
		}
		e.resultTopic = v
	}
	return nil
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
	list := []aux{{auxDead, deadQueue(stage), deadKey(stage), deadQueueArgs()}}
	if _, ok := s.b.cfg.Retry[stage]; ok {
		list = append(list, aux{auxRetry, retryQueue(stage), retryKey(stage), retryQueueArgs(stage)})
	}
	for _, a := range list {
		err := s.findOrDeclare(decl, a.queue, func() error {
			_, err := (*decl).QueueDeclare(a.queue, true, false, false, false, a.args)
			return err
		})
		if err == nil {
			err = (*decl).QueueBind(a.queue, a.key, exchangeMesh, false, nil)
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
