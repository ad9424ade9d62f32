package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
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

	mu      sync.Mutex // guards everything below
	started bool
	closed  bool
	cancel  context.CancelFunc // stops the goroutines; nil before Start
	subs    []*nats.Subscription

	local      hostRecord // what local programs host (SetLocal)
	localKnown bool       // SetLocal was called at least once
	revision   int64
	peers      map[string]*peer
	expected   map[string]bool
	seq        uint64

	pending    []intent // messages to send, built when sent
	pendingSet map[intent]bool

	nextHeartbeat time.Time
	nextQuery     time.Time

	linkDown        bool      // the last broadcast publish failed
	linkRecoveredAt time.Time // when publishing worked again
	everSent        bool      // a publish succeeded once

	warnedSkipped  map[string]bool // local subjects whose name cannot be advertised
	conflictWarned bool            // another process uses this node's name

	gen     uint64 // bumped on every change the effects goroutine applies
	applied struct {
		gen    uint64
		routes map[string][]string
		gone   map[string]time.Time
		local  hostRecord
		set    bool // local was handed to OnLocalChange
	}
}

// hostRecord is what one node hosts.
type hostRecord struct {
	caps   []string
	stages []string
	hash   string
}

func (h hostRecord) equal(o hostRecord) bool {
	return slices.Equal(h.caps, o.caps) && slices.Equal(h.stages, o.stages)
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

	hasRecord bool
	record    hostRecord
	recordSeq uint64

	warnedAbsent bool
}

