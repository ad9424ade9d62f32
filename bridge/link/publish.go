package link

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/meshbox/meshbox/bridge/codec"

	amqp "github.com/rabbitmq/amqp091-go"
)

// This file is a session's publishing connection: the publish channel
// (confirm mode) and its publisher and confirmer, the request channel (no
// confirms) and its fast publisher, and the broker's blocked
// notifications. What a message says and what a refusal means are the
// bridge's (PublisherHooks).

// PublishWindow bounds the unconfirmed publishes of a session: 4,096
// fills a 50 ms link at 80,000 messages a second, past what one broker
// takes.
const PublishWindow = 4096

// Errors an Item is settled with.
var (
	// ErrLinkDown means the broker link is not connected.
	ErrLinkDown = errors.New("mesh unreachable: broker link is not connected")
	// ErrNoRoute means the broker had no queue for a message published with
	// the mandatory flag.
	ErrNoRoute = errors.New("no route on the broker")
	// ErrNacked means the broker refused to take responsibility for a message.
	ErrNacked = errors.New("broker refused the message")
)

// Item is one message for a publisher. Done is called exactly once, from
// the publisher or the confirmer: nil when the broker confirmed it,
// ErrNoRoute when it was returned, ErrNacked, or ErrLinkDown. Done must
// not block for long.
type Item struct {
	Out      *codec.Outgoing
	Done     func(error) // call through Finish, never directly
	returned bool
	settled  atomic.Bool
}

// Finish settles the item: it calls Done once. A later call is ignored:
// when the channel closes under a publish, the publisher's error path and
// the confirmer's final sweep can both reach the same item.
func (it *Item) Finish(err error) {
	if it.settled.CompareAndSwap(false, true) {
		it.Done(err)
	}
}

// PublisherHooks are what a Publisher asks of the bridge above it.
type PublisherHooks struct {
	// Message builds the AMQP message of out (sealed where the mesh
	// seals); an error settles the item with it.
	Message func(out *codec.Outgoing) (amqp.Publishing, error)
	// Pack may gather a run of items taken at once (command batches);
	// nil: none.
	Pack func(items []*Item) []*Item
	// Written is told of each message written, fast for the request
	// channel.
	Written func(out *codec.Outgoing, fast bool)
	// Refused is told of a confirmed message the broker nacked
	// (ErrNacked) or returned (ErrNoRoute).
	Refused func(err error)
	// Fail ends the session: a publish failed on its channel.
	Fail func(err error)
}

// Publisher is a session's publishing connection: commands, events, dead
// letters and system messages on Ch (confirm mode), requests and replies
// on FastCh, and the publishes the broker has not confirmed yet. The
// publisher (Run), confirmer (Confirm) and fast publisher (RunFast)
// goroutines own it; the close channels are the session's to watch.
type Publisher struct {
	Conn        *amqp.Connection
	Cork        *CorkConn // Conn's socket: publishers batch their writes
	Ch          *amqp.Channel
	FastCh      *amqp.Channel
	FastReturns chan amqp.Return // requests and replies the broker returned: the bridge drains them
	Blocked     chan amqp.Blocking
	ConnClose   chan *amqp.Error
	ChClose     chan *amqp.Error
	FastClose   chan *amqp.Error
	confirms    chan amqp.Confirmation
	returns     chan amqp.Return

	hooks  PublisherHooks
	q      *queue        // for the publisher
	fastQ  *queue        // requests and replies for the fast publisher
	fastMu sync.Mutex    // held by whoever publishes a run of fastQ
	window chan struct{} // a slot per unconfirmed publish

	mu       sync.Mutex // guards inflight, byID, ended
	inflight map[uint64]*Item
	byID     map[string]*Item
	ended    bool
}

// NewPublisher returns the publisher of conn, whose socket is cork.
func NewPublisher(conn *amqp.Connection, cork *CorkConn, hooks PublisherHooks) *Publisher {
	p := &Publisher{Conn: conn, Cork: cork, hooks: hooks,
		q:        newQueue(PublishWindow),
		fastQ:    newQueue(PublishWindow),
		window:   make(chan struct{}, PublishWindow),
		inflight: map[uint64]*Item{},
		byID:     map[string]*Item{},
	}
	p.fastQ.track = true // a handover waits until replies are published (FastIdle)
	return p
}

