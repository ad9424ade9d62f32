package bridge

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/meshbox/meshbox/bridge/codec"

	amqp "github.com/rabbitmq/amqp091-go"
)

// publishWindow bounds the unconfirmed publishes of a session: 4,096 fills
// a 50 ms link at 80,000 messages a second, past what one broker takes.
const publishWindow = 4096

// pubItem is one message for the publisher. done is called exactly once,
// from the publisher or the confirmer: nil when the broker confirmed it,
// ErrNoRoute when it was returned, ErrNacked, or ErrLinkDown. done must not
// block for long.
type pubItem struct {
	out      *codec.Outgoing
	done     func(error) // call through finish, never directly
	returned bool
	settled  atomic.Bool
}

// finish settles the item: it calls done once. A later call is ignored:
// when the channel closes under a publish, the publisher's error path and
// the confirmer's final sweep can both reach the same item.
func (it *pubItem) finish(err error) {
	if it.settled.CompareAndSwap(false, true) {
		it.done(err)
	}
}

// enqueue hands it to the publisher. It fails with ErrLinkDown, without
// calling it.done, when the session ends first; once handed over, it.done
// is called exactly once.
func (s *session) enqueue(it *pubItem) error { return s.pub.q.put(s.ctx, it, true) }

// enqueueFast hands a request or a reply to the fast publisher (no
// confirm: it.done gets nil once written), on the terms of enqueue.
//
// When no run is being published, the caller publishes it itself: a hand-over
// to the fast publisher's goroutine costs a request and its reply a
// goroutine wake-up each, on the path every call waits on.
func (s *session) enqueueFast(it *pubItem) error {
	if err := s.pub.fastQ.put(s.ctx, it, false); err != nil {
		return err
	}
	if s.pub.fastMu.TryLock() {
		s.fastRun()
		s.pub.fastMu.Unlock()
		return nil
	}
	signal(s.pub.fastQ.ready) // the one publishing now may have taken its run already
	return nil
}

// fastRun publishes what waits for the fast publisher, under fastMu.
func (s *session) fastRun() {
	items := s.pub.fastQ.take()
	if len(items) == 0 {
		return
	}
	s.fastPublish(items)
	s.pub.fastQ.settled(len(items))
}

// pubQueue hands items to a publisher in order. Senders do not wait for
// the publisher (it takes everything queued at once), only for room: at
// most size items wait. Once closed, put fails and nothing is left behind.
type pubQueue struct {
	mu     sync.Mutex
	items  []*pubItem
	track  bool // count taken items until settled (empty waits for them)
	taken  int  // items taken and not settled yet
	closed bool
	ready  chan struct{} // cap 1: items are waiting
	slots  chan struct{} // one per waiting item
}

func newPubQueue(size int) *pubQueue {
	return &pubQueue{ready: make(chan struct{}, 1), slots: make(chan struct{}, size)}
}

func (q *pubQueue) put(ctx context.Context, it *pubItem, wake bool) error {
	select {
	case q.slots <- struct{}{}:
	case <-ctx.Done():
		return ErrLinkDown
	}
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		<-q.slots
		return ErrLinkDown
	}
	q.items = append(q.items, it)
	q.mu.Unlock()
	if wake {
		signal(q.ready)
	}
	return nil
}

// take returns every waiting item, oldest first.
func (q *pubQueue) take() []*pubItem {
	q.mu.Lock()
	items := q.items
	q.items = nil
	if q.track {
		q.taken += len(items)
	}
	q.mu.Unlock()
	for range items {
		<-q.slots
	}
	return items
}

// close refuses new items and settles the waiting ones with ErrLinkDown.
func (q *pubQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	for _, it := range q.take() {
		it.finish(ErrLinkDown)
	}
}

// empty reports whether no item waits in q or is being published.
func (q *pubQueue) empty() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items) == 0 && q.taken == 0
}

// settled says that n items taken were published (or failed).
func (q *pubQueue) settled(n int) {
	q.mu.Lock()
	q.taken -= n
	q.mu.Unlock()
}

