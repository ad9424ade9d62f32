package node

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// fakeMesh stands for the broker's mesh exchange: it delivers what one
// node's link publishes to the nodes bound to the routing key, at once,
// on the publisher's goroutine.
type fakeMesh struct {
	mu    sync.Mutex
	nodes map[string]*Node
	links map[string]*fakeLink
}

func newFakeMesh() *fakeMesh {
	return &fakeMesh{nodes: map[string]*Node{}, links: map[string]*fakeLink{}}
}

// deliver hands body to node addressee, or to every node (the sender too)
// when addressee is "". It reports whether anyone got it.
func (fm *fakeMesh) deliver(from, addressee, key string, body []byte) bool {
	fm.mu.Lock()
	var to []*Node
	if addressee != "" {
		if n := fm.nodes[addressee]; n != nil {
			to = append(to, n)
		}
	} else {
		for _, n := range fm.nodes {
			to = append(to, n)
		}
	}
	fm.mu.Unlock()
	for _, n := range to {
		n.HandleSystem(key, body, from)
	}
	return len(to) > 0
}

// fakeLink is one node's Link on a fakeMesh.
type fakeLink struct {
	mesh *fakeMesh
	name string

	mu        sync.Mutex
	fail      error // PublishSystem returns it when set
	block     bool  // PublishSystem waits for its context to end
	cut       bool  // PublishSystem drops messages silently (the process is "dead")
	dropTypes map[string]bool
	attempts  int      // calls of PublishSystem and SendSystem, failed ones too
	sent      []string // routing keys as the bridge forms them: sys.<type>, to.<node>.sys.<type>
	bodies    [][]byte // the bodies sent, in the same order
	routes    map[string][]string
	routeSets int
	gone      map[string]time.Time
	local     [][]string    // OnLocalChange calls: capabilities
	notify    chan struct{} // when set (buffered), poked after each message sent
}

var errNoRoute = errors.New("no route")

func (l *fakeLink) PublishSystem(ctx context.Context, key string, body []byte) error {
	return l.send(ctx, "", key, body)
}

func (l *fakeLink) SendSystem(ctx context.Context, node, key string, body []byte) error {
	return l.send(ctx, node, key, body)
}

// ProbeNode records the probe as to.<node>.sys.probe; it reaches no node
// (a node's link drops probes), and when node is not on the mesh the
// broker's "no route" comes back at once.
func (l *fakeLink) ProbeNode(ctx context.Context, node string, unroutable func()) error {
	l.mu.Lock()
	l.attempts++
	if err := l.fail; err != nil {
		l.mu.Unlock()
		return err
	}
	if err := ctx.Err(); err != nil {
		l.mu.Unlock()
		return err
	}
	l.sent = append(l.sent, "to."+node+".sys."+typeProbe)
	l.bodies = append(l.bodies, nil)
	cut := l.cut
	if l.notify != nil {
		select {
		case l.notify <- struct{}{}:
		default:
		}
	}
	l.mu.Unlock()
	l.mesh.mu.Lock()
	_, routed := l.mesh.nodes[node]
	l.mesh.mu.Unlock()
	if !cut && !routed {
		unroutable()
	}
	return nil
}

func (l *fakeLink) send(ctx context.Context, to, key string, body []byte) error {
	l.mu.Lock()
	l.attempts++
	if l.block {
		l.mu.Unlock()
		<-ctx.Done()
		return ctx.Err()
	}
	if l.fail != nil {
		err := l.fail
		l.mu.Unlock()
		return err
	}
	if err := ctx.Err(); err != nil {
		l.mu.Unlock()
		return err
	}
	rk := "sys." + key
	if to != "" {
		rk = "to." + to + ".sys." + key
	}
	l.sent = append(l.sent, rk)
	l.bodies = append(l.bodies, body)
	drop := l.cut || l.dropTypes[key]
	if l.notify != nil {
		select {
		case l.notify <- struct{}{}:
		default:
		}
	}
	l.mu.Unlock()
	if !drop && !l.mesh.deliver(l.name, to, key, body) && to != "" {
		return errNoRoute
	}
	return nil
}

func (l *fakeLink) SetRoutes(routes map[string][]string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.routes = maps.Clone(routes)
	l.routeSets++
}

func (l *fakeLink) MarkGone(node string, since time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if since.IsZero() {
		delete(l.gone, node)
		return
	}
	l.gone[node] = since
}

func (l *fakeLink) Routes() map[string][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.routes)
}

func (l *fakeLink) Gone() map[string]time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.gone)
}

