package bridge

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
)

const (
	dialTimeout    = 5 * time.Second  // TCP connect
	handshakeLimit = 10 * time.Second // TLS and AMQP handshake
	closeLimit     = time.Second      // graceful close of a connection being dropped
	publishWindow  = 1024             // unconfirmed publishes per session
	// stageDeliveryLimit is the quorum queues' x-delivery-limit: a backstop
	// above any retry budget, so the bridge's own budget (with a reason)
	// dead-letters first. It is a constant so that every node declares the
	// same arguments.
	stageDeliveryLimit = 1000
	// eventQueueExpiry deletes the event queue of a node unused this long.
	eventQueueExpiry = 7 * 24 * time.Hour
)

// runLink owns the broker link: it connects, runs a session until it ends,
// and reconnects with backoff and jitter. first is a session Start already
// opened (or nil). runLink exits when b.quit is closed.
func (b *Bridge) runLink(first *session) {
	sess := first
	failures := 0
	var refusedSince time.Time
	for {
		if sess == nil {
			url := b.currentURL()
			if url == "" {
				b.setState(StateNone, "no broker configured")
				select {
				case <-b.quit:
					return
				case <-b.urlChanged:
					continue
				}
			}
			if st, _ := b.linkState(); st == StateNone {
				b.setState(StateConnecting, "")
			}
			ctx, cancel := b.withQuit(context.Background())
			s, err := b.connect(ctx, url)
			cancel()
			if err != nil {
				select {
				case <-b.quit:
					return
				default:
				}
				failures++
				b.m.err(errKindLink)
				var inUse *NodeNameInUseError
				if errors.As(err, &inUse) {
					if refusedSince.IsZero() {
						refusedSince = time.Now()
						b.log.Error("broker refuses this node's name", "node", b.cfg.Node, "reason", inUse.Detail)
					}
					// A stale connection of ours lasts at most two heartbeats; longer means
					// another process owns the name.
					if time.Since(refusedSince) > 3*b.cfg.Heartbeat+5*time.Second {
						select {
						case b.fatal <- err:
						default:
						}
					}
				} else {
					refusedSince = time.Time{}
				}
				b.setState(StateOffline, err.Error())
				select {
				case <-b.quit:
					return
				case <-b.urlChanged:
					failures = 0
					b.setState(StateConnecting, "broker URL changed")
				case <-time.After(b.backoff(failures)):
				}
				continue
			}
			sess = s
			if b.m != nil && b.everConnected() {
				b.m.reconnects.Inc()
			}
		}
		failures, refusedSince = 0, time.Time{}
		b.sess.Store(sess)
		sess.start()
		b.setState(StateConnected, "")
		reason := sess.run()
		sess.end()
		b.sess.CompareAndSwap(sess, nil)
		select {
		case <-b.quit:
			b.setState(StateOffline, reason)
			sess.stop()
			return
		default:
		}
		if reason == reasonURLChanged {
			b.setState(StateConnecting, reason)
		} else {
			b.m.err(errKindLink)
			b.setState(StateOffline, reason)
		}
		sess.stop()
		sess = nil
		if reason != reasonURLChanged {
			// A link that just dropped is retried soon, but not in a tight loop.
			select {
			case <-b.quit:
				return
			case <-time.After(b.backoff(1)):
			case <-b.urlChanged:
			}
		}
	}
}

const (
	reasonURLChanged = "broker URL changed"
	reasonShutdown   = "node shutting down"
)

// everConnected reports whether a connected state was ever recorded
// before the current one.
func (b *Bridge) everConnected() bool {
	b.linkMu.Lock()
	defer b.linkMu.Unlock()
	for _, h := range b.history {
		if h.State == StateConnected {
			return true
		}
	}
	return false
}

// backoff returns the wait before attempt n (1-based): exponential from
// ReconnectMin up to ReconnectMax, with the upper half randomized.
func (b *Bridge) backoff(n int) time.Duration {
	d := b.cfg.ReconnectMin
	for i := 1; i < n && d < b.cfg.ReconnectMax; i++ {
		d *= 2
	}
	d = min(d, b.cfg.ReconnectMax)
	return d/2 + rand.N(d/2+1)
}

