package bridge

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"
	"github.com/meshbox/meshbox/bridge/hoptrace"

	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
)

// pendingRequest is a request forwarded to another node, waiting for its
// reply. Exactly one of the reply, the timer or a failure takes it out of
// b.pending and answers the caller.
type pendingRequest struct {
	reply string // the caller's inbox
	name  string // capability
	node  string // target node
	start time.Time
	timer *time.Timer
	// Set once it is added: the message, sent again when it comes back
	// unroutable (noroute.go), and the caller's timeout.
	out     *codec.Outgoing
	timeout time.Duration
	// Under pendingRequests.mu: the session the reply is expected on, and
	// how often it was sent again.
	sess    *session
	retries int
}

// onCapRequest serves cap.<name> for a capability hosted elsewhere: the
// stand-in. It exists only while no local program hosts the capability.
func (b *Bridge) onCapRequest(msg *nats.Msg) {
	hoptrace.Mark(hoptrace.HopStandIn)
	if msg.Reply == "" {
		b.m.err(errKindBadInput)
		return
	}
	if !b.localOK(msg) {
		return
	}
	name := msg.Subject[len(codec.SubjCapPrefix):]
	timeout, err := b.requestTimeout(msg)
	if err != nil {
		b.m.err(errKindBadInput)
		b.replyError(msg.Reply, err)
		return
	}
	node, err := b.pickHost(name)
	if err != nil {
		b.m.err(errKindUnreachable)
		b.replyError(msg.Reply, err)
		return
	}
	b.forward(msg, node, name, timeout)
}

// onNodeCapRequest serves node.<node>.cap.<name>: on this node it calls the
// local host, otherwise it forwards to the named node.
func (b *Bridge) onNodeCapRequest(msg *nats.Msg) {
	if msg.Reply == "" {
		b.m.err(errKindBadInput)
		return
	}
	if !b.localOK(msg) {
		return
	}
	node, name, ok := codec.ParseNodeCapSubject(msg.Subject)
	if !ok {
		b.m.err(errKindBadInput)
		b.replyError(msg.Reply, fmt.Errorf("%w: %q is not node.<node>.cap.<capability>", codec.ErrBadInput, msg.Subject))
		return
	}
	if !b.nodeCallOK(msg, name) {
		return
	}
	timeout, err := b.requestTimeout(msg)
	if err != nil {
		b.m.err(errKindBadInput)
		b.replyError(msg.Reply, err)
		return
	}
	if node == b.cfg.Node {
		b.callLocal(msg, name, timeout)
		return
	}
	b.route.mu.RLock()
	since, gone := b.route.gone[node]
	b.route.mu.RUnlock()
	if gone {
		b.m.err(errKindUnreachable)
		b.replyError(msg.Reply, goneError(node, since))
		return
	}
	b.forward(msg, node, name, timeout)
}

// requestTimeout is the request's deadline: the default, or the caller's
// Meshbox-Timeout, shorter or longer (up to maxTimeout).
func (b *Bridge) requestTimeout(msg *nats.Msg) (time.Duration, error) {
	t := b.cfg.RequestTimeout
	if v := msg.Header.Get(codec.HeaderTimeout); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return 0, fmt.Errorf("%w: header %s: %q is not a positive duration", codec.ErrBadInput, codec.HeaderTimeout, v)
		}
		t = min(d, b.maxTimeout())
	}
	if limit := b.maxPayload(); len(msg.Data) > limit {
		return 0, fmt.Errorf("%w: payload of %d bytes exceeds the limit of %d", codec.ErrBadInput, len(msg.Data), limit)
	}
	return t, nil
}

// maxTimeout is the longest deadline a caller may ask for
// (Meshbox-Timeout): wire.MaxTimeout, or the default if that is longer.
func (b *Bridge) maxTimeout() time.Duration { return max(b.cfg.RequestTimeout, wire.MaxTimeout) }

