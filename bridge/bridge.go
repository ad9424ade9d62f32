package bridge

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	brokerlink "github.com/meshbox/meshbox/bridge/link"

	"github.com/meshbox/meshbox/bridge/completed"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/meshbox/meshbox/bridge/outbox"
	"github.com/meshbox/meshbox/internal/backoff"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats.go"
)

// Bridge carries a node's requests, commands and events between its
// embedded NATS server and the mesh's broker. Build it with New, run it
// with Start, stop it with Close. Its methods are safe for concurrent use.
//
// Its state is grouped by the part that owns it, each with its own lock:
// the lifecycle, the link (link.go), the submissions (submit.go), the
// requests and calls across sessions (reqs: requests.go, noroute.go,
// hostcalls.go), the commands across sessions (cmds: lease.go, seen.go,
// stalls.go, deadletters.go), the events accepted (replay.go), the peers'
// credentials (peers: credential.go, senders.go), the permissions learnt
// from the broker (learnt: topology.go), the refusals logged (seen), the
// outbox (package outbox), and routing and hosting (route: interest.go). A
// mutex guards only fields of its own struct.
type Bridge struct {
	cfg Config
	log *slog.Logger
	m   *metrics

	nc    *nats.Conn // handed in by the appliance: calls to work.<stage> handlers
	bc    *nats.Conn // our own NoEcho connection: subscriptions, stand-ins, event republishing
	files stores     // the node's files: the outbox and the completed ids

	quit chan struct{}  // closed by Close: every goroutine owned by the bridge exits
	wg   sync.WaitGroup // goroutines owned by the bridge
	life lifecycle      // started, closed, the local subscriptions

	link   *brokerLink       // the broker link: URL, state, history, session
	sub    submissions       // commands and events of local programs, in order
	reqs   requestBook       // requests and calls across sessions
	cmds   commandBook       // commands across sessions
	events codec.EventMemory // events accepted from the mesh, across sessions (replay.go)
	sysQ   chan sysMsg       // system messages for Config.OnSystem
	peers  peerBook          // what the node knows of other nodes: credentials, probes
	learnt brokerlink.Perms  // what the broker's refusals said of this node's permissions
	seen   refusalLogs       // causes of refusals already logged
	route  routing           // routing and hosting

	// testAfterDial, when set (by tests), runs once a session's connections
	// are open, before its setup.
	testAfterDial func()
}

// StateChange is one entry of the link's history.
type StateChange = brokerlink.StateChange

// Failover is one move of the link from one broker of its list to another.
type Failover = brokerlink.Failover

// Status is the bridge's part of the node status.
type Status struct {
	Broker BrokerStatus  `json:"broker"`
	Outbox OutboxStatus  `json:"outbox"`
	Stalls []StallStatus `json:"stalls"`
	// Commands are the commands in flight on this node (at most 200,
	// oldest first): at the local handler or waiting for a retry.
	Commands []CommandStatus `json:"commands"`
	// DeadLetters counts the dead letters of each stage hosted here (its
	// queue dead.<stage>), as last seen on the broker.
	DeadLetters map[string]int `json:"dead_letters"`
	// Warnings are the link's standing conditions an operator should
	// know about (WarnOlderPermissions, a stage served here that the
	// broker refuses this node).
	Warnings []string `json:"warnings,omitempty"`
}

// WarnOlderPermissions is the status warning of a node whose broker user
// has an older mesh's permissions (topology.go).
const WarnOlderPermissions = brokerlink.WarnOlderPermissions

// BrokerStatus describes the broker link (link.Status) and the command
// batches it carries now.
type BrokerStatus struct {
	LinkStatus
	BatchStatus
}

// LinkStatus is the link's part of BrokerStatus.
type LinkStatus = brokerlink.Status

