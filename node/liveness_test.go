package node

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// countKeys counts the messages with routing key key that l sent.
func countKeys(l *fakeLink, key string) int {
	n := 0
	for _, k := range l.sentKeys() {
		if k == key {
			n++
		}
	}
	return n
}

// No node asks the whole mesh with a broadcast query, at start or on a
// schedule, however long the mesh runs: its hello asks every version 2
// node.
func TestNoPeriodicBroadcastQuery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a := h.node("A", nil, "cap.a")
		b := h.node("B", nil, "cap.b")
		c := h.node("C", nil, "cap.c")
		h.start(a, b, c)
		h.advance(10 * time.Minute)
		for _, n := range []*testNode{a, b, c} {
			if got := countKeys(n.link, "sys.query"); got != 0 {
				t.Errorf("%s sent %d broadcast queries in 10 minutes, want none", n.cfg.Name, got)
			}
			if got := countKeys(n.link, "sys.info"); got != 0 {
				t.Errorf("%s broadcast %d infos, want none", n.cfg.Name, got)
			}
		}
		wantRoutes(t, a, map[string][]string{"b": {"B"}, "c": {"C"}})
	})
}

// A heartbeat whose hash matches asks nothing; one whose hash differs
// asks that peer alone.
func TestHashMismatchAsksThatPeerAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a := h.node("A", nil)
		b := h.node("B", nil, "cap.one")
		c := h.node("C", nil, "cap.c")
		h.start(a, b, c)
		h.advance(time.Minute)
		if got := countKeys(a.link, "to.B.sys.query") + countKeys(a.link, "to.C.sys.query"); got != 0 {
			t.Fatalf("A sent %d addressed queries while every hash matched, want 0", got)
		}
		b.link.setDrop("update", true)
		b.setLocal("cap.one", "cap.two")
		h.settle()
		h.advance(5 * time.Second) // B's next heartbeat carries the new hash
		if got := countKeys(a.link, "to.B.sys.query"); got != 1 {
			t.Fatalf("A sent %d addressed queries to B, want 1", got)
		}
		if got := countKeys(a.link, "to.C.sys.query") + countKeys(a.link, "sys.query"); got != 0 {
			t.Fatalf("A asked C or the mesh %d times, want none", got)
		}
		wantRoutes(t, a, map[string][]string{"one": {"B"}, "two": {"B"}, "c": {"C"}})
	})
}

// A peer whose broker connection is gone (its system queue went with it)
// is noticed by its ring predecessors' probes within one probe interval,
// and by every node once they checked the predecessors' gone message with
// a probe of their own — long before its heartbeat window ends.
func TestKilledPeerNoticedByProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		slow := func(c *Config) { c.HeartbeatInterval = time.Minute } // window: 3 minutes
		var nodes []*testNode
		for _, name := range []string{"A", "B", "C", "D", "E", "F"} {
			nodes = append(nodes, h.node(name, slow, "cap."+strings.ToLower(name)))
		}
		h.start(nodes...)
		h.advance(2 * time.Minute)
		d := nodes[3]
		d.link.setCut(true) // killed: says nothing more...
		h.remove(d)         // ...and the broker dropped its queue
		killed := time.Now()
		h.advance(5 * time.Second) // one probe interval (jittered: at most 5s)
		for _, n := range nodes {
			if n == d {
				continue
			}
			p := wantState(t, n, "D", StateGone)
			if p.Reason != reasonNotConnected {
				t.Errorf("%s: D gone for %q, want %q", n.cfg.Name, p.Reason, reasonNotConnected)
			}
			if took := p.Since.Sub(killed); took > 5*time.Second {
				t.Errorf("%s noticed D after %v, want within the probe interval 5s", n.cfg.Name, took)
			}
			if _, ok := n.link.Gone()["D"]; !ok {
				t.Errorf("%s's link does not mark D gone", n.cfg.Name)
			}
		}
		// Only D's ring predecessors (B and C) told the mesh.
		announced := 0
		for _, n := range nodes {
			announced += countKeys(n.link, "sys.gone")
		}
		if announced < 1 || announced > probeFanout {
			t.Fatalf("gone messages sent: %d, want 1..%d", announced, probeFanout)
		}
	})
}