// intent is a message to send: its type and addressee. The body is built
// when it is sent, from the state at that moment.
type intent struct {
	typ string
	to  string
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
		expected:      make(map[string]bool),
		pendingSet:    make(map[intent]bool),
		warnedSkipped: make(map[string]bool),
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
	n.nextHeartbeat = now.Add(n.cfg.HeartbeatInterval)
	n.nextQuery = now.Add(n.cfg.DiscoveryInterval)
	n.enqueueLocked(intent{typ: TypeHello})
	n.enqueueLocked(intent{typ: TypeQuery})
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
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	n.handleLocked(m)
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

// SetRevision sets the bindings revision the node advertises.
func (n *Node) SetRevision(rev int64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.revision = rev
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

// --- message handling; n.mu is held in every *Locked method ---

func (n *Node) handleLocked(m *Message) {
	now := time.Now()
	if m.Node == n.cfg.Name {
		if m.StartedAt.Equal(n.cfg.StartedAt) {
			return // our own broadcast, back from the mesh exchange
		}
		n.m.rejected.WithLabelValues("name_conflict").Inc()
		if !n.conflictWarned {
			n.conflictWarned = true
			n.logger.Warn("another process announces itself with this node's name", "its_started_at", m.StartedAt)
		}
		return
	}
	if m.Type == TypeQuery && m.To != "" && m.To != n.cfg.Name {
		return // a question for another node; an info for another is still a true record
	}
	p := n.peers[m.Node]
	if p == nil {
		if len(n.peers) >= maxPeers {
			n.m.rejected.WithLabelValues("too_many_peers").Inc()
			n.logger.Debug("discovery message dropped: too many peers", "node", m.Node, "limit", maxPeers)
			return
		}
		p = &peer{name: m.Node}
		n.peers[m.Node] = p
	}
	restarted := false
	if !p.startedAt.IsZero() && !m.StartedAt.Equal(p.startedAt) {
		if m.StartedAt.Before(p.startedAt) {
			n.m.rejected.WithLabelValues("stale").Inc()
			return // a late message from an earlier run of the peer
		}
		restarted = true
		p.seq, p.recordSeq, p.hasRecord, p.record = 0, 0, false, hostRecord{}
	} else if p.state == StateGone && p.reason == reasonLeft {
		n.m.rejected.WithLabelValues("stale").Inc()
		return // this run of the peer said bye; anything later from it is late
	}
	n.m.messages.WithLabelValues(m.Type, "in").Inc()

	p.lastSeen = now
	p.startedAt = m.StartedAt
	p.seq = max(p.seq, m.Seq)
	if m.Version != "" {
		p.version = m.Version
	}
	if m.Type != TypeQuery && m.Type != TypeBye {
		p.revision = m.Revision
	}
	if m.HeartbeatMS > 0 {
		if iv := time.Duration(m.HeartbeatMS) * time.Millisecond; iv != p.interval {
			p.interval = iv
			n.wakeLoopLocked() // a shorter window ends sooner
		}
	}

	switch m.Type {
	case TypeBye:
		if p.state != StateGone {
			n.setGoneLocked(p, now, reasonLeft)
		}
		return
	case TypeHello, TypeInfo, TypeUpdate:
		if !p.hasRecord || m.Seq >= p.recordSeq {
			rec := hostRecord{caps: m.Capabilities, stages: m.Stages, hash: m.Hash}
			if !p.hasRecord || !rec.equal(p.record) {
				if p.hasRecord && p.state == StateUp {
					n.logger.Debug("peer's capabilities changed", "peer", p.name, "capabilities", len(rec.caps), "stages", len(rec.stages))
				}
				n.changedLocked()
			}
			p.record, p.hasRecord, p.recordSeq = rec, true, m.Seq
		}
	case TypeHeartbeat:
		if !p.hasRecord || m.Hash != p.record.hash {
			n.enqueueLocked(intent{typ: TypeQuery, to: p.name})
		}
	case TypeQuery:
		n.enqueueLocked(intent{typ: TypeInfo, to: p.name})
		if !p.hasRecord {
			n.enqueueLocked(intent{typ: TypeQuery, to: p.name})
		}
	}
	switch {
	case p.state != StateUp:
		n.setUpLocked(p, now)
	case restarted:
		p.since = now
		n.logger.Info("peer restarted", "peer", p.name, "version", p.version, "started_at", p.startedAt)
		n.changedLocked()
	}
}

const reasonLeft = "left"

func (n *Node) setUpLocked(p *peer, now time.Time) {
	prev := p.state
	p.state, p.since, p.reason = StateUp, now, ""
	msg := "peer up"
	switch prev {
	case StateGone:
		msg = "peer is back"
	case StateAbsent:
		msg = "expected peer appeared"
	}
	n.logger.Info(msg, "peer", p.name, "version", p.version, "started_at", p.startedAt)
	n.changedLocked()
}

func (n *Node) setGoneLocked(p *peer, now time.Time, reason string) {
	p.state, p.since, p.reason = StateGone, now, reason
	if reason == reasonLeft {
		n.logger.Info("peer left the mesh", "peer", p.name)
	} else {
		n.logger.Warn("peer gone", "peer", p.name, "reason", reason, "last_seen", p.lastSeen)
	}
	n.changedLocked()
}

// changedLocked wakes the effects goroutine: routes, gone marks, local
// record or metrics may have changed. It wakes the loop too: a new peer,
// or one that changed state, may have a deadline before the loop's.
func (n *Node) changedLocked() {
	n.gen++
	select {
	case n.wakeEffects <- struct{}{}:
	default:
	}
	n.wakeLoopLocked()
}

// wakeLoopLocked makes the loop recompute its next deadline.
func (n *Node) wakeLoopLocked() {
	select {
	case n.wakeLoop <- struct{}{}:
	default:
	}
}

func (n *Node) enqueueLocked(it intent) {
	if n.pendingSet[it] {
		return
	}
	n.pendingSet[it] = true
	n.pending = append(n.pending, it)
	select {
	case n.wakeSend <- struct{}{}:
	default:
	}
}

// setLocalLocked takes what local programs subscribe to now and reports
// whether the local record changed.
func (n *Node) setLocalLocked(subjects []string) bool {
	caps, stages, skipped := localNames(subjects)
	for _, s := range skipped {
		if !n.warnedSkipped[s] && len(n.warnedSkipped) < 1000 {
			n.warnedSkipped[s] = true
			n.logger.Warn("local subscription not advertised: not a valid capability or stage name (dot-separated letters, digits, '-', '_'; at most 128)", "subject", clip(s))
		}
	}
	rec := hostRecord{caps: caps, stages: stages, hash: HostHash(caps, stages)}
	if n.localKnown && rec.equal(n.local) {
		return false
	}
	if n.localKnown {
		n.logger.Info("local capabilities changed",
			"added", added(n.local.caps, caps), "removed", added(caps, n.local.caps),
			"stages_added", added(n.local.stages, stages), "stages_removed", added(stages, n.local.stages))
	}
	n.local, n.localKnown = rec, true
	n.changedLocked()
	return true
}

// added returns the names in b that are not in a (both sorted).
func added(a, b []string) []string {
	var out []string
	for _, s := range b {
		if _, found := slices.BinarySearch(a, s); !found {
			out = append(out, s)
		}
	}
	return out
}

// buildLocked builds the message for it, with the next sequence number.
func (n *Node) buildLocked(it intent) []byte {
	n.seq++
	m := Message{
		V:         ProtocolVersion,
		Type:      it.typ,
		Node:      n.cfg.Name,
		To:        it.to,
		StartedAt: n.cfg.StartedAt,
		Seq:       n.seq,
	}
	switch it.typ {
	case TypeHello, TypeInfo, TypeUpdate:
		m.Version, m.Revision = n.cfg.Version, n.revision
		m.Capabilities, m.Stages, m.Hash = n.local.caps, n.local.stages, n.local.hash
		m.HeartbeatMS = n.cfg.HeartbeatInterval.Milliseconds()
	case TypeHeartbeat:
		m.Version, m.Revision, m.Hash = n.cfg.Version, n.revision, n.local.hash
		m.HeartbeatMS = n.cfg.HeartbeatInterval.Milliseconds()
	}
	body, err := EncodeMessage(&m)
	if err != nil {
		panic("node: encode discovery message: " + err.Error()) // only strings, ints and times: cannot fail
	}
	return body
}

// --- the views handed out ---

func (n *Node) peersLocked() []Peer {
	out := make([]Peer, 0, len(n.peers))
	for _, p := range n.peers {
		pp := Peer{
			Name:         p.name,
			State:        p.state,
			Expected:     p.expected,
			Since:        p.since.UTC(),
			LastSeen:     p.lastSeen.UTC(),
			Reason:       p.reason,
			Version:      p.version,
			StartedAt:    p.startedAt,
			Revision:     p.revision,
			Capabilities: slices.Clone(p.record.caps),
			Stages:       slices.Clone(p.record.stages),
		}
		if pp.Capabilities == nil {
			pp.Capabilities = []string{}
		}
		if pp.Stages == nil {
			pp.Stages = []string{}
		}
		out = append(out, pp)
	}
	slices.SortFunc(out, func(a, b Peer) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

func (n *Node) capabilitiesLocked() Capabilities {
	c := Capabilities{
		Local:        slices.Clone(n.local.caps),
		LocalStages:  slices.Clone(n.local.stages),
		Remote:       map[string][]string{},
		RemoteStages: map[string][]string{},
	}
	if c.Local == nil {
		c.Local = []string{}
	}
	if c.LocalStages == nil {
		c.LocalStages = []string{}
	}
	for _, p := range n.livePeersLocked() {
		for _, name := range p.record.caps {
			c.Remote[name] = append(c.Remote[name], p.name)
		}
		for _, name := range p.record.stages {
			c.RemoteStages[name] = append(c.RemoteStages[name], p.name)
		}
	}
	return c
}

// routesLocked is what SetRoutes gets: remote hosts of every capability
// that is not hosted locally.
func (n *Node) routesLocked() map[string][]string {
	routes := map[string][]string{}
	for _, p := range n.livePeersLocked() {
		for _, name := range p.record.caps {
			if _, local := slices.BinarySearch(n.local.caps, name); !local {
				routes[name] = append(routes[name], p.name)
			}
		}
	}
	return routes
}

// livePeersLocked returns the up peers whose record is known, by name.
func (n *Node) livePeersLocked() []*peer {
	var out []*peer
	for _, p := range n.peers {
		if p.state == StateUp && p.hasRecord {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b *peer) int {
		switch {
		case a.name < b.name:
			return -1
		case a.name > b.name:
			return 1
		}
		return 0
	})
	return out
}

// goneLocked returns the gone peers with the time they were last seen.
func (n *Node) goneLocked() map[string]time.Time {
	gone := map[string]time.Time{}
	for _, p := range n.peers {
		if p.state == StateGone {
			gone[p.name] = p.lastSeen
			if p.lastSeen.IsZero() {
				gone[p.name] = p.since
			}
		}
	}
	return gone
}

// --- goroutines ---

// loop sends heartbeats and queries when they are due and expires silent
// peers. Between rounds it sleeps until the next deadline (see tick), or
// until a change of the view may have brought one closer (wakeLoop), so an
// idle node wakes only for its heartbeats. It exits when ctx is done.
func (n *Node) loop(ctx context.Context) {
	defer n.wg.Done()
	t := time.NewTimer(n.tick())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-n.wakeLoop:
		}
		t.Reset(n.tick())
	}
}

// tick is one round of the loop. It returns how long the loop may sleep
// before the next thing is due.
func (n *Node) tick() time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := time.Now()
	n.expireLocked(now)
	if !now.Before(n.nextHeartbeat) {
		n.enqueueLocked(intent{typ: TypeHeartbeat})
		n.nextHeartbeat = now.Add(n.cfg.HeartbeatInterval)
	}
	if !now.Before(n.nextQuery) {
		n.enqueueLocked(intent{typ: TypeQuery})
		n.nextQuery = now.Add(n.cfg.DiscoveryInterval)
	}
	return max(n.nextDeadlineLocked().Sub(now), 0)
}

// nextDeadlineLocked is the earliest moment the loop has something to do:
// a heartbeat, a query, a peer's
// window running out, a gone peer's retention ending, or the grace of an
// expected peer that has not appeared. The expiry checks are strict (a
// peer is gone once its silence is longer than the window), so their
// deadlines lie just past the limit.
func (n *Node) nextDeadlineLocked() time.Time {
	next := n.nextHeartbeat
	consider := func(t time.Time) {
		if t.Before(next) {
			next = t
		}
	}
	consider(n.nextQuery)
	for _, p := range n.peers {
		switch p.state {
		case StateUp:
			if !n.linkDown {
				consider(n.silenceBaseLocked(p).Add(n.windowLocked(p) + 1))
			}
		case StateGone:
			if !p.expected {
				consider(p.since.Add(n.cfg.GoneRetention + 1))
			}
		case StateAbsent:
			if !p.warnedAbsent {
				consider(p.since.Add(n.absentGrace() + 1))
			}
		}
	}
	return next
}

// windowLocked is how long peer p may stay silent before it is gone.
func (n *Node) windowLocked(p *peer) time.Duration {
	iv := p.interval
	if iv == 0 {
		iv = n.cfg.HeartbeatInterval
	}
	return time.Duration(n.cfg.MissedHeartbeats) * iv
}

// silenceBaseLocked is when p's current silence began: its last message,
// or the moment this node could publish again if that is later.
func (n *Node) silenceBaseLocked(p *peer) time.Time {
	if n.linkRecoveredAt.After(p.lastSeen) {
		return n.linkRecoveredAt
	}
	return p.lastSeen
}

// absentGrace is how long an expected peer may stay unseen before the
// node warns about it.
func (n *Node) absentGrace() time.Duration {
	return time.Duration(n.cfg.MissedHeartbeats) * n.cfg.HeartbeatInterval
}

// expireLocked marks silent peers gone, forgets old gone peers and warns
// once about each expected peer that has not appeared. Silence is not
// held against peers while this node cannot publish: then the broker is
// away for this node too, and the peers get a fresh window once it is
// back.
func (n *Node) expireLocked(now time.Time) {
	for name, p := range n.peers {
		switch p.state {
		case StateUp:
			if n.linkDown {
				continue
			}
			if now.Sub(n.silenceBaseLocked(p)) > n.windowLocked(p) {
				n.setGoneLocked(p, now, fmt.Sprintf("missed %d heartbeats", n.cfg.MissedHeartbeats))
			}
		case StateGone:
			if !p.expected && now.Sub(p.since) > n.cfg.GoneRetention {
				delete(n.peers, name)
				n.changedLocked()
			}
		case StateAbsent:
			if !p.warnedAbsent && now.Sub(p.since) > n.absentGrace() {
				p.warnedAbsent = true
				n.logger.Warn("expected peer has not appeared", "peer", p.name, "expected_since", p.since)
			}
		}
	}
}

// sender publishes the queued messages one at a time. It exits when ctx
// is done.
func (n *Node) sender(ctx context.Context) {
	defer n.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.wakeSend:
		}
		for ctx.Err() == nil {
			n.mu.Lock()
			if len(n.pending) == 0 {
				n.mu.Unlock()
				break
			}
			it := n.pending[0]
			n.pending = n.pending[1:]
			delete(n.pendingSet, it)
			body := n.buildLocked(it)
			n.mu.Unlock()

			pctx, cancel := context.WithTimeout(ctx, n.cfg.PublishTimeout)
			var err error
			if it.to == "" {
				err = n.cfg.Link.PublishSystem(pctx, it.typ, body)
			} else {
				err = n.cfg.Link.SendSystem(pctx, it.to, it.typ, body)
			}
			cancel()
			n.published(ctx, it, err)
		}
	}
}