// Open opens the publishing connection's channels: one in confirm mode
// for what is confirmed, one without for requests and replies.
func (p *Publisher) Open() (err error) {
	p.Ch, err = p.Conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := p.Ch.Confirm(false); err != nil {
		return fmt.Errorf("confirm mode: %w", err)
	}
	p.confirms = p.Ch.NotifyPublish(make(chan amqp.Confirmation, PublishWindow))
	p.returns = p.Ch.NotifyReturn(make(chan amqp.Return, 64))
	p.ConnClose = p.Conn.NotifyClose(make(chan *amqp.Error, 1))
	p.ChClose = p.Ch.NotifyClose(make(chan *amqp.Error, 1))
	// Requests and replies go on a channel without confirms: they are at
	// most once and bounded by a deadline, a confirm tells nothing the reply
	// or the deadline does not, and it costs latency. Returns (no route)
	// still come back at once.
	p.FastCh, err = p.Conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	p.FastReturns = p.FastCh.NotifyReturn(make(chan amqp.Return, 64))
	p.FastClose = p.FastCh.NotifyClose(make(chan *amqp.Error, 1))
	return nil
}

// End marks the publisher as ended: blocked notifications are no longer
// reported.
func (p *Publisher) End() {
	p.mu.Lock()
	p.ended = true
	p.mu.Unlock()
}

// Enqueue hands it to the publisher. It fails with ErrLinkDown, without
// calling it.Done, when ctx (the session's) ends first; once handed over,
// it.Done is called exactly once.
func (p *Publisher) Enqueue(ctx context.Context, it *Item) error { return p.q.put(ctx, it, true) }

// EnqueueFast hands a request or a reply to the fast publisher (no
// confirm: it.Done gets nil once written), on the terms of Enqueue.
//
// When no run is being published, the caller publishes it itself: a hand-over
// to the fast publisher's goroutine costs a request and its reply a
// goroutine wake-up each, on the path every call waits on.
func (p *Publisher) EnqueueFast(ctx context.Context, it *Item) error {
	if err := p.fastQ.put(ctx, it, false); err != nil {
		return err
	}
	if p.fastMu.TryLock() {
		p.fastRun()
		p.fastMu.Unlock()
		return nil
	}
	signal(p.fastQ.ready) // the one publishing now may have taken its run already
	return nil
}

// FastIdle reports whether no request or reply waits for the fast
// publisher or is being published.
func (p *Publisher) FastIdle() bool { return p.fastQ.empty() }

// fastRun publishes what waits for the fast publisher, under fastMu.
func (p *Publisher) fastRun() {
	items := p.fastQ.take()
	if len(items) == 0 {
		return
	}
	p.fastPublish(items)
	p.fastQ.settled(len(items))
}

// queue hands items to a publisher in order. Senders do not wait for
// the publisher (it takes everything queued at once), only for room: at
// most size items wait. Once closed, put fails and nothing is left behind.
type queue struct {
	mu     sync.Mutex
	items  []*Item
	track  bool // count taken items until settled (empty waits for them)
	taken  int  // items taken and not settled yet
	closed bool
	ready  chan struct{} // cap 1: items are waiting
	slots  chan struct{} // one per waiting item
}

func newQueue(size int) *queue {
	return &queue{ready: make(chan struct{}, 1), slots: make(chan struct{}, size)}
}

func (q *queue) put(ctx context.Context, it *Item, wake bool) error {
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
func (q *queue) take() []*Item {
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
func (q *queue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	for _, it := range q.take() {
		it.Finish(ErrLinkDown)
	}
}

// empty reports whether no item waits in q or is being published.
func (q *queue) empty() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items) == 0 && q.taken == 0
}

// settled says that n items taken were published (or failed).
func (q *queue) settled(n int) {
	q.mu.Lock()
	q.taken -= n
	q.mu.Unlock()
}

// RunFast owns the request channel: it publishes requests and replies in
// the order handed over. Exits when ctx ends or a publish fails, settling
// what is left with ErrLinkDown.
func (p *Publisher) RunFast(ctx context.Context) {
	defer p.fastQ.close()
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.fastQ.ready:
		}
		p.fastMu.Lock()
		p.fastRun()
		p.fastMu.Unlock()
	}
}

// fastPublish publishes a run of requests and replies with one write. It
// returns false when the session must end.
func (p *Publisher) fastPublish(items []*Item) bool {
	p.Cork.Cork()
	defer p.Cork.Uncork()
	for i, it := range items {
		m, err := p.hooks.Message(it.Out)
		if err != nil {
			it.Finish(err) // not sealed: no key to seal with
			continue
		}
		err = p.FastCh.Publish(it.Out.Exchange, it.Out.RoutingKey(), it.Out.Mandatory, false, m)
		if err != nil {
			var ae *amqp.Error
			if errors.As(err, &ae) || errors.Is(err, amqp.ErrClosed) {
				for _, rest := range items[i:] {
					rest.Finish(ErrLinkDown)
				}
				p.hooks.Fail(fmt.Errorf("publish: %w", err))
				return false
			}
			it.Finish(fmt.Errorf("publish: %w", err))
			continue
		}
		p.hooks.Written(it.Out, true)
		it.Finish(nil)
	}
	return true
}