// A gone message is a claim, not a verdict: each node checks it with its
// own probe, and a peer the broker still routes to stays up.
func TestGoneClaimIsChecked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a := h.node("A", nil)
		b := h.node("B", nil, "cap.b")
		h.start(a, b)
		at := time.Now()
		a.HandleSystem(TypeGone, good(Message{V: 2, Type: TypeGone, Node: "X", Peer: "B", StartedAt: at, Proto: 2}), "X")
		h.settle()
		wantState(t, a, "B", StateUp)
		if got := countKeys(a.link, "to.B.sys.probe"); got < 1 {
			t.Fatalf("A did not probe B to check the claim: sent %v", a.link.sentKeys())
		}
		// The same claim about a peer that is really gone holds.
		h.remove(b)
		b.link.setCut(true)
		a.HandleSystem(TypeGone, good(Message{V: 2, Type: TypeGone, Node: "X", Peer: "B", StartedAt: at, Proto: 2}), "X")
		h.settle()
		wantState(t, a, "B", StateGone)
		if got := countKeys(a.link, "sys.gone"); got != 0 {
			t.Fatalf("A repeated a gone message it only checked: %d sent", got)
		}
	})
}

// A peer that hangs while its connection stays open is routed to, so the
// probes see nothing; its silence makes it gone within the heartbeat
// window.
func TestHungPeerNoticedWithinWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a := h.node("A", nil)
		b := h.node("B", nil, "cap.b")
		h.start(a, b)
		h.advance(time.Minute)
		last := a.peer(t, "B").LastSeen
		b.link.setCut(true)
		h.advance(15 * time.Second)
		p := wantState(t, a, "B", StateGone)
		if took := p.Since.Sub(last); took > 15*time.Second+time.Millisecond {
			t.Fatalf("B gone %v after its last message, want within the window 15s", took)
		}
	})
}

// A peer that reconnects between two probes is not held gone: a probe
// answered with "no route" after the peer spoke again changes nothing.
func TestNoRouteAfterPeerSpokeIsIgnored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a := h.node("A", nil)
		b := h.node("B", nil, "cap.b")
		h.start(a, b)
		a.mu.Lock()
		sent := time.Now()
		a.peers["B"].lastSeen = sent.Add(time.Millisecond)
		a.noRouteLocked(intent{typ: TypePing, to: "B", announce: true}, sent)
		a.mu.Unlock()
		h.settle()
		wantState(t, a, "B", StateUp)
	})
}

func TestJitterBounds(t *testing.T) {
	const d = 10 * time.Second
	lo, hi := d, time.Duration(0)
	for range 10000 {
		j := jittered(d)
		if j < time.Duration(float64(d)*(1-jitterFraction)) || j > d {
			t.Fatalf("jittered(%v) = %v, want within [%v, %v]", d, j, time.Duration(float64(d)*(1-jitterFraction)), d)
		}
		lo, hi = min(lo, j), max(hi, j)
	}
	if hi-lo < d/10 {
		t.Fatalf("jittered(%v) spans only %v..%v: not spread", d, lo, hi)
	}
}

// Every periodic message is jittered: the gaps between a node's
// heartbeats and between its probes vary, and none is longer than the
// interval it announced.
func TestPeriodicMessagesAreJittered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a := h.node("A", nil)
		b := h.node("B", nil)
		a.link.notify = make(chan struct{}, 1)
		h.start(a, b)
		times := map[string][]time.Time{}
		seen := 0
		for range 600 { // 10 minutes in steps of a second
			h.advance(time.Second)
			keys := a.link.sentKeys()
			for _, k := range keys[seen:] {
				times[k] = append(times[k], time.Now())
			}
			seen = len(keys)
		}
		for _, key := range []string{"sys.heartbeat", "to.B.sys.probe"} {
			ts := times[key]
			if len(ts) < 100 {
				t.Fatalf("%s sent %d times in 10 minutes, want over 100", key, len(ts))
			}
			var gaps []time.Duration
			for i := 1; i < len(ts); i++ {
				gaps = append(gaps, ts[i].Sub(ts[i-1]))
			}
			lo, hi := slices.Min(gaps), slices.Max(gaps)
			if lo < 3*time.Second || hi > 6*time.Second || lo == hi {
				t.Fatalf("%s gaps %v..%v (seconds, rounded up): want varied, within 4s..5s", key, lo, hi)
			}
		}
	})
}