// attemptCount is how many messages the node tried to send so far.
func (l *fakeLink) attemptCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.attempts
}

func (l *fakeLink) setFail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fail = err
}

func (l *fakeLink) setBlock(block bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.block = block
}

func (l *fakeLink) setCut(cut bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = cut
}

func (l *fakeLink) setDrop(typ string, drop bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dropTypes == nil {
		l.dropTypes = map[string]bool{}
	}
	if drop {
		l.dropTypes[typ] = true
	} else {
		delete(l.dropTypes, typ)
	}
}

// sentKeys returns the routing keys of the messages sent, in order.
func (l *fakeLink) sentKeys() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.sent)
}

// testNode is a node on a fake mesh with its link and metrics registry.
type testNode struct {
	*Node
	link *fakeLink
	reg  *prometheus.Registry
}

// setLocal says local programs subscribe subjects now, as the appliance's
// watcher does.
func (n *testNode) setLocal(subjects ...string) { n.SetLocal(subjects) }

// harness is a fake mesh. Build it inside a synctest bubble
// (synctest.Test): the nodes' timers then run on the bubble's clock, which
// moves only when every goroutine in the bubble is blocked.
type harness struct {
	t     testing.TB
	mesh  *fakeMesh
	nodes []*testNode
}

func newHarness(t testing.TB) *harness {
	return &harness{t: t, mesh: newFakeMesh()}
}

// node builds (not starts) a node named name hosting the given subjects.
// mod may change its config.
func (h *harness) node(name string, mod func(*Config), subjects ...string) *testNode {
	h.t.Helper()
	link := &fakeLink{mesh: h.mesh, name: name, gone: map[string]time.Time{}}
	reg := prometheus.NewRegistry()
	cfg := Config{
		Name:              name,
		Version:           "1.0.0-test",
		Link:              link,
		DiscoveryInterval: 5 * time.Second,
		NoRoute:           func(err error) bool { return errors.Is(err, errNoRoute) },
		HeartbeatInterval: 5 * time.Second,
		MissedHeartbeats:  3,
		Logger:            slog.New(slog.NewTextHandler(tbWriter{h.t}, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test_node", name),
		Registerer:        reg,
		OnLocalChange: func(caps, _ []string) {
			link.mu.Lock()
			link.local = append(link.local, caps)
			link.mu.Unlock()
		},
	}
	if mod != nil {
		mod(&cfg)
	}
	n, err := New(cfg)
	if err != nil {
		h.t.Fatalf("new node %s: %v", name, err)
	}
	n.SetLocal(subjects)
	h.t.Cleanup(func() {
		if err := n.Close(); err != nil {
			h.t.Errorf("close node %s: %v", name, err)
		}
	})
	h.mesh.mu.Lock()
	h.mesh.nodes[name] = n
	h.mesh.links[name] = link
	h.mesh.mu.Unlock()
	tn := &testNode{Node: n, link: link, reg: reg}
	h.nodes = append(h.nodes, tn)
	return tn
}

// start starts a node built by node and waits until the mesh is quiet.
func (h *harness) start(names ...*testNode) {
	h.t.Helper()
	for _, n := range names {
		if err := n.Start(context.Background()); err != nil {
			h.t.Fatalf("start %s: %v", n.cfg.Name, err)
		}
	}
	h.settle()
}

// remove takes a node off the mesh: nothing reaches it any more.
func (h *harness) remove(n *testNode) {
	h.mesh.mu.Lock()
	defer h.mesh.mu.Unlock()
	delete(h.mesh.nodes, n.cfg.Name)
}

// settle waits until no node has a message to send or a change to apply:
// every goroutine of the bubble is blocked, so the loops, senders and
// effects goroutines are all waiting for their next wake-up.
func (h *harness) settle() {
	h.t.Helper()
	synctest.Wait()
}

// advance lets d pass on the bubble's clock (every node's timers that
// come due fire, in order) and settles the mesh.
func (h *harness) advance(d time.Duration) {
	h.t.Helper()
	time.Sleep(d)
	synctest.Wait()
}

func (n *testNode) peer(t testing.TB, name string) Peer {
	t.Helper()
	for _, p := range n.Peers() {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("node %s has no peer %s; peers: %+v", n.cfg.Name, name, n.Peers())
	return Peer{}
}

func (n *testNode) hasPeer(name string) bool {
	for _, p := range n.Peers() {
		if p.Name == name {
			return true
		}
	}
	return false
}

var errBrokerAway = errors.New("broker unreachable")

// tbWriter sends log lines to tb.Log.
type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
