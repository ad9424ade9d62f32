package bridge

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	brokerlink "github.com/meshbox/meshbox/bridge/link"

	"github.com/meshbox/meshbox/bridge/flow"

	"github.com/meshbox/meshbox/internal/seal"
	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
)

// session is one stay on the broker and everything that lives as long as
// it: two connections (publishing and consuming are kept apart, so a
// broker that blocks publishers under a resource alarm does not block this
// node's acks with them), the publish channels and their goroutines, the
// consume channels and their owner, one reader per consumer, per-delivery
// workers, the outbox drainer and the stall checker. A session is never
// reused: when any part fails the whole session ends and runLink opens a
// new one.
type session struct {
	b   *Bridge
	url string
	// user is the broker user of both connections: every publish carries
	// it as user_id. perNode: it is a node's own user (BrokerUser), so
	// every delivery must carry a node's user_id too (checkOrigin).
	user    string
	perNode bool
	// early: the publisher, the confirmer and the outbox's drainer started
	// during the setup (setup.go).
	early bool
	// handedOver: a handover replaced the session; stop leaves this
	// node's pending requests open for the next one.
	handedOver bool
	// requestsDone and repliesDone are closed when the reader of the
	// request or reply consumer exits (its consumer was cancelled or its
	// channel closed).
	requestsDone, repliesDone chan struct{}

	ctx    context.Context // cancelled by end: workers and goroutines stop
	cancel context.CancelFunc
	failed chan error // cap 1: the first fatal error of a part

	pub   *brokerlink.Publisher // the publishing connection and what is on its way (publish.go)
	con   consuming             // the consuming connection, its consumers and acks
	flows stageFlows            // the stages consumed in this session
	local localCalls            // calls and commands open at local programs

	sub submitting // the outbox drainer and the stages routed (submit.go)

	wg      sync.WaitGroup     // the session's goroutines
	workers brokerlink.Workers // goroutines and timers working on deliveries
}

// submitting is the session's part of the submissions (submit.go).
type submitting struct {
	// The outbox drainer: rescan (cap 1) starts it over from the oldest
	// record; drainWait counts drained records handed to the publisher
	// and not settled.
	rescan    chan struct{}
	drainWait sync.WaitGroup
	// routed are the stages whose commands the broker routed to a queue in
	// this session (stage → true): only those overflow into the outbox.
	routed sync.Map
}

// consuming is the session's consuming connection: the topology, the
// acked consumers on Ch (events, commands), the unacked ones on AutoCh
// (requests, replies, system messages), stage declarations and queue
// inspections. It never publishes. The acker and the consumer manager
// share Ch (consume.go): one settles, the other opens and cancels stage
// consumers.
type consuming struct {
	conn *amqp.Connection
	// Consuming are its channels, the node's own queues and the first
	// consumers, as the setup left them (link.SessionSetup).
	brokerlink.Consuming

	acker *brokerlink.Acker // settles the deliveries of ch (consume.go)
	// lagSpent (the event reader only): the bindings on which the event
	// reader waited bindingLag for a lagging event in vain; on them it
	// refuses the next at once, so that a member sending mis-scoped events
	// holds the event stream up once per change of the bindings, not once
	// per event.
	lagSpent *seal.ScopeState
	// heldForRotation counts the deliveries waiting for the bindings to
	// list their sender's generation (holdForRotation).
	heldForRotation atomic.Int32
}

// stageFlows are the command stages consumed in a session and their
// consumers (flow.go).
type stageFlows struct {
	mu       sync.Mutex
	stages   map[string]*flow.StageFlow // under mu; only the consumer manager writes
	aux      map[string]int             // under mu: the retry and dead-letter queues declared per stage (auxRetry, auxDead)
	byTag    map[string]*flow.StageFlow // consumer manager only: stage consumers by tag
	tagSeq   int                        // consumer manager only: for unique consumer tags
	qos      int                        // consumer manager only: the prefetch set for stage consumers (0: Prefetch, for events)
	rtt      atomic.Int64               // the link's round trip: the quickest synchronous call on con.Ch (ns; 0: none yet)
	wake     chan struct{}              // cap 1: a stage wants another credit
	drain    chan struct{}              // cap 1: the node stops; cancel every stage consumer (drainCommands)
	draining bool                       // consumer manager only: stage consumers cancelled for good
}

// localCalls are the requests from other nodes and the commands open at
// local programs, and the NATS inboxes their replies come back on
// (hostcalls.go, commands.go).
type localCalls struct {
	inbox    string               // NATS subject prefix of local hosts' replies
	cmdInbox string               // NATS subject prefix of command handlers' replies
	subs     []*nats.Subscription // on bc, for onHostReply and onCmdReply

	mu        sync.Mutex           // guards host, answering, cmds, order, ended
	host      map[string]*hostCall // requests from other nodes open at a local host
	answering int                  // calls taken from host whose reply is not handed to fastQ yet
	cmds      map[string]*cmdCall  // commands open at a local handler
	order     orderBook            // keyed commands (order.go)
	ended     bool                 // the session ended: no new entries in cmds
}

// The roles of a session's two connections (dial).
const (
	rolePublish = "publish"
	roleConsume = "consume"
)

// connect dials url twice (publishing and consuming connections) and
// declares the node's topology, all within ctx: a broker that stalls
// after accepting the connections fails the attempt when ctx ends. It
// returns a session that is set up but not started.
func (b *Bridge) connect(ctx context.Context, url string) (*session, error) {
	s, abort, err := b.dialSession(ctx, url)
	if err != nil {
		return nil, err
	}
	if err := s.prepare(ctx, abort); err != nil {
		return nil, err
	}
	return s, nil
}

