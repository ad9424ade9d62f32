package bridge

import (
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	amqp "github.com/rabbitmq/amqp091-go"
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
