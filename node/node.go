package node

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// Node is one node's view of the mesh. Build it with New, feed it the
// discovery messages the bridge receives with HandleSystem, run it with
// Start, stop it with Close. Its methods are safe for concurrent use.
type Node struct {
	cfg    Config
	logger *slog.Logger
	m      *metrics

	// wakeLoop, wakeSend and wakeEffects have room for one value: a send
	// means "there is work" (for the loop: "a deadline may have moved
	// closer"), and a full channel already says so.
	wakeLoop    chan struct{}
	wakeSend    chan struct{}
	wakeEffects chan struct{}
	wg          sync.WaitGroup // the loop, sender and effects goroutines

	keys atomic.Pointer[map[string]ed25519.PublicKey] // SetSigningKeys; read without mu

	mu      sync.Mutex // guards everything below
	started bool
	// health is this node's summary (SetHealth); healthSent says every
	// peer has it (a broadcast carried it); healthPushedAt is when a
	// change of its state last sent a heartbeat.
	health         *Health
	healthSent     bool
	healthPushedAt time.Time
	closed         bool
	cancel         context.CancelFunc // stops the goroutines; nil before Start
	subs           []*nats.Subscription

	local      hostRecord // what local programs host (SetLocal)
	listening  []string   // the topic patterns local programs listen to (SetListening)
	prior      []string   // the previous run's, said too for a while (KeepListening)
	localKnown bool       // SetLocal was called at least once
	revision   int64
	peers      map[string]*peer
	expected   map[string]bool
	seq        uint64

	pending    []intent // messages to send, built when sent
	pendingSet map[intent]bool

	nextHeartbeat time.Time
	nextProbe     time.Time
	hbInterval    time.Duration // the heartbeat interval this node announces (heartbeat_ms)

	linkDown        bool      // the last broadcast publish failed
	waitLink        bool      // linkDown, and the link was not connected: nothing is sent until LinkUp
	linkUps         uint64    // LinkUp calls so far
	linkUpAt        time.Time // the last LinkUp (or Start): Listeners.Since
	linkRecoveredAt time.Time // when publishing worked again
	everSent        bool      // a publish succeeded once
	firstSent       time.Time // when a publish first succeeded

	warnedSkipped  map[string]bool // local subjects whose name cannot be advertised
	conflictWarned bool            // another process uses this node's name
	refusedLogged  map[string]bool // reason and sender of refused signed discovery, logged once

	gen     uint64 // bumped on every change the effects goroutine applies
	applied struct {
		gen    uint64
		routes map[string][]string
		gone   map[string]time.Time
		local  hostRecord
		set    bool // local was handed to OnLocalChange
		oldest int  // handed to OnPeerProtocols (0: not yet)
		// eventPeers and eventLegacy were handed to OnEventPeers
		// (eventSet: once).
		eventPeers  []string
		eventLegacy bool
		eventSet    bool
		listeners   *Listeners // handed to OnEventListeners (nil: not yet)
		// known was handed to OnKnownProtocols (knownSet: once).
		known    int
		knownSet bool
		settle   bool // a wake-up after PeerProtocolSettle is set
	}
}

// hostRecord is what one node hosts, and the events it listens to.
type hostRecord struct {
	caps   []string
	stages []string
	events []string
	hash   string
}

func (h hostRecord) equal(o hostRecord) bool {
	return slices.Equal(h.caps, o.caps) && slices.Equal(h.stages, o.stages) && slices.Equal(h.events, o.events)
}

// peer is the node's knowledge of one other node. Guarded by Node.mu.
type peer struct {
	name      string
	state     string // "" only transiently, while the record is created
	expected  bool
	since     time.Time
	lastSeen  time.Time
	reason    string
	version   string
	startedAt time.Time
	seq       uint64 // highest message sequence seen from this run
	revision  int64
	interval  time.Duration // the peer's heartbeat interval; 0: ours
	proto     int           // the highest protocol version the peer speaks (1 when it does not say)

	hasRecord bool
	record    hostRecord
	recordSeq uint64
	// heardOn is the node's linkUps + 1 when the peer's record last came
	// or was confirmed by a heartbeat's hash (0: not since it changed):
	// the record is current only on that connection (a change sent while
	// this node's link was down never reached it).
	heardOn uint64
	health  *Health // the peer's last health summary (nil: it sent none)

	warnedAbsent bool
}