func TestHeartbeatIntervalFor(t *testing.T) {
	tests := []struct {
		nodes int
		base  time.Duration
		want  time.Duration
	}{
		{1, DefaultHeartbeatInterval, 5 * time.Minute},
		{10, DefaultHeartbeatInterval, 5 * time.Minute},
		{11, DefaultHeartbeatInterval, 330 * time.Second},                 // in proportion beyond 10
		{100, DefaultHeartbeatInterval, 50 * time.Minute},                 // 10 × the base
		{120, DefaultHeartbeatInterval, time.Hour},                        // the protocol's limit
		{10000, DefaultHeartbeatInterval, time.Hour},                      // the protocol's limit
		{3, 300 * time.Millisecond, 300 * time.Millisecond},               // a short base holds in a small mesh
		{100, 5 * time.Second, 50 * time.Second},                          // 5s × 100/10
		{200, 5 * time.Second, 100 * time.Second},                         // 5s × 200/10
		{200, 10 * time.Millisecond, 8889 * time.Millisecond},             // 200²/4500: the mesh-wide budget
		{1000, 10 * time.Millisecond, 222223 * time.Millisecond},          // 1000²/4500
		{10000, 10 * time.Millisecond, maxHeartbeatMS * time.Millisecond}, // the protocol's limit
	}
	for _, tt := range tests {
		if got := HeartbeatIntervalFor(tt.nodes, tt.base, DefaultHeartbeatBudget); got != tt.want {
			t.Errorf("HeartbeatIntervalFor(%d, %v): got %v, want %v", tt.nodes, tt.base, got, tt.want)
		}
	}
	// A node hears as many heartbeats a second in a larger mesh as in one
	// of 10 nodes (until the protocol's limit), and the whole mesh's
	// heartbeat deliveries stay within the budget.
	heard := func(n int, base time.Duration) float64 {
		return float64(n) / (HeartbeatIntervalFor(n, base, DefaultHeartbeatBudget).Seconds() * (1 - jitterFraction/2))
	}
	for _, base := range []time.Duration{10 * time.Millisecond, 5 * time.Second, DefaultHeartbeatInterval} {
		for _, n := range []int{20, 50, 100, 110} {
			if heard(n, base) > heard(heartbeatFlatMesh, base)*1.001 {
				t.Errorf("base %v: a node hears %.3f heartbeats/s at %d nodes, %.3f at %d: want no more", base, heard(n, base), n, heard(heartbeatFlatMesh, base), heartbeatFlatMesh)
			}
		}
		for _, n := range []int{200, 500, 1000, 3000} {
			if total := heard(n, base) * float64(n); total > DefaultHeartbeatBudget*1.001 {
				t.Errorf("base %v, %d nodes: %.0f heartbeat deliveries/s, budget %d", base, n, total, DefaultHeartbeatBudget)
			}
		}
	}
}

// The heartbeat interval grows with the mesh, and since a node announces
// an interval before it keeps it, no peer is held gone while it grows.
func TestGrowingIntervalNeverMisleadsPeers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		tiny := func(c *Config) { c.HeartbeatBudget = 1 } // 6 nodes: 36/0.9 = 40s
		var nodes []*testNode
		for i := range 6 {
			nodes = append(nodes, h.node(fmt.Sprintf("N%d", i), tiny))
		}
		h.start(nodes[0], nodes[1])
		h.advance(30 * time.Second)
		h.start(nodes[2:]...)
		for range 20 {
			h.advance(30 * time.Second)
			for _, n := range nodes {
				for _, p := range n.Peers() {
					if p.State != StateUp {
						t.Fatalf("%s holds %s %s (%s) while the intervals grow", n.cfg.Name, p.Name, p.State, p.Reason)
					}
				}
			}
		}
		n := nodes[0]
		n.mu.Lock()
		iv := n.hbInterval
		n.mu.Unlock()
		if want := HeartbeatIntervalFor(6, 5*time.Second, 1); iv != want {
			t.Fatalf("heartbeat interval with 6 nodes: got %v, want %v", iv, want)
		}
	})
}