// maxPayload is the largest body the bridge carries.
func (b *Bridge) maxPayload() int {
	limit := b.cfg.MaxPayload
	if b.bc != nil {
		if mp := int(b.bc.MaxPayload()); mp > 0 && mp < limit {
			limit = mp
		}
	}
	return limit
}

// pickHost chooses a live node hosting capability name (round robin).
func (b *Bridge) pickHost(name string) (string, error) {
	b.route.mu.RLock()
	defer b.route.mu.RUnlock()
	var live []string
	var goneNode string
	var goneSince time.Time
	for _, n := range b.route.routes[name] {
		if n == b.cfg.Node || !b.inScopeOf(seal.BindCap, name, n) {
			continue
		}
		if since, ok := b.route.gone[n]; ok {
			goneNode, goneSince = n, since
			continue
		}
		live = append(live, n)
	}
	switch {
	case len(live) > 0:
		return live[int(b.route.rr.Add(1)%uint64(len(live)))], nil
	case goneNode != "":
		return "", goneError(goneNode, goneSince)
	default:
		return "", &ServiceError{Code: CodeUnavailable, Text: "no node hosts capability " + name}
	}
}

// forward sends a local program's request to node and arranges for the
// reply, a timeout or a failure to answer it.
func (b *Bridge) forward(msg *nats.Msg, node, name string, timeout time.Duration) {
	hdr, err := codec.CallerHeaders(msg.Header)
	if err != nil {
		b.m.err(errKindBadInput)
		b.replyError(msg.Reply, err)
		return
	}
	if err := b.notInScope(seal.BindCap, name, "call"); err != nil {
		b.replyError(msg.Reply, err)
		return
	}
	if b.peers.senders.unknown(node) {
		b.m.err(errKindBadInput)
		b.replyError(msg.Reply, unknownNode(node, name))
		return
	}
	if b.cfg.Keys != nil {
		if _, err := b.cfg.Keys.SealerFor(b.cfg.Keys.ScopeOf(seal.BindCap, name)); err != nil {
			b.m.err(errKindUnreachable)
			b.replyError(msg.Reply, b.lacksKey("request"))
			return
		}
	}
	sess := b.liveSession(timeout)
	if st, since := b.link.Current(); st != StateConnected || sess == nil {
		b.m.err(errKindUnreachable)
		b.replyError(msg.Reply, &ServiceError{Code: CodeUnavailable,
			Text: fmt.Sprintf("mesh unreachable: broker link is %s since %s; cannot call %s on node %s", st, since.UTC().Format(time.RFC3339), name, node)})
		return
	}
	id := newID()
	now := time.Now()
	out := &codec.Outgoing{
		Exchange: codec.ExchangeMesh, Key: codec.RequestKey(node, name), Mandatory: true,
		Kind: codec.TypeRequest, MsgID: id, CorrID: id, ReplyTo: codec.ReplyQueue(b.cfg.Node),
		// The capability travels in the routing key alone: a header more
		// costs the broker work on every request (5 to 8 µs a round trip,
		// measured with raw clients on 2 cores).
		Expire: timeout, Header: hdr, Meta: map[string]string{codec.HeaderTimeout: timeout.String()},
		Body: msg.Data, At: now,
	}
	p := &pendingRequest{reply: msg.Reply, name: name, node: node, start: now, sess: sess, out: out, timeout: timeout}
	b.reqs.pending.add(id, p, func() *time.Timer {
		return time.AfterFunc(timeout, func() {
			if b.takePending(id) == nil {
				return
			}
			b.m.err(errKindTimeout)
			b.m.observe("timeout", now)
			b.replyError(p.reply, &ServiceError{Code: CodeTimeout,
				Text: fmt.Sprintf("deadline of %s passed waiting for %s on node %s", timeout, name, node)})
		})
	})
	it := &pubItem{Out: out, Done: b.requestSent(id, p)}
	if err := sess.enqueueFast(it); err != nil {
		it.Finish(err)
	}
}