// published records the outcome of one publish. The link is judged by
// broadcasts only: an addressed message may fail for its addressee.
func (n *Node) published(ctx context.Context, it intent, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err != nil {
		if ctx.Err() != nil {
			return // closing
		}
		n.m.errors.WithLabelValues("publish").Inc()
		if it.to == "" && !n.linkDown {
			n.linkDown = true
			if n.everSent {
				n.logger.Warn("cannot send discovery messages; peers are not expired while this lasts", "type", it.typ, "err", err)
			} else {
				n.logger.Info("discovery waits for the broker link", "err", err)
			}
		} else {
			n.logger.Debug("discovery message not sent", "type", it.typ, "to", it.to, "err", err)
		}
		return
	}
	n.m.messages.WithLabelValues(it.typ, "out").Inc()
	n.everSent = true
	if n.linkDown {
		n.linkDown = false
		n.linkRecoveredAt = time.Now()
		n.logger.Info("discovery messages flow again; asking every peer again")
		n.enqueueLocked(intent{typ: TypeHello})
		n.enqueueLocked(intent{typ: TypeQuery})
	}
}

// effects applies the view to the link (gone marks, routes), to
// OnLocalChange and to the metrics, in that order, whenever it changed.
// It is the only caller of those, so they see changes in order. It exits
// when ctx is done.
func (n *Node) effects(ctx context.Context) {
	defer n.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.wakeEffects:
		}
		n.applyEffects()
	}
}