// fastPublisher owns the request channel: it publishes requests and
// replies in the order handed over. Exits when the session ends or a
// publish fails, settling what is left with ErrLinkDown.
func (s *session) fastPublisher() {
	defer s.pub.fastQ.close()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.pub.fastQ.ready:
		}
		s.pub.fastMu.Lock()
		s.fastRun()
		s.pub.fastMu.Unlock()
	}
}

// fastPublish publishes a run of requests and replies with one write. It
// returns false when the session must end.
func (s *session) fastPublish(items []*pubItem) bool {
	s.pub.cork.Cork()
	defer s.pub.cork.Uncork()
	for i, it := range items {
		p, err := it.out.Publishing(s.b.cfg.Node, s.user, s.b.cfg.Keys)
		if err != nil {
			it.finish(err) // not sealed: no key to seal with
			continue
		}
		err = s.pub.fastCh.Publish(it.out.Exchange, it.out.RoutingKey(), it.out.Mandatory, false, p)
		if err != nil {
			var ae *amqp.Error
			if errors.As(err, &ae) || errors.Is(err, amqp.ErrClosed) {
				for _, rest := range items[i:] {
					rest.finish(ErrLinkDown)
				}
				s.fail(fmt.Errorf("publish: %w", err))
				return false
			}
			it.finish(fmt.Errorf("publish: %w", err))
			continue
		}
		s.b.m.msg(it.out.Kind, "out")
		switch it.out.Kind {
		case codec.TypeRequest:
			hop(HopRequestWritten)
		case codec.TypeReply:
			hop(HopReplyWritten)
		}
		it.finish(nil)
	}
	return true
}

// fastReturned drains the request channel's returns: a request or a reply
// the broker could not route (its node is not connected) is sent again
// for a short while (noroute.go); a request that may not reach its node
// fails then. A returned probe tells its prober (probe.go). Exits when the
// channel closes.
func (s *session) fastReturned() {
	for r := range s.pub.fastReturns {
		if node, ok := probedNode(r.RoutingKey); ok && r.Type == "" {
			s.b.probeReturned(node)
			continue
		}
		if r.Type == codec.TypeReply {
			s.b.retryReply(r)
			continue
		}
		if s.b.retryRequest(r.MessageId) {
			continue
		}
		s.b.m.err(errKindNoRoute)
		if p := s.b.takePending(r.MessageId); p != nil {
			s.b.m.err(errKindUnreachable)
			s.b.m.observe("unreachable", p.start)
			s.b.replyError(p.reply, requestFailure(ErrNoRoute, p.name, p.node))
		}
	}
}

// publishWait publishes out and waits for the broker's confirm (or ctx).
func (s *session) publishWait(ctx context.Context, out *codec.Outgoing) error {
	res := make(chan error, 1)
	if err := s.enqueue(&pubItem{out: out, done: func(err error) { res <- err }}); err != nil {
		return err
	}
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// publisher owns the publish channel: it publishes items in the order they
// were handed over, at most publishWindow unconfirmed. Exits when the
// session ends or a publish fails, settling what is left with ErrLinkDown.
func (s *session) publisher() {
	defer s.pub.q.close()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.pub.q.ready:
		}
		items := s.pub.q.take()
		if most := s.b.batchMax(); most > 1 && len(items) > 1 {
			items = s.packCommands(items, most)
		}
		s.pub.cork.Cork() // the run goes out with one write
		for i, it := range items {
			if !s.publish(it) {
				s.pub.cork.Uncork()
				for _, rest := range items[i+1:] {
					rest.finish(ErrLinkDown)
				}
				return
			}
		}
		s.pub.cork.Uncork()
	}
}