// requestSent is the publish outcome of request id: a failure to publish
// answers it at once; once written, its reply, its timer or its return
// (fastReturned) answers it.
func (b *Bridge) requestSent(id string, p *pendingRequest) func(error) {
	return func(err error) {
		if err == nil {
			return
		}
		if b.takePending(id) == nil {
			return
		}
		b.m.err(errKindUnreachable)
		b.m.observe("unreachable", p.start)
		b.replyError(p.reply, requestFailure(err, p.name, p.node))
	}
}

// unknownNode is the answer to a call addressed to a node the mesh does
// not have.
func unknownNode(node, name string) error {
	return &ServiceError{Code: CodeNotFound, Text: fmt.Sprintf(
		"no node %s in this mesh (this node's bindings do not list it; meshbox nodes lists the nodes it sees): cannot call %s", node, name)}
}

// requestFailure explains a failed publish of a request.
func requestFailure(err error, name, node string) error {
	switch {
	case errors.Is(err, ErrNoRoute):
		return &ServiceError{Code: CodeUnavailable, Text: fmt.Sprintf("node %s is not connected to the mesh; cannot call %s", node, name)}
	case errors.Is(err, ErrNacked):
		return &ServiceError{Code: CodeUnavailable, Text: fmt.Sprintf("the broker refused the request for %s on node %s", name, node)}
	default:
		return &ServiceError{Code: CodeUnavailable, Text: fmt.Sprintf("mesh unreachable: broker link lost calling %s on node %s", name, node)}
	}
}

// takePending removes and returns the pending request id (nil: already
// answered).
func (b *Bridge) takePending(id string) *pendingRequest { return b.reqs.pending.take(id) }

// pendingRequests are the requests of local programs waiting for a reply
// from another node, by correlation id. mu guards m; only these methods
// touch them.
type pendingRequests struct {
	mu sync.Mutex
	m  map[string]*pendingRequest
}

// add registers p under id, with the deadline timer made by timer (made
// under the lock, so the timer never finds p missing before it is added).
func (r *pendingRequests) add(id string, p *pendingRequest, timer func() *time.Timer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[id] = p
	p.timer = timer()
}

// take removes and returns the request id, its timer stopped (nil: already
// answered).
func (r *pendingRequests) take(id string) *pendingRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.m[id]
	if p != nil {
		delete(r.m, id)
		if p.timer != nil {
			p.timer.Stop()
		}
	}
	return p
}

// takeFrom removes and returns the request id if it was sent to node
// origin. A request sent to another node stays; its node is returned as
// to (p nil). Both empty: no such request (already answered).
func (r *pendingRequests) takeFrom(id, origin string) (p *pendingRequest, to string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p = r.m[id]
	if p == nil {
		return nil, ""
	}
	if p.node != origin {
		return nil, p.node
	}
	delete(r.m, id)
	if p.timer != nil {
		p.timer.Stop()
	}
	return p, ""
}

// takeWhere removes and returns every request for which match holds, their
// timers stopped.
func (r *pendingRequests) takeWhere(match func(*pendingRequest) bool) []*pendingRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*pendingRequest
	for id, p := range r.m {
		if match(p) {
			delete(r.m, id)
			p.timer.Stop()
			out = append(out, p)
		}
	}
	return out
}

// failPendingOf answers the requests sent on session s: their replies
// cannot come any more.
func (b *Bridge) failPendingOf(s *session) {
	for _, p := range b.reqs.pending.takeWhere(func(p *pendingRequest) bool { return p.sess == s }) {
		b.m.err(errKindUnreachable)
		b.m.observe("unreachable", p.start)
		b.replyError(p.reply, &ServiceError{Code: CodeUnavailable,
			Text: fmt.Sprintf("mesh unreachable: broker link lost waiting for %s on node %s", p.name, p.node)})
	}
}

// failPending answers every pending request with err.
func (b *Bridge) failPending(err error) {
	for _, p := range b.reqs.pending.takeWhere(func(*pendingRequest) bool { return true }) {
		b.replyError(p.reply, err)
	}
}

