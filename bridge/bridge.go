package bridge

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// Bridge carries a node's requests, commands and events between its
// embedded NATS server and the mesh's broker. Build it with New, run it
// with Start, stop it with Close. Its methods are safe for concurrent use.
type Bridge struct {
	cfg Config
	log *slog.Logger
	m   *metrics
	ids idGen

	nc *nats.Conn // handed in by the appliance: calls to work.<stage> handlers
	bc *nats.Conn // our own NoEcho connection: subscriptions, stand-ins, event republishing
	ob *outbox
	// obRef is ob for Status, which may run while Start is still working.
	obRef atomic.Pointer[outbox]

	bcClosed chan struct{} // closed when bc is closed

	mu      sync.Mutex // guards started, closed, subs
	started bool
	closed  bool
	subs    []*nats.Subscription

	quit      chan struct{} // closed by Close: every goroutine owned by the bridge exits
	closeOnce sync.Once
	closeErr  error
	wg        sync.WaitGroup // goroutines owned by the bridge
	calls     sync.WaitGroup // local calls for node.<self>.cap.<name>, each ends at its deadline

	// The link. url and the state are guarded by linkMu.
	linkMu     sync.Mutex
	url        string
	state      string
	since      time.Time
	reason     string
	history    []StateChange
	urlChanged chan struct{} // cap 1: SetURL wakes the link loop
	sess       atomic.Pointer[session]
	fatal      chan error // cap 1: the node name was refused for good

	// Submissions (commands and events). subMu orders them: each gets the
	// next seq and goes to the broker or to the outbox in that order.
	subMu       sync.Mutex
	seq         atomic.Uint64 // next record seq (dead letters and conversions take one without subMu)
	meshPending atomic.Int64  // mesh records in the outbox, not yet confirmed by the broker
	drainSignal chan struct{} // cap 1: new mesh records
	localSignal chan struct{} // cap 1: new local records

	// Routing and hosting (routeMu).
	routeMu       sync.RWMutex
	routes        map[string][]string  // capability -> nodes hosting it
	gone          map[string]time.Time // node -> since when discovery marks it gone
	rr            atomic.Uint64        // round robin among hosts
	hosted        map[string]bool      // stages hosted here
	localCaps     map[string]bool      // capabilities hosted by local programs
	standins      map[string]*nats.Subscription
	routesChanged chan struct{} // cap 1: routes or local capabilities changed
	stagesChanged chan struct{} // cap 1: the consumer owner of the session re-syncs

	// Requests waiting for a reply from another node (pendMu).
	pendMu  sync.Mutex
	pending map[string]*pendingRequest

	// Stalls (stallMu).
	stallMu   sync.Mutex
	stalls    map[string]*stallState
	submitted map[string]time.Time // stages this node sent commands to, and when last

	sysQ       chan sysMsg // system messages for Config.OnSystem
	deadCount  atomic.Uint64
	outboxFull atomic.Bool // for the one log line when the outbox fills up
}

// StateChange is one entry of the link's history.
type StateChange struct {
	State  string    `json:"state"`
	At     time.Time `json:"at"`
	Reason string    `json:"reason,omitempty"`
}

// Status is the bridge's part of the node status.
type Status struct {
	Broker BrokerStatus  `json:"broker"`
	Outbox OutboxStatus  `json:"outbox"`
	Stalls []StallStatus `json:"stalls"`
}

// BrokerStatus describes the broker link.
type BrokerStatus struct {
	State   string        `json:"state"`
	Since   time.Time     `json:"since"`
	URL     string        `json:"url"` // password redacted
	Reason  string        `json:"reason,omitempty"`
	History []StateChange `json:"history"`
}