// withQuit returns a context that is cancelled by cancel or when the bridge
// closes. A helper goroutine lives until one of the two.
func (b *Bridge) withQuit(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	go func() { // exits on cancel or on quit
		select {
		case <-b.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// dial opens the AMQP connection. Cancelling ctx aborts the handshake.
func (b *Bridge) dial(ctx context.Context, url string) (*amqp.Connection, error) {
	cfg := amqp.Config{
		Heartbeat:  b.cfg.Heartbeat,
		Locale:     "en_US",
		Properties: amqp.NewConnectionProperties(),
	}
	cfg.Properties.SetClientConnectionName("meshbox node " + b.cfg.Node)
	if strings.HasPrefix(url, "amqps://") {
		tc, err := b.tlsConfig()
		if err != nil {
			return nil, err
		}
		cfg.TLSClientConfig = tc
	}
	var stop func() bool
	cfg.Dial = func(network, addr string) (net.Conn, error) {
		d := net.Dialer{Timeout: dialTimeout}
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if err := conn.SetDeadline(time.Now().Add(handshakeLimit)); err != nil { // cleared by amqp091 once open
			conn.Close()
			return nil, err
		}
		stop = context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
		return conn, nil
	}
	conn, err := amqp.DialConfig(url, cfg)
	if stop != nil {
		stop()
	}
	if err != nil {
		return nil, err
	}
	return conn, nil
}

// tlsConfig trusts the system roots plus Config.CAFile.
func (b *Bridge) tlsConfig() (*tls.Config, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if b.cfg.CAFile != "" {
		pem, err := os.ReadFile(b.cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("broker CA file: %w", err)
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("broker CA file %s: no PEM certificates", b.cfg.CAFile)
		}
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// session is one connection to the broker and everything that lives as
// long as it: the publish channel and its two goroutines, the consume
// channel and its owner, one reader per consumer, per-delivery workers, the
// outbox drainer and the stall checker. A session is never reused: when any
// part fails the whole session ends and runLink opens a new one.
type session struct {
	b    *Bridge
	conn *amqp.Connection
	url  string

	ctx    context.Context // cancelled by end: workers and goroutines stop
	cancel context.CancelFunc
	failed chan error // cap 1: the first fatal error of a part

	pubCh, conCh, fastCh, autoCh                        *amqp.Channel
	connClose, pubClose, conClose, fastClose, autoClose chan *amqp.Error
	fastReturns                                         chan amqp.Return
	blocked                                             chan amqp.Blocking
	confirms                                            chan amqp.Confirmation
	returns                                             chan amqp.Return
	cancels                                             chan string
	initial                                             map[string]<-chan amqp.Delivery // consumers opened by setup

	pubQ   *pubQueue     // for the publisher
	fastQ  *pubQueue     // requests and replies for the fast publisher
	window chan struct{} // a slot per unconfirmed publish

	mu       sync.Mutex // guards inflight, byID, ended
	inflight map[uint64]*pubItem
	byID     map[string]*pubItem
	ended    bool

	ackQ      chan ackReq
	acks      ackBook // settled deliveries of conCh (consumer owner only)
	stagesMu  sync.Mutex
	stages    map[string]bool // stages consumed in this session (owner only writes)
	drainWait sync.WaitGroup  // drained records handed to the publisher, not settled
	rescan    chan struct{}   // cap 1: the drainer starts over from the oldest record

	inbox     string               // NATS subject prefix of local hosts' replies
	cmdInbox  string               // NATS subject prefix of command handlers' replies
	inboxSubs []*nats.Subscription // on bc, for onHostReply and onCmdReply
	callsMu   sync.Mutex
	calls     map[string]*hostCall // requests from other nodes open at a local host
	cmds      map[string]*cmdCall  // commands open at a local handler
	cmdsEnded bool                 // the session ended: no new entries in cmds

	wg      sync.WaitGroup // the session's goroutines
	workers tracker        // goroutines and timers working on deliveries
}

// pubItem is one message for the publisher. done is called exactly once,
// from the publisher or the confirmer: nil when the broker confirmed it,
// ErrNoRoute when it was returned, ErrNacked, or ErrLinkDown. done must not
// block for long.
type pubItem struct {
	out      *outgoing
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

type ackOp int

const (
	opAck ackOp = iota
	opRequeue
)

type ackReq struct {
	tag uint64
	op  ackOp
}

// connect dials url and declares the node's topology. It returns a session
// that is set up but not started.
func (b *Bridge) connect(ctx context.Context, url string) (*session, error) {
	conn, err := b.dial(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connect to broker: %w", err)
	}
	s := &session{
		b: b, conn: conn, url: url,
		failed:   make(chan error, 1),
		pubQ:     newPubQueue(publishWindow),
		fastQ:    newPubQueue(publishWindow),
		window:   make(chan struct{}, publishWindow),
		inflight: map[uint64]*pubItem{},
		byID:     map[string]*pubItem{},
		ackQ:     make(chan ackReq, 256),
		stages:   map[string]bool{},
		rescan:   make(chan struct{}, 1),
		calls:    map[string]*hostCall{},
		cmds:     map[string]*cmdCall{},
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if err := s.setup(); err != nil {
		s.cancel()
		_ = conn.CloseDeadline(time.Now().Add(closeLimit))
		return nil, err
	}
	return s, nil
}

// setup declares the topology (see the package doc), claims the node's
// request queue with an exclusive consumer, and opens the channels.
func (s *session) setup() error {
	node := s.b.cfg.Node
	ch, err := s.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	steps := []struct {
		what string
		do   func() error
	}{
		{"exchange " + exchangeMesh, func() error { return ch.ExchangeDeclare(exchangeMesh, "topic", true, false, false, false, nil) }},
		{"exchange " + exchangeDLX, func() error { return ch.ExchangeDeclare(exchangeDLX, "topic", true, false, false, false, nil) }},
		{"exchange " + nodeExchange(node), func() error {
			return ch.ExchangeDeclare(nodeExchange(node), "topic", true, false, false, false, nil)
		}},
		{"binding mesh -> " + nodeExchange(node), func() error {
			return ch.ExchangeBind(nodeExchange(node), "to."+node+".#", exchangeMesh, false, nil)
		}},
		{"queue " + queueDead, func() error {
			_, err := ch.QueueDeclare(queueDead, true, false, false, false, nil)
			return err
		}},
		{"binding " + queueDead, func() error { return ch.QueueBind(queueDead, "#", exchangeDLX, false, nil) }},
		{"queue " + requestQueue(node), func() error {
			_, err := ch.QueueDeclare(requestQueue(node), false, true, false, false, nil)
			return err
		}},
		{"binding " + requestQueue(node), func() error {
			return ch.QueueBind(requestQueue(node), "to."+node+".req.#", nodeExchange(node), false, nil)
		}},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			return fmt.Errorf("declare %s: %w", st.what, err)
		}
	}

	// Two consume channels: autoCh for what is consumed without acks
	// (requests, replies, system messages), conCh for what is acked (events,
	// commands), so that conCh's delivery tags are dense and a run of them
	// can be acked at once. The exclusive consumer is the node's claim on
	// its name.
	s.autoCh, err = s.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	s.conCh, err = s.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := s.conCh.Qos(s.b.cfg.Prefetch, 0, false); err != nil {
		return fmt.Errorf("set prefetch: %w", err)
	}
	// Requests are at most once: consumed without acks (an ack per request
	// costs the broker a round of work on the critical path); openCalls
	// bounds how many are open at the local hosts.
	reqs, err := s.autoCh.Consume(requestQueue(node), "requests", true, true, false, false, nil)
	if err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.AccessRefused {
			return &NodeNameInUseError{Node: node, Detail: ae.Reason}
		}
		return fmt.Errorf("consume %s: %w", requestQueue(node), err)
	}

	more := []struct {
		what string
		do   func() error
	}{
		{"queue " + replyQueue(node), func() error {
			_, err := ch.QueueDeclare(replyQueue(node), false, true, true, false, nil)
			var ae *amqp.Error
			if errors.As(err, &ae) && ae.Code == amqp.ResourceLocked {
				return &NodeNameInUseError{Node: node, Detail: ae.Reason}
			}
			return err
		}},
		{"queue " + eventQueue(node), func() error {
			_, err := ch.QueueDeclare(eventQueue(node), true, false, false, false,
				amqp.Table{"x-expires": eventQueueExpiry.Milliseconds()})
			return err
		}},
		{"binding " + eventQueue(node), func() error { return ch.QueueBind(eventQueue(node), "evt.#", exchangeMesh, false, nil) }},
		{"queue " + systemQueue(node), func() error {
			_, err := ch.QueueDeclare(systemQueue(node), false, true, true, false, nil)
			return err
		}},
		{"binding " + systemQueue(node), func() error { return ch.QueueBind(systemQueue(node), "sys.#", exchangeMesh, false, nil) }},
		{"binding " + systemQueue(node) + " (addressed)", func() error {
			return ch.QueueBind(systemQueue(node), "to."+node+".sys.#", nodeExchange(node), false, nil)
		}},
	}
	for _, st := range more {
		if err := st.do(); err != nil {
			var inUse *NodeNameInUseError
			if errors.As(err, &inUse) {
				return err
			}
			return fmt.Errorf("declare %s: %w", st.what, err)
		}
	}
	replies, err := s.autoCh.Consume(replyQueue(node), "replies", true, true, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume %s: %w", replyQueue(node), err)
	}
	events, err := s.conCh.Consume(eventQueue(node), "events", false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume %s: %w", eventQueue(node), err)
	}
	system, err := s.autoCh.Consume(systemQueue(node), "system", true, true, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume %s: %w", systemQueue(node), err)
	}
	s.initial = map[string]<-chan amqp.Delivery{"requests": reqs, "replies": replies, "events": events, "system": system}

	s.pubCh, err = s.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := s.pubCh.Confirm(false); err != nil {
		return fmt.Errorf("confirm mode: %w", err)
	}
	s.confirms = s.pubCh.NotifyPublish(make(chan amqp.Confirmation, publishWindow))
	s.returns = s.pubCh.NotifyReturn(make(chan amqp.Return, 64))
	s.connClose = s.conn.NotifyClose(make(chan *amqp.Error, 1))
	s.pubClose = s.pubCh.NotifyClose(make(chan *amqp.Error, 1))
	// Requests and replies go on a channel without confirms: they are at
	// most once and bounded by a deadline, a confirm tells nothing the reply
	// or the deadline does not, and it costs latency. Returns (no route)
	// still come back at once.
	s.fastCh, err = s.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	s.fastReturns = s.fastCh.NotifyReturn(make(chan amqp.Return, 64))
	s.fastClose = s.fastCh.NotifyClose(make(chan *amqp.Error, 1))
	s.conClose = s.conCh.NotifyClose(make(chan *amqp.Error, 1))
	s.autoClose = s.autoCh.NotifyClose(make(chan *amqp.Error, 1))
	s.cancels = s.conCh.NotifyCancel(make(chan string, 16))
	s.blocked = s.conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	return nil
}

// start runs the session's goroutines. Each exits when the session's
// context is cancelled or its AMQP channel closes; end and stop wait.
func (s *session) start() {
	s.inbox, s.cmdInbox = nats.NewInbox()+".", nats.NewInbox()+"."
	for subj, cb := range map[string]nats.MsgHandler{s.inbox + "*": s.onHostReply, s.cmdInbox + "*": s.onCmdReply} {
		sub, err := s.b.bc.Subscribe(subj, cb)
		if err != nil {
			s.fail(fmt.Errorf("subscribe to local replies: %w", err))
			continue
		}
		_ = sub.SetPendingLimits(1<<20, 256<<20)
		s.inboxSubs = append(s.inboxSubs, sub)
	}
	s.spawn(s.publisher)
	s.spawn(s.confirmer)
	s.spawn(s.fastPublisher)
	s.spawn(s.fastReturned)
	s.spawn(s.watchBlocked)
	s.spawn(s.consumerOwner)
	s.spawn(func() { s.readRequests(s.initial["requests"]) })
	s.spawn(func() { s.readReplies(s.initial["replies"]) })
	s.spawn(func() { s.readEvents(s.initial["events"]) })
	s.spawn(func() { s.readSystem(s.initial["system"]) })
	s.spawn(s.drainer)
	s.spawn(s.stallChecker)
}

func (s *session) spawn(f func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
}

// run waits until the session must end and returns why.
func (s *session) run() string {
	for {
		select {
		case <-s.b.quit:
			return reasonShutdown
		case <-s.b.urlChanged:
			if s.b.currentURL() != s.url {
				return reasonURLChanged
			}
		case e := <-s.connClose:
			return closeReason("connection closed", e)
		case e := <-s.pubClose:
			return closeReason("publish channel closed", e)
		case e := <-s.fastClose:
			return closeReason("request channel closed", e)
		case e := <-s.autoClose:
			return closeReason("consume channel closed", e)
		case e := <-s.conClose:
			return closeReason("consume channel closed", e)
		case err := <-s.failed:
			return err.Error()
		}
	}
}

func closeReason(what string, e *amqp.Error) string {
	if e == nil {
		return what
	}
	return fmt.Sprintf("%s: %d %s", what, e.Code, e.Reason)
}

// fail ends the session with err (the first error wins).
func (s *session) fail(err error) {
	select {
	case s.failed <- err:
	default:
	}
}

// end marks the session as ended: nothing new is handed to it.
func (s *session) end() {
	s.mu.Lock()
	s.ended = true
	s.mu.Unlock()
}

// stop tears the session down and waits for all its goroutines. Messages
// handed to the publisher and not confirmed are settled with ErrLinkDown.
func (s *session) stop() {
	s.end()
	s.cancel()
	_ = s.conn.CloseDeadline(time.Now().Add(closeLimit))
	s.wg.Wait()
	for _, sub := range s.inboxSubs {
		_ = sub.Unsubscribe()
	}
	s.endCalls()
	s.endCmds()
	s.workers.closeAndWait()
	s.b.failPendingOf(s)
}

// enqueue hands it to the publisher. It fails with ErrLinkDown, without
// calling it.done, when the session ends first; once handed over, it.done
// is called exactly once.
func (s *session) enqueue(it *pubItem) error { return s.pubQ.put(s.ctx, it) }

// enqueueFast hands a request or a reply to the fast publisher (no
// confirm: it.done gets nil once written), on the terms of enqueue.
func (s *session) enqueueFast(it *pubItem) error { return s.fastQ.put(s.ctx, it) }

// pubQueue hands items to a publisher in order. Senders do not wait for
// the publisher (it takes everything queued at once), only for room: at
// most size items wait. Once closed, put fails and nothing is left behind.
type pubQueue struct {
	mu     sync.Mutex
	items  []*pubItem
	closed bool
	ready  chan struct{} // cap 1: items are waiting
	slots  chan struct{} // one per waiting item
}

func newPubQueue(size int) *pubQueue {
	return &pubQueue{ready: make(chan struct{}, 1), slots: make(chan struct{}, size)}
}

func (q *pubQueue) put(ctx context.Context, it *pubItem) error {
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
	signal(q.ready)
	return nil
}

// take returns every waiting item, oldest first.
func (q *pubQueue) take() []*pubItem {
	q.mu.Lock()
	items := q.items
	q.items = nil
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

// fastPublisher owns the request channel: it publishes requests and
// replies in the order handed over. Exits when the session ends or a
// publish fails, settling what is left with ErrLinkDown.
func (s *session) fastPublisher() {
	defer s.fastQ.close()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.fastQ.ready:
		}
		items := s.fastQ.take()
		for i, it := range items {
			err := s.fastCh.Publish(it.out.exchange, it.out.key, it.out.mandatory, false, it.out.publishing(s.b.cfg.Node))
			if err != nil {
				var ae *amqp.Error
				if errors.As(err, &ae) || errors.Is(err, amqp.ErrClosed) {
					for _, rest := range items[i:] {
						rest.finish(ErrLinkDown)
					}
					s.fail(fmt.Errorf("publish: %w", err))
					return
				}
				it.finish(fmt.Errorf("publish: %w", err))
				continue
			}
			s.b.m.msg(it.out.kind, "out")
			it.finish(nil)
		}
	}
}

// fastReturned drains the request channel's returns: a request the broker
// could not route (its node is not connected) fails at once. Exits when
// the channel closes.
func (s *session) fastReturned() {
	for r := range s.fastReturns {
		s.b.m.err(errKindNoRoute)
		if p := s.b.takePending(r.MessageId); p != nil {
			s.b.m.err(errKindUnreachable)
			s.b.m.observe("unreachable", p.start)
			s.b.replyError(p.reply, requestFailure(ErrNoRoute, p.name, p.node))
		}
	}
}

// publishWait publishes out and waits for the broker's confirm (or ctx).
func (s *session) publishWait(ctx context.Context, out *outgoing) error {
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
	defer s.pubQ.close()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.pubQ.ready:
		}
		items := s.pubQ.take()
		for i, it := range items {
			if !s.publish(it) {
				for _, rest := range items[i+1:] {
					rest.finish(ErrLinkDown)
				}
				return
			}
		}
	}
}

// publish publishes one item in confirm mode. It returns false when the
// session must end (it.done has been called).
func (s *session) publish(it *pubItem) bool {
	select {
	case s.window <- struct{}{}:
	case <-s.ctx.Done():
		it.finish(ErrLinkDown)
		return false
	}
	p := it.out.publishing(s.b.cfg.Node)
	tag := s.pubCh.GetNextPublishSeqNo()
	s.mu.Lock()
	s.inflight[tag] = it
	if it.out.msgID != "" && it.out.mandatory {
		s.byID[it.out.msgID] = it
	}
	s.mu.Unlock()
	_, err := s.pubCh.PublishWithDeferredConfirm(it.out.exchange, it.out.key, it.out.mandatory, false, p)
	if err != nil {
		s.mu.Lock()
		delete(s.inflight, tag)
		delete(s.byID, it.out.msgID)
		s.mu.Unlock()
		<-s.window
		var ae *amqp.Error
		if errors.As(err, &ae) || errors.Is(err, amqp.ErrClosed) {
			it.finish(ErrLinkDown)
			s.fail(fmt.Errorf("publish: %w", err))
			return false
		}
		it.finish(fmt.Errorf("publish: %w", err)) // the message itself (headers) was refused
		return true
	}
	s.b.m.msg(it.out.kind, "out")
	return true
}

// confirmer drains the publish channel's confirms and returns and settles
// each item. It exits when the channel is closed, after settling every
// item still unconfirmed with ErrLinkDown.
func (s *session) confirmer() {
	confirms, returns := s.confirms, s.returns
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
	s.mu.Lock()
	left := s.inflight
	s.inflight = map[uint64]*pubItem{}
	s.byID = map[string]*pubItem{}
	s.mu.Unlock()
	for _, it := range left {
		it.finish(ErrLinkDown)
	}
}

func (s *session) noteReturn(r amqp.Return) {
	s.mu.Lock()
	if it, ok := s.byID[r.MessageId]; ok {
		it.returned = true
	}
	s.mu.Unlock()
}

func (s *session) settle(c amqp.Confirmation) {
	s.mu.Lock()
	it, ok := s.inflight[c.DeliveryTag]
	if ok {
		delete(s.inflight, c.DeliveryTag)
		if it.out.msgID != "" {
			delete(s.byID, it.out.msgID)
		}
	}
	s.mu.Unlock()
	if !ok {
		return
	}
	<-s.window
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

// watchBlocked follows the broker's connection.blocked notifications.
// Exits when the connection closes.
func (s *session) watchBlocked() {
	for bl := range s.blocked {
		s.mu.Lock()
		if !s.ended {
			if bl.Active {
				s.b.setState(StateBlocked, "broker resource alarm: "+bl.Reason)
			} else {
				s.b.setState(StateConnected, "")
			}
		}
		s.mu.Unlock()
	}
}

// consumerOwner owns the consume channel: acks, nacks, and the stage
// consumers (declared on a channel of its own, since a failed declaration
// closes its channel). Exits when the session ends or an ack fails.
func (s *session) consumerOwner() {
	decl, err := s.conn.Channel()
	if err != nil {
		s.fail(fmt.Errorf("open channel: %w", err))
		return
	}
	defer func() { _ = decl.Close() }()
	s.syncStages(&decl)
	for {
		select {
		case <-s.ctx.Done():
			return
		case a := <-s.ackQ:
			if err := s.settleAcks(a); err != nil {
				s.fail(fmt.Errorf("ack: %w", err))
				return
			}
		case <-s.b.stagesChanged:
			s.syncStages(&decl)
		case tag := <-s.cancels:
			stage, ok := strings.CutPrefix(tag, "cmd:")
			if !ok {
				s.fail(fmt.Errorf("the broker cancelled consumer %s", tag))
				return
			}
			s.b.log.Warn("the broker cancelled a stage consumer (queue deleted?); declaring it again", "stage", stage)
			s.stagesMu.Lock()
			delete(s.stages, stage)
			s.stagesMu.Unlock()
			s.syncStages(&decl)
		}
	}
}

// ackBook follows the settled deliveries of the consume channel. Only
// acked consumers use that channel, so its delivery tags are dense (1, 2,
// 3, ...), and a multiple ack up to a tag is safe when every tag below it
// is settled. Only the consumer owner touches it.
type ackBook struct {
	next    uint64          // lowest tag not known to be settled
	settled map[uint64]bool // settled tags above next
}

// settleAcks applies first and every other ack request already queued.
func (s *session) settleAcks(first ackReq) error {
	reqs := []ackReq{first}
	for more := true; more && len(reqs) < 4096; {
		select {
		case r := <-s.ackQ:
			reqs = append(reqs, r)
		default:
			more = false
		}
	}
	requeue, upTo, single := s.acks.plan(reqs)
	for _, tag := range requeue {
		if err := s.conCh.Nack(tag, false, true); err != nil {
			return err
		}
	}
	if upTo != 0 {
		if err := s.conCh.Ack(upTo, true); err != nil {
			return err
		}
	}
	for _, tag := range single {
		if err := s.conCh.Ack(tag, false); err != nil {
			return err
		}
	}
	return nil
}

// plan turns ack requests into broker calls: requeues one by one; acks
// that complete the run of settled tags from the oldest as one multiple ack
// up to upTo (0: none); the other acks one by one (never held back behind a
// slow delivery). It records them all as settled.
func (a *ackBook) plan(reqs []ackReq) (requeue []uint64, upTo uint64, single []uint64) {
	if a.settled == nil {
		a.next, a.settled = 1, map[uint64]bool{}
	}
	pending := map[uint64]bool{}
	for _, r := range reqs {
		switch {
		case r.tag < a.next || a.settled[r.tag]:
			// settled already: never twice (a second ack would close the channel)
		case r.op == opRequeue:
			requeue = append(requeue, r.tag)
			a.settled[r.tag] = true
		default:
			pending[r.tag] = true
		}
	}
	for a.settled[a.next] || pending[a.next] {
		if pending[a.next] {
			upTo = a.next
			delete(pending, a.next)
		}
		delete(a.settled, a.next)
		a.next++
	}
	for tag := range pending {
		single = append(single, tag)
		a.settled[tag] = true
	}
	slices.Sort(single)
	return requeue, upTo, single
}

// syncStages consumes the stages the node hosts and cancels the others.
func (s *session) syncStages(decl **amqp.Channel) {
	want := s.b.hostedStages()
	s.stagesMu.Lock()
	defer s.stagesMu.Unlock()
	for stage := range s.stages {
		if !want[stage] {
			if err := s.conCh.Cancel("cmd:"+stage, false); err != nil {
				s.fail(fmt.Errorf("cancel consumer of stage %s: %w", stage, err))
				return
			}
			delete(s.stages, stage)
			s.b.log.Debug("stage consumer cancelled", "stage", stage)
		}
	}
	for stage := range want {
		if s.stages[stage] {
			continue
		}
		if err := s.declareStage(decl, stage); err != nil {
			s.b.log.Error("cannot declare stage queue", "stage", stage, "err", err)
			continue
		}
		ds, err := s.conCh.Consume(stageQueue(stage), "cmd:"+stage, false, false, false, false, nil)
		if err != nil {
			s.fail(fmt.Errorf("consume %s: %w", stageQueue(stage), err))
			return
		}
		s.stages[stage] = true
		s.spawn(func() { s.readCommands(stage, ds) })
		s.b.log.Debug("stage consumer started", "stage", stage)
	}
}

// declareStage declares a stage's quorum queue and binds it. A queue that
// exists with other arguments is used as it is.
func (s *session) declareStage(decl **amqp.Channel, stage string) error {
	q := stageQueue(stage)
	args := amqp.Table{
		"x-queue-type":           "quorum",
		"x-delivery-limit":       int64(stageDeliveryLimit),
		"x-dead-letter-exchange": exchangeDLX,
	}
	_, err := (*decl).QueueDeclare(q, true, false, false, false, args)
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
		nc, cerr := s.conn.Channel()
		if cerr != nil {
			return cerr // *decl stays the closed channel, never nil
		}
		*decl = nc
		if _, err = (*decl).QueueDeclarePassive(q, true, false, false, false, nil); err == nil {
			s.b.log.Warn("stage queue exists with other arguments; using it as it is", "queue", q, "detail", ae.Reason)
		}
	}
	if err != nil {
		if (*decl).IsClosed() {
			if nc, cerr := s.conn.Channel(); cerr == nil {
				*decl = nc
			}
		}
		return err
	}
	return (*decl).QueueBind(q, commandKey(stage), exchangeMesh, false, nil)
}

// ack asks the consumer owner to ack or requeue a delivery. It gives up
// when the session ends (the broker requeues the delivery itself).
func (s *session) ack(tag uint64, op ackOp) {
	select {
	case s.ackQ <- ackReq{tag: tag, op: op}:
	case <-s.ctx.Done():
	}
}

// work runs f on a per-delivery worker goroutine; stop waits for it. f
// must return soon after the session's context is cancelled. After stop
// began, f is dropped.
func (s *session) work(f func()) {
	if !s.workers.add() {
		return
	}
	go func() {
		defer s.workers.done()
		f()
	}()
}

// after runs f after d, tracked like work (nil after stop began). Cancel
// it with cancelTimer.
func (s *session) after(d time.Duration, f func()) *time.Timer {
	if !s.workers.add() {
		return nil
	}
	return time.AfterFunc(d, func() {
		defer s.workers.done()
		f()
	})
}

// cancelTimer stops a timer from after; a timer that already fired is
// left to finish.
func (s *session) cancelTimer(t *time.Timer) {
	if t != nil && t.Stop() {
		s.workers.done()
	}
}

// tracker counts work in progress. Unlike a WaitGroup it may gain work
// while someone waits, and refuses new work once closed.
type tracker struct {
	mu     sync.Mutex
	n      int
	zero   chan struct{} // closed when n drops to 0 while closing
	closed bool
}

func (t *tracker) add() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.n++
	return true
}

func (t *tracker) done() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n--
	if t.n == 0 && t.zero != nil {
		close(t.zero)
		t.zero = nil
	}
}

// closeAndWait refuses new work and waits for the work in progress.
func (t *tracker) closeAndWait() {
	t.mu.Lock()
	t.closed = true
	if t.n == 0 {
		t.mu.Unlock()
		return
	}
	zero := make(chan struct{})
	t.zero = zero
	t.mu.Unlock()
	<-zero
}