// A version 1 node keeps understanding a version 2 node: every message of
// a version 1 type goes out as version 1; only ping and gone are version 2,
// and a version 1 peer is probed with an addressed query instead of a
// ping.
func TestMixedVersions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a := h.node("A", nil, "cap.a")
		b := h.node("B", nil, "cap.b")
		h.start(a, b)
		// O speaks version 1: no proto, no ping. It is not on the fake mesh,
		// so what A sends it is not routed; A only learns of it here.
		at := time.Now()
		a.HandleSystem(TypeHello, good(Message{V: 1, Type: TypeHello, Node: "O", StartedAt: at, Seq: 1,
			Capabilities: []string{"old"}, HeartbeatMS: 5000}), "O")
		h.settle()
		if got := a.peer(t, "O"); got.State != StateUp || !slices.Equal(got.Capabilities, []string{"old"}) {
			t.Fatalf("A's view of a version 1 node: got %+v", got)
		}
		// A version 1 hello asks nothing (a version 1 node sends a broadcast
		// query for that); a version 2 hello is answered with an info.
		if got := countKeys(a.link, "to.O.sys.info"); got != 0 {
			t.Fatalf("A answered a version 1 hello with %d infos, want none", got)
		}
		a.HandleSystem(TypeHello, good(Message{V: 1, Type: TypeHello, Node: "N", StartedAt: at, Seq: 1, Proto: 2,
			Capabilities: []string{"new"}, HeartbeatMS: 5000}), "N")
		h.settle()
		if got := countKeys(a.link, "to.N.sys.info"); got != 1 {
			t.Fatalf("A answered a version 2 hello with %d infos, want 1", got)
		}
		a.mu.Lock()
		probeO := a.probeIntentLocked(a.peers["O"], true)
		probeN := a.probeIntentLocked(a.peers["N"], true)
		probeB := a.probeIntentLocked(a.peers["B"], true)
		a.mu.Unlock()
		if probeO.typ != TypeQuery || probeN.typ != TypePing || probeB.typ != typeProbe {
			t.Fatalf("probes: version 1 peer %q, version 2 peer %q, version %d peer %q; want query, ping and probe",
				probeO.typ, probeN.typ, ProtocolVersion, probeB.typ)
		}
		h.advance(time.Minute)
		a.link.mu.Lock()
		bodies := slices.Clone(a.link.bodies)
		a.link.mu.Unlock()
		for _, body := range bodies {
			if body == nil {
				continue // a probe: no message at all
			}
			var m struct {
				V     int    `json:"v"`
				Type  string `json:"type"`
				Proto int    `json:"proto"`
			}
			if err := json.Unmarshal(body, &m); err != nil {
				t.Fatal(err)
			}
			if m.V != typeVersion(m.Type) || m.Proto != ProtocolVersion {
				t.Fatalf("A sent %s as v%d proto %d; want v%d proto %d", m.Type, m.V, m.Proto, typeVersion(m.Type), ProtocolVersion)
			}
			if m.Type != TypePing && m.Type != TypeGone && m.V != 1 {
				t.Fatalf("A sent a %s a version 1 node cannot read: %s", m.Type, body)
			}
		}
	})
}

// good encodes m for HandleSystem.
func good(m Message) []byte {
	body, err := EncodeMessage(&m)
	if err != nil {
		panic(err)
	}
	return body
}

// reports keeps what a callback of a node under test reported, in order.
type reports[T any] struct {
	mu  sync.Mutex
	got []T
}

func (r *reports[T]) add(v T) {
	r.mu.Lock()
	r.got = append(r.got, v)
	r.mu.Unlock()
}

// all returns every report so far.
func (r *reports[T]) all() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// lastOr returns the latest report, or none when there is none yet.
func (r *reports[T]) lastOr(none T) T {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.got) == 0 {
		return none
	}
	return r.got[len(r.got)-1]
}

// A node reports the lowest protocol its up peers speak, once its hello
// has been out long enough for their answers, and again when an older
// peer comes or goes: the bridge sends command batches only while it is
// at least BatchProtocolVersion.
func TestPeerProtocolsReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		var reports reports[int]
		a := h.node("A", func(c *Config) { c.OnPeerProtocols = reports.add }, "cap.a")
		b := h.node("B", nil, "cap.b")
		got := reports.all
		h.start(a, b)
		if r := got(); len(r) != 0 {
			t.Fatalf("reports before the hello settled: %v, want none", r)
		}
		h.advance(PeerProtocolSettle + 50*time.Millisecond)
		if r := got(); !slices.Equal(r, []int{ProtocolVersion}) {
			t.Fatalf("reports once settled with a current peer: %v, want [%d]", r, ProtocolVersion)
		}
		// An older node (version 2) joins: batches must stop. It is on the
		// fake mesh (built, not started), so A's answer reaches it.
		h.node("O", nil)
		at := time.Now()
		a.HandleSystem(TypeHello, good(Message{V: 1, Type: TypeHello, Node: "O", StartedAt: at, Seq: 1, Proto: 2,
			Capabilities: []string{"old"}, HeartbeatMS: 5000}), "O")
		h.settle()
		if r := got(); !slices.Equal(r, []int{ProtocolVersion, 2}) {
			t.Fatalf("reports after a version 2 peer came: %v, want [%d 2]", r, ProtocolVersion)
		}
		// It leaves cleanly: every peer up speaks the current version again.
		a.HandleSystem(TypeBye, good(Message{V: 1, Type: TypeBye, Node: "O", StartedAt: at, Seq: 2}), "O")
		h.settle()
		if r := got(); !slices.Equal(r, []int{ProtocolVersion, 2, ProtocolVersion}) {
			t.Fatalf("reports after the older peer said bye: %v, want [%d 2 %d]", r, ProtocolVersion, ProtocolVersion)
		}
	})
}