// dialSession dials url twice (publishing and consuming connections) within ctx
// and returns a session that has its connections but no topology yet, and
// a func that closes both sockets at once. A broker that refuses the
// credential gives a *CredentialRefusedError.
func (b *Bridge) dialSession(ctx context.Context, url string) (*session, func(), error) {
	uri, err := amqp.ParseURI(url)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to broker: %w", err)
	}
	user := brokerlink.LoginUser(b.cfg.CertFile, b.cfg.KeyFile, url, uri) // the URL's, or a client certificate's
	_, _, perNode := ParseBrokerUser(user)
	c, err := brokerlink.DialPair(ctx, b.dialOptions(url, rolePublish), b.dialOptions(url, roleConsume), b.m.Dialed, closeLimit)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to broker: %w", b.refused(err, user))
	}
	s := &session{
		b: b, url: url, user: user, perNode: perNode,
		failed:       make(chan error, 1),
		requestsDone: make(chan struct{}),
		repliesDone:  make(chan struct{}),
		sub:          submitting{rescan: make(chan struct{}, 1)},
		con:          consuming{conn: c.Con, acker: brokerlink.NewAcker(c.ConCork)},
		flows: stageFlows{
			stages: map[string]*flow.StageFlow{},
			aux:    map[string]int{},
			byTag:  map[string]*flow.StageFlow{},
			wake:   make(chan struct{}, 1),
			drain:  make(chan struct{}, 1),
		},
		local: localCalls{host: map[string]*hostCall{}, cmds: map[string]*cmdCall{}},
	}
	s.pub = brokerlink.NewPublisher(c.Pub, c.PubCork, s.publisherHooks())
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, c.Abort, nil
}

// prepare declares the node's topology on an opened session within ctx.
// On failure the session's connections are closed.
func (s *session) prepare(ctx context.Context, abort func()) error {
	if s.b.testAfterDial != nil {
		s.b.testAfterDial()
	}
	// An AMQP call has no deadline of its own: when ctx ends first, the
	// sockets are closed under the setup, which then fails.
	stop := context.AfterFunc(ctx, abort)
	err := s.setup()
	if !stop() {
		err = fmt.Errorf("broker setup did not finish in time: %w", context.Cause(ctx))
	}
	if err != nil {
		s.cancel()
		s.closeConns()
		return err
	}
	return nil
}

// closeConns closes both connections, waiting at most closeLimit for the
// broker.
func (s *session) closeConns() {
	_ = s.con.conn.CloseDeadline(time.Now().Add(closeLimit))
	_ = s.pub.Conn.CloseDeadline(time.Now().Add(closeLimit))
}

// start runs the session's goroutines. Each exits when the session's
// context is cancelled or its AMQP channel closes; end and stop wait.
func (s *session) start() {
	s.local.inbox, s.local.cmdInbox = nats.NewInbox()+".", nats.NewInbox()+"."
	for subj, cb := range map[string]nats.MsgHandler{s.local.inbox + "*": s.onHostReply, s.local.cmdInbox + "*": s.onCmdReply} {
		sub, err := s.b.bc.Subscribe(subj, cb)
		if err != nil {
			s.fail(fmt.Errorf("subscribe to local replies: %w", err))
			continue
		}
		_ = sub.SetPendingLimits(1<<20, 256<<20)
		s.local.subs = append(s.local.subs, sub)
	}
	if !s.early { // else running since setup (setup.go)
		s.spawn(s.publisher)
		s.spawn(s.confirmer)
		s.spawn(s.drainer)
	}
	s.spawn(s.fastPublisher)
	s.spawn(s.fastReturned)
	s.spawn(s.watchBlocked)
	s.spawn(s.acker)
	s.spawn(s.consumerManager)
	s.spawn(func() {
		defer close(s.requestsDone)
		s.readRequests(s.con.Initial["requests"])
	})
	s.spawn(func() {
		defer close(s.repliesDone)
		s.readReplies(s.con.Initial["replies"])
	})
	s.spawn(func() { s.readEvents(s.con.Initial["events"]) })
	s.spawn(func() { s.readSystem(s.con.Initial["system"]) })
	s.spawn(s.stallChecker)
	s.spawn(func() { s.b.link.EventBinding().Run(s.con.conn, s.ctx.Done()) })
}

func (s *session) spawn(f func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
}

// run waits until the session must end and returns why (link.Link.Watch).
// retry (nil: never) asks it to look at the URL again, after a failed
// handover.
func (s *session) run(retry <-chan time.Time) string {
	return s.b.link.Watch(brokerlink.Watched{Quit: s.b.quit, URL: s.url, Retry: retry, Pub: s.pub,
		ConnClose: s.con.ConnClose, ChClose: s.con.ChClose, AutoClose: s.con.AutoClose, Failed: s.failed})
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
	s.pub.End()
}

// stop tears the session down and waits for all its goroutines. Messages
// handed to the publisher and not confirmed are settled with ErrLinkDown.
func (s *session) stop() {
	s.end()
	s.cancel()
	s.closeConns()
	s.wg.Wait()
	for _, sub := range s.local.subs {
		_ = sub.Unsubscribe()
	}
	s.endCalls()
	s.endCmds()
	s.workers.CloseAndWait()
	if !s.handedOver {
		s.b.failPendingOf(s)
	}
}

// work runs f on a per-delivery worker goroutine; stop waits for it
// (link.Workers.Go).
func (s *session) work(f func()) bool { return s.workers.Go(f) }

// after runs f after d, tracked like work (link.Workers.After).
func (s *session) after(d time.Duration, f func()) *time.Timer { return s.workers.After(d, f) }

// cancelTimer stops a timer from after (link.Workers.Cancel).
func (s *session) cancelTimer(t *time.Timer) { s.workers.Cancel(t) }