// intent is a message to send: its type, addressee and, for a gone
// message, the peer it names. The body is built when it is sent, from the
// state at that moment. announce marks a ring probe: when the broker finds
// no route to its addressee, the node tells the mesh (a gone message);
// a probe that verifies someone else's gone message does not.
type intent struct {
	typ      string
	to       string
	peer     string
	announce bool
}

// New validates cfg and returns a node that is not yet started. It
// registers the node's metrics on cfg.Registerer.
func New(cfg Config) (*Node, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	n := &Node{
		cfg:           cfg,
		logger:        cfg.Logger.With("component", "node"),
		m:             newMetrics(),
		wakeLoop:      make(chan struct{}, 1),
		wakeSend:      make(chan struct{}, 1),
		wakeEffects:   make(chan struct{}, 1),
		peers:         make(map[string]*peer),
		expected:      nil, // until SetExpected: no node records (knownOldestLocked)
		pendingSet:    make(map[intent]bool),
		warnedSkipped: make(map[string]bool),
		refusedLogged: make(map[string]bool),
	}
	if err := n.m.register(cfg.Registerer); err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	return n, nil
}

// Start serves the NATS API, starts the node's goroutines and queues the
// hello and query messages, which carry what SetLocal said so far. It
// does not wait for the broker: discovery messages go out when the link
// can carry them.
func (n *Node) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	if n.started {
		return ErrStarted
	}
	n.linkUpAt = time.Now() // records are heard from now on
	if !n.localKnown {
		n.setLocalLocked(nil)
	}
	if n.cfg.Conn != nil {
		if err := n.serveAPILocked(); err != nil {
			return err
		}
	}
	n.started = true
	now := time.Now()
	n.hbInterval = n.cfg.HeartbeatInterval
	n.nextHeartbeat = now.Add(firstHeartbeat(n.hbInterval))
	n.nextProbe = now.Add(jittered(n.cfg.DiscoveryInterval))
	n.enqueueLocked(intent{typ: TypeHello}) // version 2 peers answer it with an info
	n.changedLocked()

	runCtx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.wg.Add(3)
	go n.loop(runCtx)    // exits when Close cancels runCtx
	go n.sender(runCtx)  // exits when Close cancels runCtx
	go n.effects(runCtx) // exits when Close cancels runCtx
	n.logger.Info("mesh discovery started", "capabilities", len(n.local.caps), "stages", len(n.local.stages))
	return nil
}

// Close stops the node: its goroutines end, the NATS API is withdrawn,
// the stand-ins are withdrawn and, if the node was started, a bye is
// published (bounded by a second). It is idempotent and safe before
// Start.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	started, cancel, subs := n.started, n.cancel, n.subs
	n.subs = nil
	n.mu.Unlock()

	var errs []error
	for _, s := range subs {
		if err := s.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) && !errors.Is(err, nats.ErrBadSubscription) {
			errs = append(errs, fmt.Errorf("unsubscribe %s: %w", s.Subject, err))
		}
	}
	if cancel != nil {
		cancel()
	}
	n.wg.Wait()
	if !started {
		return errors.Join(errs...)
	}
	if len(n.applied.routes) > 0 {
		n.cfg.Link.SetRoutes(map[string][]string{})
	}
	n.mu.Lock()
	body := n.buildLocked(intent{typ: TypeBye})
	n.mu.Unlock()
	ctx, cancelBye := context.WithTimeout(context.Background(), byeTimeout)
	defer cancelBye()
	if err := n.cfg.Link.PublishSystem(ctx, TypeBye, body); err != nil {
		n.m.errors.WithLabelValues("publish").Inc()
		n.logger.Info("could not say goodbye to the mesh; peers will notice the missed heartbeats", "err", err)
	} else {
		n.m.messages.WithLabelValues(TypeBye, "out").Inc()
	}
	n.logger.Info("mesh discovery stopped")
	return errors.Join(errs...)
}

// HandleSystem takes one discovery message the bridge received from the
// mesh: its routing key, body and the origin node the transport reports
// ("" when unknown). Invalid messages are dropped and counted. It never
// blocks on the network and may be called on a nil *Node (the message is
// dropped), before Start, and after Close (dropped).
func (n *Node) HandleSystem(key string, body []byte, origin string) {
	if n == nil {
		return
	}
	m, err := DecodeMessage(key, body, origin)
	if err != nil {
		var we *WireError
		reason := "malformed"
		if errors.As(err, &we) {
			reason = we.Reason
		}
		n.m.rejected.WithLabelValues(reason).Inc()
		n.logger.Debug("discovery message dropped", "key", clip(key), "origin", clip(origin), "reason", reason, "err", err)
		return
	}
	reason, verified := checkSignature(n.signingKeys(), m, body) // outside the lock: Ed25519 costs tens of µs
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	if reason != "" {
		n.refusedLocked(reason, m.Node, m.Type)
		return
	}
	n.handleLocked(m, verified)
}