// OutboxStatus describes the durable outbox.
type OutboxStatus struct {
	Depth            int64   `json:"depth"`
	Bytes            int64   `json:"bytes"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	MaxBytes         int64   `json:"max_bytes"`
	// HeldAnswers are submitters whose message the outbox holds and whose
	// answer waits for the broker to take some of a deep backlog.
	HeldAnswers int    `json:"held_answers,omitempty"`
	Warning     string `json:"warning,omitempty"`
}

// StallStatus is a stalled command stage.
type StallStatus struct {
	Stage  string    `json:"stage"`
	Reason string    `json:"reason"`
	Since  time.Time `json:"since"`
}

// New validates cfg and returns a bridge that is not yet started. nc is an
// in-process connection to the node's embedded NATS server, used to call
// local command handlers; it stays owned by the caller.
func New(cfg Config, nc *nats.Conn) (*Bridge, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.Dedupe = maps.Clone(cfg.Dedupe)
	b := &Bridge{
		cfg:  cfg,
		log:  cfg.Logger.With("component", "bridge"),
		nc:   nc,
		life: lifecycle{bcClosed: make(chan struct{})},
		quit: make(chan struct{}),
		link: newBrokerLink(cfg.URL, backoff.Policy{Min: cfg.ReconnectMin, Max: cfg.ReconnectMax}),
		sub:  newSubmissions(),
		reqs: requestBook{pending: pendingRequests{m: map[string]*pendingRequest{}}},
		cmds: commandBook{
			handed: codec.NewHandedOut(codec.HandedOutLen),
			stall:  stallBook{byStage: map[string]*stallState{}, submitted: map[string]time.Time{}, watch: make(chan struct{}, 1)},
		},
		route: routing{
			routes:        map[string][]string{},
			gone:          map[string]time.Time{},
			hosted:        map[string]bool{},
			localCaps:     map[string]bool{},
			standins:      map[string]*nats.Subscription{},
			changed:       make(chan struct{}, 1),
			stagesChanged: make(chan struct{}, 1),
			credits:       map[string]int{},
		},
		sysQ: make(chan sysMsg, 1024),
	}
	b.sub.parkAbove.Store(defaultParkAbove)
	for c, n := range cfg.Routes {
		b.route.routes[c] = []string{n}
	}
	for _, s := range cfg.Stages {
		b.route.hosted[s] = true
	}
	b.m = newMetrics(b)
	b.link.SetEvents(brokerlink.Events{Log: b.log, Metrics: b.m.Metrics, Perms: &b.learnt,
		Connected: b.cfg.OnConnected, OnCredential: b.cfg.OnCredential, URLOverride: b.cfg.URLOverride,
		NotConnected: b.releaseParked, // the outbox holds them: answered as when the link is down
	})
	b.m.SetState(StateNone)
	return b, nil
}

// Start opens the outbox, subscribes on the local NATS server and, when a
// broker is configured, connects to it once before returning. A broker that
// is unreachable is not an error (the node runs offline and keeps trying);
// a broker that refuses this node's exclusive request consumer is: Start
// returns a *NodeNameInUseError. After an error, call Close.
func (b *Bridge) Start(ctx context.Context) error {
	b.life.mu.Lock()
	defer b.life.mu.Unlock()
	if b.life.closed {
		return ErrClosed
	}
	if b.life.started {
		return errors.New("bridge already started")
	}
	b.life.started = true
	if err := b.m.register(b.cfg.Metrics); err != nil {
		return err
	}
	b.openEventBindings()
	ob, err := outbox.Open(b.cfg.OutboxPath, b.outboxOptions())
	if err != nil {
		return err
	}
	b.files.ob = ob
	b.files.obRef.Store(ob)
	b.sub.seq.Store(ob.NextSeq())
	b.sub.meshPending.Store(ob.MeshAtOpen())
	if len(b.cfg.Dedupe) > 0 {
		if b.files.done, err = completed.Open(b.cfg.CompletedPath); err != nil {
			return fmt.Errorf("bridge: %w", err)
		}
		b.goOwned(b.runPruner)
	}

	bc, err := b.cfg.Dial(nats.NoEcho(), nats.Name("meshbox-bridge-"+b.cfg.Node),
		nats.ClosedHandler(func(*nats.Conn) { close(b.life.bcClosed) }),
		nats.ErrorHandler(b.onNATSError))
	if err != nil {
		return fmt.Errorf("bridge: connect to the local NATS server: %w", err)
	}
	b.route.mu.Lock() // SetLocalInterest may run already: it reads bc under route.mu
	b.bc = bc
	b.route.mu.Unlock()
	if err := b.subscribe(); err != nil {
		return err
	}
	b.reconcile() // stand-ins before the first session

	var first *session
	if url := b.link.Target(); url != "" {
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
			b.link.Advance() // the link loop tries the next broker of the list
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
		codec.SubjCmdPrefix + ">":        b.onSubmitCommand,
		codec.SubjEvtPrefix + ">":        b.onSubmitEvent,
		codec.SubjNodePrefix + "*.cap.>": b.onNodeCapRequest,
	} {
		sub, err := b.bc.Subscribe(subj, cb)
		if err != nil {
			return fmt.Errorf("bridge: subscribe %s: %w", subj, err)
		}
		_ = sub.SetPendingLimits(1<<20, 256<<20)
		b.life.subs = append(b.life.subs, sub)
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
	b.life.closeOnce.Do(func() {
		b.life.mu.Lock()
		b.life.closed = true
		b.life.mu.Unlock()
		close(b.quit)
		b.wg.Wait()
		b.failPending(&ServiceError{Code: CodeUnavailable, Text: "node " + b.cfg.Node + " is shutting down"})
		b.route.mu.Lock()
		for name, sub := range b.route.standins {
			_ = sub.Unsubscribe()
			delete(b.route.standins, name)
		}
		b.route.mu.Unlock()
		if b.bc != nil {
			if err := b.bc.Drain(); err == nil {
				select {
				case <-b.life.bcClosed:
				case <-time.After(5 * time.Second):
				}
			}
			b.bc.Close()
		}
		b.reqs.local.Wait()
		var errs []error
		if b.files.ob != nil {
			if err := b.files.ob.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close outbox: %w", err))
			}
		}
		if b.files.done != nil {
			if err := b.files.done.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close completed ids: %w", err))
			}
		}
		if b.m.reg.to != nil {
			b.m.unregister()
		}
		b.life.closeErr = errors.Join(errs...)
	})
	return b.life.closeErr
}

// FinishCommands stops taking commands from the broker and waits, at most
// a second, until the commands at the local handlers are settled. A node
// that stops calls it before it stops the programs that handle them, so
// that what they finish is acked instead of delivered again; Close does
// it as well. Only Close undoes it.
func (b *Bridge) FinishCommands() {
	if s := b.link.sess.Load(); s != nil {
		s.drainCommands(closeLimit)
	}
}

// Fatal yields an error when the bridge cannot go on: another process took
// this node's name on the broker and kept it for longer than a stale
// connection of ours could. The node should stop (exit non-zero).
func (b *Bridge) Fatal() <-chan error { return b.link.Fatal() }

// SetURL moves the bridge to another broker without a restart ("" means no
// broker); url may list several, like Config.URL. A list that still names
// the broker in use keeps the link on it. An invalid URL is refused with a
// *ConfigError.
func (b *Bridge) SetURL(url string) error {
	if err := brokerlink.CheckURL(url, b.cfg.Node); err != nil {
		return &ConfigError{Field: "URL", Msg: err.Error()}
	}
	if b.link.SetURL(url) { // wakes the link loop
		b.log.Info("broker URL changed", "url", redactURL(url))
	}
	return nil
}

// SetRoutes replaces the capability routing: capability -> nodes hosting
// it. Capabilities hosted by a local program are still answered locally.
func (b *Bridge) SetRoutes(routes map[string][]string) {
	m := make(map[string][]string, len(routes))
	for c, nodes := range routes {
		if !codec.ValidName(c) {
			b.log.Warn("route ignored: invalid capability name", "capability", c)
			continue
		}
		var ok []string
		for _, n := range nodes {
			if codec.ValidNodeName(n) && !slices.Contains(ok, n) {
				ok = append(ok, n)
			}
		}
		m[c] = ok
	}
	b.route.mu.Lock()
	b.route.routes = m
	b.route.mu.Unlock()
	signal(b.route.changed)
}

// MarkGone records that discovery lost node (zero since: it is back). A
// request for a gone node fails at once with an error naming it.
func (b *Bridge) MarkGone(node string, since time.Time) {
	b.route.mu.Lock()
	defer b.route.mu.Unlock()
	if since.IsZero() {
		delete(b.route.gone, node)
		return
	}
	b.route.gone[node] = since
}

// Status reports the link, the outbox and the stalls.
func (b *Bridge) Status() Status {
	var st Status
	st.Broker = BrokerStatus{LinkStatus: b.link.Status(), BatchStatus: BatchStatus{CommandBatch: b.batchMax()}}
	st.Outbox = b.outboxStatus()
	st.Stalls = b.stallList()
	st.Commands = []CommandStatus{}
	now := time.Now()
	if s := b.link.sess.Load(); s != nil {
		st.Commands = s.commandsInFlight(now)
	}
	if local := b.localCommandsInFlight(now); len(local) > 0 {
		st.Commands = append(st.Commands, local...)
		slices.SortFunc(st.Commands, func(a, b CommandStatus) int { return cmp.Compare(b.AgeSeconds, a.AgeSeconds) })
		if len(st.Commands) > maxCommandsListed {
			st.Commands = st.Commands[:maxCommandsListed]
		}
	}
	st.DeadLetters = b.deadCounts()
	if b.learnt.Older.Load() {
		st.Warnings = append(st.Warnings, WarnOlderPermissions)
	}
	st.Warnings = append(st.Warnings, b.refusedStages()...)
	return st
}

// Connected reports whether the link is connected to the broker now: not
// connecting, blocked by a resource alarm, or without a broker. Cheaper
// than Status: it reads the link's state alone.
func (b *Bridge) Connected() bool {
	st, _ := b.link.Current()
	return st == StateConnected
}

// outboxStatus is the outbox part of Status (the outbox gauges read it).
func (b *Bridge) outboxStatus() OutboxStatus {
	st := OutboxStatus{MaxBytes: b.cfg.OutboxMaxBytes}
	b.sub.parkMu.Lock()
	st.HeldAnswers = len(b.sub.parked)
	b.sub.parkMu.Unlock()
	if ob := b.files.obRef.Load(); ob != nil {
		st.Depth, st.Bytes = ob.Counts()
		st.Warning = ob.Warning()
		if t := ob.Oldest(); !t.IsZero() {
			st.OldestAgeSeconds = max(0, time.Since(t).Seconds())
		}
	}
	return st
}

// signal wakes whoever waits on c (cap 1) without blocking.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// newID returns a fresh message, correlation or call id: 128 bits from
// crypto/rand, in base32 (26 characters). It says nothing about the node,
// its start or the ids before it, so no one can guess the correlation id
// of another node's request from what they have seen.
func newID() string { return rand.Text() }

// reply answers a local program.
func (b *Bridge) reply(m *nats.Msg) {
	if m.Subject == "" {
		return
	}
	conn := b.bc
	if b.cfg.Replies != nil {
		conn = b.cfg.Replies
	}
	_ = conn.PublishMsg(m) // fails only when the connection is closed: nobody to answer
}

// replyError answers a local program with a NATS micro style error.
func (b *Bridge) replyError(subject string, err error) {
	if subject == "" {
		return
	}
	m := nats.NewMsg(subject)
	wire.SetError(m.Header, codeFor(err), errorText(err))
	b.reply(m)
}

func errorText(err error) string {
	var se *ServiceError
	if errors.As(err, &se) {
		return se.Text
	}
	return err.Error()
}
