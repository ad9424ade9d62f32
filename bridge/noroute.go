package bridge

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A request or a reply the broker returns as unroutable was delivered to
// nobody: its node's queue is not bound at that moment. The node's request
// and reply queues are exclusive to its connection (topology.go), so they
// are briefly unbound whenever the node reconnects — to another broker
// node of a cluster, or to the same broker with a new credential (a
// handover unbinds the old ones first, credential.go). So the sender tries
// again for a short while before it gives up: a message that came back was
// never delivered, so sending it again keeps requests at most once.
//
// A request is sent again while discovery does not mark its node gone,
// within noRouteWindow and its deadline, and answered 503 after that: a
// caller never waits long on a node that is not there. (Whether discovery
// knows the node is no guide: a node that switches to a new credential is
// asked for its record again under its new broker user.) A node that
// answered a request of this node within noRouteRecent is between two
// connections rather than absent: its requests are sent again within
// noRouteKnownWindow (a node's switch to a new credential took 740 ms on
// a loaded 2-core machine, and two of its callers' requests failed at 600
// ms). A reply is sent again within noRouteReplyWindow: its request is
// waiting on the other side.
const (
	noRouteFirst       = 20 * time.Millisecond  // the first pause, doubled each time
	noRouteMaxPause    = 160 * time.Millisecond // the longest pause
	noRouteWindow      = 600 * time.Millisecond // requests: how long after the first send
	noRouteKnownWindow = 2 * time.Second        // the same for a node that answered within noRouteRecent
	noRouteRecent      = time.Minute
	noRouteReplyWindow = 3 * time.Second // replies: how long after the first return
)

// noRoutePause is the pause before the n+1st attempt.
func noRoutePause(n int) time.Duration {
	d := noRouteFirst << min(n, 8)
	return min(d, noRouteMaxPause)
}

// retryRequest sends the pending request id again after a pause, when it
// came back unroutable and may still reach its node (see above). It
// reports false when the request is to be answered 503 now.
func (b *Bridge) retryRequest(id string) bool {
	b.reqs.pending.mu.Lock()
	p := b.reqs.pending.m[id]
	if p == nil || p.out == nil {
		b.reqs.pending.mu.Unlock()
		return false
	}
	pause := noRoutePause(p.retries)
	node := p.node
	window := noRouteWindow
	if b.answeredWithin(node, noRouteRecent) {
		window = noRouteKnownWindow
	}
	inTime := time.Since(p.start)+pause < min(window, p.timeout)
	if inTime {
		p.retries++
	}
	b.reqs.pending.mu.Unlock()
	if !inTime || b.isGone(node) {
		return false
	}
	b.m.err(errKindNoRoute)
	time.AfterFunc(pause, func() { b.resendRequest(id) }) // settles by itself: the request is pending or answered
	return true
}

// answeredBy records that node answered a request of this node now.
func (b *Bridge) answeredBy(node string) {
	now := time.Now().UnixNano()
	if v, ok := b.reqs.answered.Load(node); ok {
		v.(*atomic.Int64).Store(now)
		return
	}
	v := &atomic.Int64{}
	v.Store(now)
	b.reqs.answered.Store(node, v)
}

// answeredWithin reports whether node answered a request of this node
// within d.
func (b *Bridge) answeredWithin(node string, d time.Duration) bool {
	v, ok := b.reqs.answered.Load(node)
	return ok && time.Since(time.Unix(0, v.(*atomic.Int64).Load())) < d
}

// isGone reports whether discovery marks node gone.
func (b *Bridge) isGone(node string) bool {
	b.route.mu.RLock()
	defer b.route.mu.RUnlock()
	_, gone := b.route.gone[node]
	return gone
}

// resendRequest publishes the pending request id again on the session in
// use (during a handover, the next one), whose reply queue its reply then
// reaches. A session that ends under it counts as another return.
func (b *Bridge) resendRequest(id string) {
	sess := b.liveSession(noRouteWindow)
	b.reqs.pending.mu.Lock()
	p := b.reqs.pending.m[id]
	if p != nil && sess != nil {
		p.sess = sess
	}
	b.reqs.pending.mu.Unlock()
	if p == nil {
		return // answered meanwhile (its deadline)
	}
	sent := b.requestSent(id, p)
	it := &pubItem{Out: p.out, Done: func(err error) {
		if err != nil && b.retryRequest(id) {
			return
		}
		sent(err)
	}}
	if sess == nil {
		it.Finish(ErrLinkDown)
		return
	}
	if err := sess.enqueueFast(it); err != nil {
		it.Finish(err)
	}
}

// returnedReplies are the replies that came back unroutable, by
// correlation id: when each came back first and how often.
type returnedReplies struct {
	mu sync.Mutex
	m  map[string]*returnedReply
}

type returnedReply struct {
	first time.Time
	tries int
}

// retryReply sends a reply that came back unroutable again after a pause,
// within noRouteReplyWindow of its first return; after that it is dropped
// (its request has passed its deadline or its node is gone).
func (b *Bridge) retryReply(r amqp.Return) {
	now := time.Now()
	rr := &b.reqs.returns
	rr.mu.Lock()
	if rr.m == nil {
		rr.m = map[string]*returnedReply{}
	}
	e := rr.m[r.CorrelationId]
	if e == nil {
		for id, old := range rr.m { // forget those given up on
			if now.Sub(old.first) > noRouteReplyWindow {
				delete(rr.m, id)
			}
		}
		e = &returnedReply{first: now}
		rr.m[r.CorrelationId] = e
	}
	pause := noRoutePause(e.tries)
	e.tries++
	giveUp := now.Sub(e.first)+pause > noRouteReplyWindow
	if giveUp {
		delete(rr.m, r.CorrelationId)
	}
	rr.mu.Unlock()
	b.m.err(errKindNoRoute)
	if giveUp {
		b.replyDropped(r.RoutingKey, "its node did not come back")
		return
	}
	p := amqp.Publishing{
		Headers: r.Headers, ContentType: r.ContentType, ContentEncoding: r.ContentEncoding,
		DeliveryMode: r.DeliveryMode, CorrelationId: r.CorrelationId, ReplyTo: r.ReplyTo,
		Expiration: r.Expiration, MessageId: r.MessageId, Timestamp: r.Timestamp, Type: r.Type,
		AppId: r.AppId, Body: r.Body,
	}
	out := &codec.Outgoing{Exchange: r.Exchange, Key: r.RoutingKey, Mandatory: true, Kind: codec.TypeReply, CorrID: r.CorrelationId, Raw: &p}
	time.AfterFunc(pause, func() { // settles by itself: one publish
		sess := b.liveSession(noRouteReplyWindow)
		if sess == nil {
			b.replyDropped(r.RoutingKey, "this node's broker link is down")
			return
		}
		if err := sess.enqueueFast(&pubItem{Out: out, Done: func(error) {}}); err != nil {
			b.replyDropped(r.RoutingKey, "this node's broker link went down")
		}
	})
}

// replyDropped counts a reply given up on (its caller answers its request
// at the deadline); the log line is at debug level: a node that left with
// calls open makes one per call.
func (b *Bridge) replyDropped(key, why string) {
	b.m.err(errKindDropped)
	b.log.Debug("reply dropped", "key", key, "why", why)
}