// SetExpected replaces the names of the nodes the bindings say should
// exist. This node's own name is ignored. Invalid names are skipped and
// reported in the returned error; the valid ones are applied.
func (n *Node) SetExpected(names []string) error {
	var bad []string
	want := make(map[string]bool, len(names))
	for _, name := range names {
		switch {
		case !ValidNodeName(name):
			bad = append(bad, fmt.Sprintf("%.80q", name))
		case name != n.cfg.Name:
			want[name] = true
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	now := time.Now()
	for name := range n.expected {
		if want[name] {
			continue
		}
		if p := n.peers[name]; p != nil {
			p.expected = false
			if p.state == StateAbsent {
				delete(n.peers, name)
			}
		}
	}
	for name := range want {
		p := n.peers[name]
		if p == nil {
			p = &peer{name: name, state: StateAbsent, since: now}
			n.peers[name] = p
		}
		if !p.expected {
			p.expected = true
			p.warnedAbsent = false
			if p.state == StateAbsent {
				p.since = now // the grace before the warning starts now
			}
		}
	}
	n.expected = want
	n.changedLocked()
	if len(bad) > 0 {
		return fmt.Errorf("expected nodes: invalid names skipped: %v", bad)
	}
	return nil
}

// SetRevision sets the bindings revision the node advertises. A change
// brings the node's next heartbeat, which carries it, forward to within
// about a probe interval.
func (n *Node) SetRevision(rev int64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if rev == n.revision {
		return
	}
	n.revision = rev
	n.revisionHeartbeatLocked()
}

// Status returns the peers and capabilities as they are now.
func (n *Node) Status() Status {
	n.mu.Lock()
	defer n.mu.Unlock()
	return Status{Peers: n.peersLocked(), Capabilities: n.capabilitiesLocked()}
}

// Peers returns every peer in the view, sorted by name.
func (n *Node) Peers() []Peer {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.peersLocked()
}

// Capabilities returns what is hosted locally and by live peers.
func (n *Node) Capabilities() Capabilities {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.capabilitiesLocked()
}

// Routes returns the routes the node gives the bridge: every capability
// hosted by a live peer and not locally, with its hosts.
func (n *Node) Routes() map[string][]string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.routesLocked()
}

// --- NATS API ---

func (n *Node) serveAPILocked() error {
	handlers := map[string]func() any{
		SubjectPeers: func() any { return PeersReply{Node: n.cfg.Name, Peers: n.Peers()} },
		SubjectCaps:  func() any { return CapsReply{Node: n.cfg.Name, Capabilities: n.Capabilities()} },
	}
	for _, subj := range []string{SubjectPeers, SubjectCaps} {
		h := handlers[subj]
		sub, err := n.cfg.Conn.Subscribe(subj, func(msg *nats.Msg) {
			data, err := json.Marshal(h())
			if err != nil {
				n.logger.Error("encode API reply", "subject", msg.Subject, "err", err)
				return
			}
			if msg.Reply == "" || !strings.HasPrefix(msg.Reply, "_INBOX.") {
				return // answers go to inboxes only (the node's own connection may publish anywhere)
			}
			conn := n.cfg.Conn
			if n.cfg.Replies != nil {
				conn = n.cfg.Replies
			}
			_ = conn.Publish(msg.Reply, data) // the caller may be gone; nothing to do then
		})
		if err != nil {
			for _, s := range n.subs {
				_ = s.Unsubscribe()
			}
			n.subs = nil
			return fmt.Errorf("serve %s: %w", subj, err)
		}
		n.subs = append(n.subs, sub)
	}
	// In place at the server before Start returns: a program's request
	// right after finds the API rather than no responders.
	if err := n.cfg.Conn.FlushTimeout(5 * time.Second); err != nil {
		for _, s := range n.subs {
			_ = s.Unsubscribe()
		}
		n.subs = nil
		return fmt.Errorf("serve the node's API: %w", err)
	}
	return nil
}

// clip shortens a string off the wire for a log line.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