// OutboxStatus describes the durable outbox.
type OutboxStatus struct {
	Depth            int64   `json:"depth"`
	Bytes            int64   `json:"bytes"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	MaxBytes         int64   `json:"max_bytes"`
	Warning          string  `json:"warning,omitempty"`
}

// StallStatus is a stalled command stage.
type StallStatus struct {
	Stage  string    `json:"stage"`
	Reason string    `json:"reason"`
	Since  time.Time `json:"since"`
}

const historyLen = 20

// startConnectLimit bounds the connection attempt Start makes; after it
// the node runs offline and the link loop keeps trying.
const startConnectLimit = 5 * time.Second

// New validates cfg and returns a bridge that is not yet started. nc is an
// in-process connection to the node's embedded NATS server, used to call
// local command handlers; it stays owned by the caller.
func New(cfg Config, nc *nats.Conn) (*Bridge, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	b := &Bridge{
		cfg:           cfg,
		log:           cfg.Logger.With("component", "bridge"),
		ids:           newIDGen(cfg.Node),
		nc:            nc,
		bcClosed:      make(chan struct{}),
		quit:          make(chan struct{}),
		url:           cfg.URL,
		state:         StateNone,
		since:         time.Now(),
		urlChanged:    make(chan struct{}, 1),
		fatal:         make(chan error, 1),
		drainSignal:   make(chan struct{}, 1),
		localSignal:   make(chan struct{}, 1),
		routes:        map[string][]string{},
		gone:          map[string]time.Time{},
		hosted:        map[string]bool{},
		localCaps:     map[string]bool{},
		standins:      map[string]*nats.Subscription{},
		routesChanged: make(chan struct{}, 1),
		stagesChanged: make(chan struct{}, 1),
		pending:       map[string]*pendingRequest{},
		stalls:        map[string]*stallState{},
		submitted:     map[string]time.Time{},
		sysQ:          make(chan sysMsg, 1024),
	}
	for c, n := range cfg.Routes {
		b.routes[c] = []string{n}
	}
	for _, s := range cfg.Stages {
		b.hosted[s] = true
	}
	b.m = newMetrics(b)
	b.m.setState(StateNone)
	return b, nil
}

// Start opens the outbox, subscribes on the local NATS server and, when a
// broker is configured, connects to it once before returning. A broker that
// is unreachable is not an error (the node runs offline and keeps trying);
// a broker that refuses this node's exclusive request consumer is: Start
// returns a *NodeNameInUseError. After an error, call Close.
func (b *Bridge) Start(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	if b.started {
		return errors.New("bridge already started")
	}
	b.started = true
	if err := b.m.register(b.cfg.Metrics); err != nil {
		return err
	}

	ob, err := openOutbox(b.cfg.OutboxPath, b.cfg.OutboxMaxBytes, b.log)
	if err != nil {
		return err
	}
	b.ob = ob
	b.obRef.Store(ob)
	b.seq.Store(ob.nextSeq())
	b.meshPending.Store(ob.meshAtOpen)
	ob.start(b.onOutboxCommit)

	bc, err := b.cfg.Dial(nats.NoEcho(), nats.Name("meshbox-bridge-"+b.cfg.Node),
		nats.ClosedHandler(func(*nats.Conn) { close(b.bcClosed) }),
		nats.ErrorHandler(b.onNATSError))
	if err != nil {
		return fmt.Errorf("bridge: connect to the local NATS server: %w", err)
	}
	b.bc = bc
	if err := b.subscribe(); err != nil {
		return err
	}
	b.reconcile() // stand-ins before the first session

	var first *session
	if url := b.currentURL(); url != "" {
		b.setState(StateConnecting, "")
		cctx, cancel := context.WithTimeout(ctx, startConnectLimit)
		first, err = b.connect(cctx, url)
		cancel()
		var inUse *NodeNameInUseError
		switch {
		case errors.As(err, &inUse):
			b.setState(StateOffline, inUse.Error())
			return err
		case err != nil:
			b.setState(StateOffline, err.Error())
		}
	}

	b.goOwned(func() { b.runLink(first) })
	b.goOwned(b.runReconciler)
	b.goOwned(b.runLocal)
	b.goOwned(b.runSystem)
	return nil
}

// goOwned runs f on a goroutine owned by the bridge: Close waits for it.
// f must return once b.quit is closed.
func (b *Bridge) goOwned(f func()) {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		f()
	}()
}

// subscribe takes the local subjects the bridge serves. A callback runs on
// the subscription's goroutine; it must not block for long.
func (b *Bridge) subscribe() error {
	for subj, cb := range map[string]nats.MsgHandler{
		subjCmdPrefix + ">":        b.onSubmitCommand,
		subjEvtPrefix + ">":        b.onSubmitEvent,
		subjNodePrefix + "*.cap.>": b.onNodeCapRequest,
	} {
		sub, err := b.bc.Subscribe(subj, cb)
		if err != nil {
			return fmt.Errorf("bridge: subscribe %s: %w", subj, err)
		}
		_ = sub.SetPendingLimits(1<<20, 256<<20)
		b.subs = append(b.subs, sub)
	}
	if err := b.bc.Flush(); err != nil {
		return fmt.Errorf("bridge: subscribe: %w", err)
	}
	return nil
}

// onNATSError counts asynchronous NATS errors (slow consumers).
func (b *Bridge) onNATSError(_ *nats.Conn, sub *nats.Subscription, err error) {
	b.m.err(errKindDropped)
	if sub != nil && errors.Is(err, nats.ErrSlowConsumer) {
		if n, _ := sub.Dropped(); n == 1 || n%1000 == 0 {
			b.log.Error("local messages dropped: the bridge is a slow consumer", "subject", sub.Subject, "dropped", n)
		}
	}
}

// Close stops the bridge: it ends the broker link (messages handed to the
// broker but not confirmed are kept in the outbox), answers waiting callers,
// flushes the outbox and closes it. It returns once every goroutine of the
// bridge is gone. It is safe to call more than once and after a failed or
// missing Start.
func (b *Bridge) Close() error {
	b.closeOnce.Do(func() {
		b.mu.Lock()
		b.closed = true
		b.mu.Unlock()
		close(b.quit)
		b.wg.Wait()
		b.failPending(&ServiceError{Code: CodeUnavailable, Text: "node " + b.cfg.Node + " is shutting down"})
		b.routeMu.Lock()
		for name, sub := range b.standins {
			_ = sub.Unsubscribe()
			delete(b.standins, name)
		}
		b.routeMu.Unlock()
		if b.bc != nil {
			if err := b.bc.Drain(); err == nil {
				select {
				case <-b.bcClosed:
				case <-time.After(5 * time.Second):
				}
			}
			b.bc.Close()
		}
		b.calls.Wait()
		var errs []error
		if b.ob != nil {
			if err := b.ob.close(); err != nil {
				errs = append(errs, fmt.Errorf("close outbox: %w", err))
			}
		}
		if b.m.reg != nil {
			b.m.unregister()
		}
		b.closeErr = errors.Join(errs...)
	})
	return b.closeErr
}

// Fatal yields an error when the bridge cannot go on: another process took
// this node's name on the broker and kept it for longer than a stale
// connection of ours could. The node should stop (exit non-zero).
func (b *Bridge) Fatal() <-chan error { return b.fatal }

// SetURL moves the bridge to another broker without a restart ("" means no
// broker). An invalid URL is refused with a *ConfigError.
func (b *Bridge) SetURL(url string) error {
	if err := checkBrokerURL(url); err != nil {
		return &ConfigError{Field: "URL", Msg: err.Error()}
	}
	b.linkMu.Lock()
	changed := b.url != url
	b.url = url
	b.linkMu.Unlock()
	if changed {
		b.log.Info("broker URL changed", "url", redactURL(url))
		signal(b.urlChanged)
	}
	return nil
}

func (b *Bridge) currentURL() string {
	b.linkMu.Lock()
	defer b.linkMu.Unlock()
	return b.url
}

// SetRoutes replaces the capability routing: capability -> nodes hosting
// it. Capabilities hosted by a local program are still answered locally.
func (b *Bridge) SetRoutes(routes map[string][]string) {
	m := make(map[string][]string, len(routes))
	for c, nodes := range routes {
		if !validName(c) {
			b.log.Warn("route ignored: invalid capability name", "capability", c)
			continue
		}
		var ok []string
		for _, n := range nodes {
			if validNodeName(n) && !slices.Contains(ok, n) {
				ok = append(ok, n)
			}
		}
		m[c] = ok
	}
	b.routeMu.Lock()
	b.routes = m
	b.routeMu.Unlock()
	signal(b.routesChanged)
}

// MarkGone records that discovery lost node (zero since: it is back). A
// request for a gone node fails at once with an error naming it.
func (b *Bridge) MarkGone(node string, since time.Time) {
	b.routeMu.Lock()
	defer b.routeMu.Unlock()
	if since.IsZero() {
		delete(b.gone, node)
		return
	}
	b.gone[node] = since
}

// Status reports the link, the outbox and the stalls.
func (b *Bridge) Status() Status {
	var st Status
	b.linkMu.Lock()
	st.Broker = BrokerStatus{State: b.state, Since: b.since, URL: redactURL(b.url), Reason: b.reason,
		History: append([]StateChange{}, b.history...)}
	b.linkMu.Unlock()
	st.Outbox.MaxBytes = b.cfg.OutboxMaxBytes
	if ob := b.obRef.Load(); ob != nil {
		st.Outbox.Depth, st.Outbox.Bytes = ob.counts()
		st.Outbox.Warning = ob.warning
		if t := ob.oldest(); !t.IsZero() {
			st.Outbox.OldestAgeSeconds = max(0, time.Since(t).Seconds())
		}
	}
	st.Stalls = b.stallList()
	return st
}

// setState records a link state change and logs it once.
func (b *Bridge) setState(state, reason string) {
	b.linkMu.Lock()
	if b.state == state {
		b.reason = reason
		b.linkMu.Unlock()
		return
	}
	now := time.Now()
	b.state, b.since, b.reason = state, now, reason
	b.history = append(b.history, StateChange{State: state, At: now, Reason: reason})
	if len(b.history) > historyLen {
		b.history = slices.Delete(b.history, 0, len(b.history)-historyLen)
	}
	url := redactURL(b.url)
	b.linkMu.Unlock()
	b.m.setState(state)
	switch {
	case state == StateConnected, state == StateConnecting, state == StateNone, reason == reasonShutdown:
		b.log.Info("broker link "+state, "url", url, "reason", reason)
	default:
		b.log.Warn("broker link "+state, "url", url, "reason", reason)
	}
}

func (b *Bridge) linkState() (string, time.Time) {
	b.linkMu.Lock()
	defer b.linkMu.Unlock()
	return b.state, b.since
}

// signal wakes whoever waits on c (cap 1) without blocking.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// idGen makes message and correlation ids: the node, a random boot id, a
// counter. Unique across restarts without coordination.
type idGen struct {
	prefix string
	n      *atomic.Uint64
}

func newIDGen(node string) idGen {
	var r [8]byte
	_, _ = rand.Read(r[:])
	return idGen{prefix: node + "-" + base32.HexEncoding.WithPadding(base32.NoPadding).EncodeToString(r[:]) + "-", n: new(atomic.Uint64)}
}

func (g idGen) next() string { return g.prefix + strconv.FormatUint(g.n.Add(1), 36) }

// reply answers a local program.
func (b *Bridge) reply(m *nats.Msg) {
	if m.Subject == "" {
		return
	}
	_ = b.bc.PublishMsg(m) // fails only when bc is closed: nobody to answer
}

// replyError answers a local program with a NATS micro style error.
func (b *Bridge) replyError(subject string, err error) {
	if subject == "" {
		return
	}
	m := nats.NewMsg(subject)
	m.Header.Set(headerServiceError, errorText(err))
	m.Header.Set(headerServiceErrorCode, strconv.Itoa(codeFor(err)))
	b.reply(m)
}

func errorText(err error) string {
	var se *ServiceError
	if errors.As(err, &se) {
		return se.Text
	}
	return err.Error()
}