// Run owns the publish channel: it publishes items in the order they were
// handed over, at most PublishWindow unconfirmed. Exits when ctx ends or
// a publish fails, settling what is left with ErrLinkDown.
func (p *Publisher) Run(ctx context.Context) {
	defer p.q.close()
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.q.ready:
		}
		items := p.q.take()
		if p.hooks.Pack != nil && len(items) > 1 {
			items = p.hooks.Pack(items)
		}
		p.Cork.Cork() // the run goes out with one write
		for i, it := range items {
			if !p.publish(ctx, it) {
				p.Cork.Uncork()
				for _, rest := range items[i+1:] {
					rest.Finish(ErrLinkDown)
				}
				return
			}
		}
		p.Cork.Uncork()
	}
}

// publish publishes one item in confirm mode. It returns false when the
// session must end (it.Done has been called).
func (p *Publisher) publish(ctx context.Context, it *Item) bool {
	select {
	case p.window <- struct{}{}:
	default:
		p.Cork.Flush() // the broker confirms only what it received
		select {
		case p.window <- struct{}{}:
		case <-ctx.Done():
			it.Finish(ErrLinkDown)
			return false
		}
	}
	m, err := p.hooks.Message(it.Out)
	if err != nil {
		<-p.window
		it.Finish(err) // not sealed: no key to seal with
		return true
	}
	tag := p.Ch.GetNextPublishSeqNo()
	p.mu.Lock()
	p.inflight[tag] = it
	if it.Out.MsgID != "" && it.Out.Mandatory {
		p.byID[it.Out.MsgID] = it
	}
	p.mu.Unlock()
	_, err = p.Ch.PublishWithDeferredConfirm(it.Out.Exchange, it.Out.RoutingKey(), it.Out.Mandatory, false, m)
	if err != nil {
		p.mu.Lock()
		delete(p.inflight, tag)
		delete(p.byID, it.Out.MsgID)
		p.mu.Unlock()
		<-p.window
		var ae *amqp.Error
		if errors.As(err, &ae) || errors.Is(err, amqp.ErrClosed) {
			it.Finish(ErrLinkDown)
			p.hooks.Fail(fmt.Errorf("publish: %w", err))
			return false
		}
		it.Finish(fmt.Errorf("publish: %w", err)) // the message itself (headers) was refused
		return true
	}
	p.hooks.Written(it.Out, false)
	return true
}

// Confirm drains the publish channel's confirms and returns and settles
// each item. It exits when the channel is closed, after settling every
// item still unconfirmed with ErrLinkDown.
func (p *Publisher) Confirm() {
	confirms, returns := p.confirms, p.returns
	for confirms != nil {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			p.noteReturn(r)
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
					p.noteReturn(r)
					continue
				default:
				}
				break
			}
			p.settle(c)
		}
	}
	if returns != nil {
		for range returns { // drain until the library closes it
		}
	}
	p.mu.Lock()
	left := p.inflight
	p.inflight = map[uint64]*Item{}
	p.byID = map[string]*Item{}
	p.mu.Unlock()
	for _, it := range left {
		it.Finish(ErrLinkDown)
	}
}

func (p *Publisher) noteReturn(r amqp.Return) {
	p.mu.Lock()
	if it, ok := p.byID[r.MessageId]; ok {
		it.returned = true
	}
	p.mu.Unlock()
}

func (p *Publisher) settle(c amqp.Confirmation) {
	p.mu.Lock()
	it, ok := p.inflight[c.DeliveryTag]
	if ok {
		delete(p.inflight, c.DeliveryTag)
		if it.Out.MsgID != "" {
			delete(p.byID, it.Out.MsgID)
		}
	}
	p.mu.Unlock()
	if !ok {
		return
	}
	<-p.window
	switch {
	case !c.Ack:
		p.hooks.Refused(ErrNacked)
		it.Finish(ErrNacked)
	case it.returned:
		p.hooks.Refused(ErrNoRoute)
		it.Finish(ErrNoRoute)
	default:
		it.Finish(nil)
	}
}

// WatchBlocked follows the broker's connection.blocked notifications for
// the publishing connection (Blocked) and tells blocked of each until End:
// active while a resource alarm holds; consuming and acking go on, on the
// other connection. Exits when the publishing connection closes.
func (p *Publisher) WatchBlocked(blocked func(active bool, reason string)) {
	for bl := range p.Blocked {
		p.mu.Lock()
		if !p.ended {
			blocked(bl.Active, bl.Reason)
		}
		p.mu.Unlock()
	}
}

// signal wakes c's reader without waiting (c has room for one).
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
