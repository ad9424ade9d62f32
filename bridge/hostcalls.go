package bridge

import (
	"context"
	"fmt"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"
	"github.com/meshbox/meshbox/bridge/hoptrace"

	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
)

// This file is the host side of requests: requests from other nodes,
// handed to the local program that hosts the capability, and its reply
// sent back. The caller side (a local program calling another node) is
// requests.go.

// hostCall is a request from another node waiting for the local host's
// reply. Exactly one of the reply, the timer or the session's end takes it
// out of session.local.host.
type hostCall struct {
	env     *codec.Envelope
	timeout time.Duration
	at      time.Time // taken from the request queue
	timer   *time.Timer
}

// readRequests passes requests from other nodes to the local hosts without
// waiting: the host's reply arrives on the session's inbox subscription
// (onHostReply), a timer answers a host that is too slow. Requests beyond
// openCalls are refused at once. Exits when the delivery channel closes.
func (s *session) readRequests(ds <-chan amqp.Delivery) {
	for d := range ds {
		hoptrace.Mark(hoptrace.HopRequestTaken)
		s.takeRequest(&d, false)
	}
}

// takeRequest passes one request to the local hosts; held: it waited for
// the bindings once already (holdForRotation).
func (s *session) takeRequest(d *amqp.Delivery, held bool) {
	b := s.b
	env, err := s.decode(codec.TypeRequest, d)
	if ue := codec.AsUnseal(err); ue != nil {
		b.unsealFailed(codec.TypeRequest, ue)
		code := CodeBadInput
		if ue.Reason == codec.UnsealExpired {
			code = CodeTimeout
		}
		s.replyHost(ue.Env, nil, &ServiceError{Code: code, Text: codec.UnsealText(b.cfg.Node, ue)})
		return
	}
	if !held && s.holdForRotation(err, d, func(d *amqp.Delivery) { s.takeRequest(d, true) }) {
		return
	}
	if err != nil {
		bad := *d                                                              // a copy: the reader's delivery is reused
		s.work(func() { s.reject(&bad, codec.RequestQueue(b.cfg.Node), err) }) // auto-acked: nothing to ack
		return
	}
	b.m.msg(codec.TypeRequest, "in")
	// The caller's deadline travels with its request: a long one (a
	// large reply over a slow link) holds here as long.
	c := &hostCall{env: env, timeout: b.cfg.RequestTimeout, at: time.Now()}
	if env.Timeout > 0 {
		c.timeout = min(env.Timeout, b.maxTimeout())
	}
	token := newID()
	s.local.mu.Lock()
	if len(s.local.host) >= b.openCalls() {
		s.local.mu.Unlock()
		b.m.err(errKindUnreachable)
		s.replyHost(env, nil, &ServiceError{Code: CodeUnavailable,
			Text: fmt.Sprintf("node %s has %d requests open at its local hosts; refused %s", b.cfg.Node, b.openCalls(), env.Name)})
		return
	}
	s.local.host[token] = c
	c.timer = s.after(c.timeout, func() {
		if c := s.takeCall(token); c != nil {
			s.replyHost(c.env, nil, localCallFailure(context.DeadlineExceeded, c.env.Name, b.cfg.Node, c.timeout))
			s.replyHanded()
		}
	})
	s.local.mu.Unlock()
	msg := env.NatsMsg(codec.SubjCapPrefix+env.Name, map[string]string{codec.HeaderOrigin: env.Origin, codec.HeaderTimeout: c.timeout.String()})
	msg.Reply = s.local.inbox + token
	hoptrace.Mark(hoptrace.HopHostAsked)
	if err := b.bc.PublishMsg(msg); err != nil {
		if c := s.takeCall(token); c != nil {
			s.replyHost(c.env, nil, localCallFailure(err, c.env.Name, b.cfg.Node, c.timeout))
			s.replyHanded()
		}
	}
}

// takeCall removes and returns the open call token (nil: already
// answered). The caller replies and then calls replyHanded.
func (s *session) takeCall(token string) *hostCall {
	s.local.mu.Lock()
	defer s.local.mu.Unlock()
	c := s.local.host[token]
	if c != nil {
		delete(s.local.host, token)
		s.cancelTimer(c.timer)
		s.local.answering++
	}
	return c
}