// A node reports the peers it knows of for their event lanes, and legacy
// while one of them was not heard speaking EventLaneProtocolVersion: an
// expected node not heard yet, and an older node that says hello.
// Without node records it cannot know every publisher: legacy always.
func TestEventPeersReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		type report struct {
			peers  []string
			legacy bool
		}
		var reports reports[report]
		a := h.node("A", func(c *Config) {
			c.OnEventPeers = func(peers []string, legacy bool) { reports.add(report{peers, legacy}) }
		}, "cap.a")
		b := h.node("B", nil, "cap.b")
		last := func() report { return reports.lastOr(report{}) }
		h.start(a, b)
		h.settle()
		if r := last(); !r.legacy || !slices.Equal(r.peers, []string{"B"}) {
			t.Fatalf("without node records: %+v, want B and legacy", r)
		}
		if err := a.SetExpected([]string{"A", "B", "C"}); err != nil {
			t.Fatal(err)
		}
		h.settle()
		if r := last(); !r.legacy || !slices.Equal(r.peers, []string{"B", "C"}) {
			t.Fatalf("C expected, never heard: %+v, want B, C and legacy", r)
		}
		if err := a.SetExpected([]string{"B"}); err != nil {
			t.Fatal(err)
		}
		h.settle()
		if r := last(); r.legacy || !slices.Equal(r.peers, []string{"B"}) {
			t.Fatalf("every node heard at the current protocol: %+v, want B and not legacy", r)
		}
		at := time.Now()
		h.node("O", nil)
		a.HandleSystem(TypeHello, good(Message{V: 1, Type: TypeHello, Node: "O", StartedAt: at, Seq: 1, Proto: 5,
			Capabilities: []string{"old"}, HeartbeatMS: 5000}), "O")
		h.settle()
		if r := last(); !r.legacy || !slices.Equal(r.peers, []string{"B", "O"}) {
			t.Fatalf("a version 5 node said hello: %+v, want B, O and legacy", r)
		}
	})
}

// A node reports the lowest protocol of every node it knows of, up or
// not: 0 without node records and while an expected node was not heard,
// the current version once all were, an older node's version once it
// says hello, and no more than that after it left (it may come back and
// read what was written meanwhile; a bye carries no version, 1 then).
// The tables write snapshot parts in binary only at
// RowsBinaryProtocolVersion.
func TestKnownProtocolsReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		var reports reports[int]
		a := h.node("A", func(c *Config) { c.OnKnownProtocols = reports.add }, "cap.a")
		b := h.node("B", nil, "cap.b")
		last := func() int { return reports.lastOr(-1) }
		h.start(a, b)
		h.settle()
		if r := last(); r != 0 {
			t.Fatalf("without node records: %d, want 0", r)
		}
		if err := a.SetExpected([]string{"A", "B", "C"}); err != nil {
			t.Fatal(err)
		}
		h.settle()
		if r := last(); r != 0 {
			t.Fatalf("C expected, never heard: %d, want 0", r)
		}
		if err := a.SetExpected([]string{"A", "B"}); err != nil {
			t.Fatal(err)
		}
		h.settle()
		if r := last(); r != ProtocolVersion || r < RowsBinaryProtocolVersion {
			t.Fatalf("every node heard at the current protocol: %d, want %d", r, ProtocolVersion)
		}
		at := time.Now()
		h.node("O", nil)
		a.HandleSystem(TypeHello, good(Message{V: 1, Type: TypeHello, Node: "O", StartedAt: at, Seq: 1, Proto: 7,
			Capabilities: []string{"old"}, HeartbeatMS: 5000}), "O")
		h.settle()
		if r := last(); r != 7 {
			t.Fatalf("a version 7 node said hello: %d, want 7", r)
		}
		a.HandleSystem(TypeBye, good(Message{V: 1, Type: TypeBye, Node: "O", StartedAt: at, Seq: 2}), "O")
		h.settle()
		if r := last(); r == 0 || r >= RowsBinaryProtocolVersion {
			t.Fatalf("the version 7 node left: %d, want its version or less, and more than 0", r)
		}
	})
}