func (n *Node) applyEffects() {
	n.mu.Lock()
	gen := n.gen
	routes := n.routesLocked()
	gone := n.goneLocked()
	local := n.local
	counts := map[string]int{StateUp: 0, StateGone: 0, StateAbsent: 0}
	for _, p := range n.peers {
		counts[p.state]++
	}
	remote := len(n.capabilitiesLocked().Remote)
	n.mu.Unlock()

	a := &n.applied // touched only here, and by Close after the goroutine ended
	for name := range a.gone {
		if _, still := gone[name]; !still {
			n.cfg.Link.MarkGone(name, time.Time{})
		}
	}
	for name, since := range gone {
		if was, ok := a.gone[name]; !ok || !was.Equal(since) {
			n.cfg.Link.MarkGone(name, since)
		}
	}
	a.gone = gone
	if a.routes == nil || !maps.EqualFunc(routes, a.routes, slices.Equal) {
		n.cfg.Link.SetRoutes(routes)
		a.routes = routes
	}
	if n.cfg.OnLocalChange != nil && (!a.set || !local.equal(a.local)) {
		n.cfg.OnLocalChange(slices.Clone(local.caps), slices.Clone(local.stages))
		a.local, a.set = local, true
	}
	for state, c := range counts {
		n.m.peers.WithLabelValues(state).Set(float64(c))
	}
	n.m.caps.WithLabelValues("local").Set(float64(len(local.caps)))
	n.m.caps.WithLabelValues("remote").Set(float64(remote))

	n.mu.Lock()
	n.applied.gen = gen
	n.mu.Unlock()
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
			_ = msg.Respond(data) // the caller may be gone; nothing to do then
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
	return nil
}

// clip shortens a string off the wire for a log line.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