// callLocal serves node.<self>.cap.<name>: the local host answers, or the
// caller learns that none exists here. The call runs on a goroutine of its
// own that ends at the deadline at the latest.
func (b *Bridge) callLocal(msg *nats.Msg, name string, timeout time.Duration) {
	hdr, err := codec.CallerHeaders(msg.Header)
	if err != nil {
		b.m.err(errKindBadInput)
		b.replyError(msg.Reply, err)
		return
	}
	req := &nats.Msg{Subject: codec.SubjCapPrefix + name, Header: hdr, Data: msg.Data}
	if req.Header == nil {
		req.Header = nats.Header{}
	}
	req.Header.Set(codec.HeaderOrigin, b.cfg.Node)
	req.Header.Set(codec.HeaderTimeout, timeout.String())
	b.reqs.local.Add(1)
	go func() { // ends when the call returns: reply, deadline, or Close
		defer b.reqs.local.Done()
		ctx, cancel := b.withQuit(context.Background())
		defer cancel()
		ctx, cancelT := context.WithTimeout(ctx, timeout)
		defer cancelT()
		resp, err := b.bc.RequestMsgWithContext(ctx, req)
		if err != nil {
			b.replyError(msg.Reply, localCallFailure(err, name, b.cfg.Node, timeout))
			return
		}
		b.reply(&nats.Msg{Subject: msg.Reply, Header: resp.Header, Data: resp.Data})
	}()
}

// localCallFailure explains a failed call to a local host.
func localCallFailure(err error, name, node string, timeout time.Duration) error {
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return &ServiceError{Code: CodeUnavailable, Text: fmt.Sprintf("capability %s is not hosted on node %s", name, node)}
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return &ServiceError{Code: CodeTimeout, Text: fmt.Sprintf("capability %s on node %s did not answer within %s", name, node, timeout)}
	default:
		return &ServiceError{Code: CodeUnavailable, Text: fmt.Sprintf("calling %s on node %s: %v", name, node, err)}
	}
}

// readReplies handles replies to this node's requests (auto-acked). Exits
// when the consumer's delivery channel closes.
func (s *session) readReplies(ds <-chan amqp.Delivery) {
	b := s.b
	for d := range ds {
		hoptrace.Mark(hoptrace.HopReplyTaken)
		env, err := s.decode(codec.TypeReply, &d)
		if ue := codec.AsUnseal(err); ue != nil {
			b.unsealFailed(codec.TypeReply, ue)
			// The caller learns at once; a reply from another node than asked
			// leaves the request open.
			if p, _ := b.reqs.pending.takeFrom(ue.Env.CorrID, ue.Env.Origin); p != nil {
				b.m.observe("error", p.start)
				b.replyError(p.reply, &ServiceError{Code: CodeUnavailable,
					Text: fmt.Sprintf("the reply of %s from node %s was refused: %s", p.name, p.node, ue.Error())})
			}
			continue
		}
		if err != nil {
			s.reject(&d, "replies", err)
			continue
		}
		b.m.msg(codec.TypeReply, "in")
		p, from := b.reqs.pending.takeFrom(env.CorrID, env.Origin)
		if p == nil && from != "" {
			// Only the node the request was sent to may answer it; the
			// request stays open for its real reply.
			s.reject(&d, "replies", &codec.Forged{Reason: fmt.Sprintf("reply from node %q to a request sent to node %s", env.Origin, from)})
			continue
		}
		if p == nil {
			b.m.err(errKindLateReply)
			continue
		}
		b.answeredBy(env.Origin)
		outcome := "ok"
		if env.Header.Get(codec.HeaderServiceError) != "" {
			outcome = "error"
		}
		b.m.observe(outcome, p.start)
		b.reply(env.NatsMsg(p.reply, nil))
		hoptrace.Mark(hoptrace.HopCallerAnswered)
	}
}