// replyHanded says that the reply of a call taken with takeCall is handed to
// the publisher.
func (s *session) replyHanded() {
	s.local.mu.Lock()
	s.local.answering--
	s.local.mu.Unlock()
}

// onHostReply receives a local host's reply (or the NATS server's "no
// responders") on the session's inbox and sends it back to the caller.
func (s *session) onHostReply(m *nats.Msg) {
	hoptrace.Mark(hoptrace.HopHostAnswered)
	c := s.takeCall(m.Subject[len(s.local.inbox):])
	if c == nil {
		s.b.m.err(errKindLateReply)
		return
	}
	defer s.replyHanded()
	if wire.NoResponders(m.Header, m.Data) {
		s.replyHost(c.env, nil, localCallFailure(nats.ErrNoResponders, c.env.Name, s.b.cfg.Node, c.timeout))
		return
	}
	s.replyHost(c.env, m, nil)
}

// replyHost sends the reply to a request from another node: the host's
// reply, or failure. Replies are fire and forget: the caller's node times
// out if one is lost.
func (s *session) replyHost(env *codec.Envelope, resp *nats.Msg, failure error) {
	b := s.b
	// To the node the request came from (its validated origin), never to a
	// reply-to of the publisher's choosing.
	// Mandatory: a reply that comes back (its node is between two
	// sessions) is sent again (noroute.go).
	out := &codec.Outgoing{Exchange: codec.ExchangeMesh, Key: codec.ReplyKey(env.Origin), Mandatory: true, Kind: codec.TypeReply, CorrID: env.CorrID, At: time.Now()}
	if failure == nil {
		out.Scope = env.Scope // sealed as the request was; a refusal says nothing of the scope's
		var err error
		out.Header, err = codec.CallerHeaders(resp.Header)
		if err != nil {
			failure = &ServiceError{Code: CodeInternal, Text: fmt.Sprintf("the reply of %s on node %s has invalid headers: %v", env.Name, b.cfg.Node, err)}
		}
		out.Body = resp.Data
	}
	if failure != nil {
		out.Header = nats.Header{}
		wire.SetError(out.Header, codeFor(failure), errorText(failure))
		out.Body = nil
	}
	_ = s.enqueueFast(&pubItem{Out: out, Done: func(error) {}})
}

// openCalls bounds the requests from other nodes open at local hosts:
// openCallsPerPrefetch x Prefetch, at least openCallsMin.
func (b *Bridge) openCalls() int { return max(openCallsMin, openCallsPerPrefetch*b.cfg.Prefetch) }

// Bounds of the requests from other nodes open at local hosts.
const (
	openCallsMin         = 256
	openCallsPerPrefetch = 8
)

// endCalls ends the open calls of an ended session: their local hosts'
// replies can no longer be taken. The callers are told by the next
// session (answerOrphans), so that they do not wait for their deadlines.
func (s *session) endCalls() {
	s.local.mu.Lock()
	defer s.local.mu.Unlock()
	var orphans []*hostCall
	for token, c := range s.local.host {
		s.cancelTimer(c.timer)
		delete(s.local.host, token)
		orphans = append(orphans, c)
	}
	if len(orphans) > 0 {
		s.b.reqs.orphanMu.Lock()
		s.b.reqs.orphans = append(s.b.reqs.orphans, orphans...)
		s.b.reqs.orphanMu.Unlock()
	}
}

// answerOrphans answers, on the new session s, the calls from other nodes
// that an ended session had open at local hosts, whose deadlines have not
// passed: 503, the outcome unknown (the host may have done the work).
// Their callers would otherwise wait for their deadlines.
func (b *Bridge) answerOrphans(s *session) {
	b.reqs.orphanMu.Lock()
	orphans := b.reqs.orphans
	b.reqs.orphans = nil
	b.reqs.orphanMu.Unlock()
	for _, c := range orphans {
		if time.Since(c.at) >= c.timeout {
			continue
		}
		s.replyHost(c.env, nil, &ServiceError{Code: CodeUnavailable,
			Text: fmt.Sprintf("node %s lost its broker connection while its host handled %s; the outcome is unknown", b.cfg.Node, c.env.Name)})
	}
}