// publish publishes one item in confirm mode. It returns false when the
// session must end (it.done has been called).
func (s *session) publish(it *pubItem) bool {
	select {
	case s.pub.window <- struct{}{}:
	default:
		s.pub.cork.Flush() // the broker confirms only what it received
		select {
		case s.pub.window <- struct{}{}:
		case <-s.ctx.Done():
			it.finish(ErrLinkDown)
			return false
		}
	}
	p, err := it.out.Publishing(s.b.cfg.Node, s.user, s.b.cfg.Keys)
	if err != nil {
		<-s.pub.window
		it.finish(err) // not sealed: no key to seal with
		return true
	}
	tag := s.pub.ch.GetNextPublishSeqNo()
	s.pub.mu.Lock()
	s.pub.inflight[tag] = it
	if it.out.MsgID != "" && it.out.Mandatory {
		s.pub.byID[it.out.MsgID] = it
	}
	s.pub.mu.Unlock()
	_, err = s.pub.ch.PublishWithDeferredConfirm(it.out.Exchange, it.out.RoutingKey(), it.out.Mandatory, false, p)
	if err != nil {
		s.pub.mu.Lock()
		delete(s.pub.inflight, tag)
		delete(s.pub.byID, it.out.MsgID)
		s.pub.mu.Unlock()
		<-s.pub.window
		var ae *amqp.Error
		if errors.As(err, &ae) || errors.Is(err, amqp.ErrClosed) {
			it.finish(ErrLinkDown)
			s.fail(fmt.Errorf("publish: %w", err))
			return false
		}
		it.finish(fmt.Errorf("publish: %w", err)) // the message itself (headers) was refused
		return true
	}
	if n := it.out.Batch; n > 0 {
		s.b.m.batchSize.Observe(float64(n))
		for range n {
			s.b.m.msg(codec.TypeCommand, "out")
		}
		return true
	}
	s.b.m.msg(it.out.Kind, "out")
	return true
}

// confirmer drains the publish channel's confirms and returns and settles
// each item. It exits when the channel is closed, after settling every
// item still unconfirmed with ErrLinkDown.
func (s *session) confirmer() {
	confirms, returns := s.pub.confirms, s.pub.returns
	for confirms != nil {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			s.noteReturn(r)
		case c, ok := <-confirms:
			if !ok {
				confirms = nil
				continue
			}
			// A return precedes its message's confirm on the wire, and the
			// library queued it before this confirm: take it first.
			for returns != nil {
				select {
				case r, ok := <-returns:
					if !ok {
						returns = nil
						continue
					}
					s.noteReturn(r)
					continue
				default:
				}
				break
			}
			s.settle(c)
		}
	}
	if returns != nil {
		for range returns { // drain until the library closes it
		}
	}
	s.pub.mu.Lock()
	left := s.pub.inflight
	s.pub.inflight = map[uint64]*pubItem{}
	s.pub.byID = map[string]*pubItem{}
	s.pub.mu.Unlock()
	for _, it := range left {
		it.finish(ErrLinkDown)
	}
}

func (s *session) noteReturn(r amqp.Return) {
	s.pub.mu.Lock()
	if it, ok := s.pub.byID[r.MessageId]; ok {
		it.returned = true
	}
	s.pub.mu.Unlock()
}

func (s *session) settle(c amqp.Confirmation) {
	s.pub.mu.Lock()
	it, ok := s.pub.inflight[c.DeliveryTag]
	if ok {
		delete(s.pub.inflight, c.DeliveryTag)
		if it.out.MsgID != "" {
			delete(s.pub.byID, it.out.MsgID)
		}
	}
	s.pub.mu.Unlock()
	if !ok {
		return
	}
	<-s.pub.window
	switch {
	case !c.Ack:
		s.b.m.err(errKindNacked)
		it.finish(ErrNacked)
	case it.returned:
		s.b.m.err(errKindNoRoute)
		it.finish(ErrNoRoute)
	default:
		it.finish(nil)
	}
}

// watchBlocked follows the broker's connection.blocked notifications for
// the publishing connection: the link is "blocked" (with the broker's
// reason) while a resource alarm holds; consuming and acking go on, on the
// other connection. Exits when the publishing connection closes.
func (s *session) watchBlocked() {
	for bl := range s.pub.blocked {
		s.pub.mu.Lock()
		if !s.pub.ended {
			if bl.Active {
				s.b.m.blocks.Inc()
				s.b.setState(StateBlocked, "broker resource alarm: "+bl.Reason)
				s.b.link.SetBlocked(bl.Reason)
			} else {
				s.b.setState(StateConnected, "")
			}
		}
		s.pub.mu.Unlock()
	}
}
