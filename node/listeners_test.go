package node

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// watchListeners builds node name on h (hosting subjects), keeping the
// views it hands OnEventListeners; last returns the latest (nil: none).
func watchListeners(h *harness, name string, subjects ...string) (n *testNode, last func() *Listeners) {
	var mu sync.Mutex
	var view *Listeners
	n = h.node(name, func(c *Config) {
		c.OnEventListeners = func(l *Listeners) { mu.Lock(); view = l; mu.Unlock() }
	}, subjects...)
	return n, func() *Listeners { mu.Lock(); defer mu.Unlock(); return view }
}

// A node tells its bridge what the other nodes listen to, and says "all"
// whenever one of them may listen to something it cannot know: no node
// records, an expected node not heard, an older node, a peer not heard
// since the link connected (an update it sent then never arrived).
func TestEventListenersReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a, last := watchListeners(h, "A", "cap.a")
		b := h.node("B", nil, "cap.b")
		b.SetListening([]string{"door.*"})
		wantAll := func(why, contains string) {
			t.Helper()
			l := last()
			if l == nil || !l.All || !strings.Contains(l.Why, contains) {
				t.Fatalf("%s: %+v, want all because %q", why, l, contains)
			}
			if !l.Wants("anything.at.all") {
				t.Fatalf("%s: all, yet Wants(anything.at.all) is false", why)
			}
		}
		wantKnown := func(why string, patterns ...string) *Listeners {
			t.Helper()
			l := last()
			if l == nil || l.All || !slices.Equal(l.Patterns, patterns) {
				t.Fatalf("%s: %+v, want exactly %q", why, l, patterns)
			}
			return l
		}
		h.start(a, b)
		wantAll("without node records", "no node records")

		if err := a.SetExpected([]string{"A", "B", "C"}); err != nil {
			t.Fatal(err)
		}
		h.settle()
		wantAll("C expected, never heard", "node C not heard yet")

		if err := a.SetExpected([]string{"A", "B"}); err != nil {
			t.Fatal(err)
		}
		h.settle()
		l := wantKnown("every node heard", "door.*")
		for topic, want := range map[string]bool{"door.front": true, "door": false, "door.front.lock": false, "garden.tap": false} {
			if got := l.Wants(topic); got != want {
				t.Errorf("Wants(%q) with B on door.*: %v, want %v", topic, got, want)
			}
		}

		// B's programs change: A hears it at once (an update).
		b.SetListening([]string{"garden.#", "door.*"})
		h.settle()
		l = wantKnown("B listens to more", "door.*", "garden.#")
		if !l.Wants("garden.tap.open") || l.Wants("kitchen") {
			t.Fatalf("B on garden.#: Wants(garden.tap.open)=%v Wants(kitchen)=%v", l.Wants("garden.tap.open"), l.Wants("kitchen"))
		}

		// A's link reconnects while B's answers are lost: B may have
		// changed meanwhile, so A knows nothing of it until B answers.
		before := l.Since
		h.advance(time.Millisecond) // the bubble's clock moves only when told
		b.link.setDrop(TypeInfo, true)
		a.LinkUp()
		h.settle()
		wantAll("after a reconnect, B not heard again", "node B not heard since the link connected")
		b.link.setDrop(TypeInfo, false)
		a.LinkUp()
		h.settle()
		if l = wantKnown("B answered the hello", "door.*", "garden.#"); !l.Since.After(before) {
			t.Fatalf("the view after the reconnect holds records since %v, not since after the one before it (%v)", l.Since, before)
		}

		// A peer that left keeps its record: its queue stays bound.
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		h.settle()
		wantKnown("B said bye", "door.*", "garden.#")

		// An older node says hello: it may listen to anything.
		at := time.Now()
		h.node("O", nil)
		if err := a.SetExpected([]string{"A", "B", "O"}); err != nil {
			t.Fatal(err)
		}
		a.HandleSystem(TypeHello, good(Message{V: 1, Type: TypeHello, Node: "O", StartedAt: at, Seq: 1, Proto: 6,
			Capabilities: []string{"old"}, HeartbeatMS: 5000}), "O")
		h.settle()
		wantAll("a version 6 node said hello", "node O runs an older meshbox")
	})
}

// A record's events are validated like its other lists: a pattern no
// subscription makes is refused, and only hello, info and update carry
// them.
func TestListeningOnTheWire(t *testing.T) {
	at := time.Now()
	for _, tc := range []struct {
		m  Message
		ok bool
	}{
		{Message{V: 1, Type: TypeUpdate, Node: "b", StartedAt: at, Seq: 1, Proto: 7, Events: []string{"door.*", "garden.#", "#"}}, true},
		{Message{V: 1, Type: TypeUpdate, Node: "b", StartedAt: at, Seq: 1, Proto: 7, Events: []string{"a.#.b"}}, false},
		{Message{V: 1, Type: TypeUpdate, Node: "b", StartedAt: at, Seq: 1, Proto: 7, Events: []string{"caf\u00e9"}}, false},
		{Message{V: 1, Type: TypeUpdate, Node: "b", StartedAt: at, Seq: 1, Proto: 7, Events: []string{"a..b"}}, false},
		{Message{V: 1, Type: TypeHeartbeat, Node: "b", StartedAt: at, Seq: 1, Proto: 7, Events: []string{"door"}}, false},
	} {
		m, err := DecodeMessage(tc.m.Type, good(tc.m), "b")
		if (err == nil) != tc.ok {
			t.Errorf("%s with events %q: err %v, want ok=%v", tc.m.Type, tc.m.Events, err, tc.ok)
			continue
		}
		if err == nil && m.Hash != HostHash(nil, nil, tc.m.Events...) {
			t.Errorf("hash of a record with events %q: %q, want the events hashed too", tc.m.Events, m.Hash)
		}
	}
	if HostHash([]string{"c"}, nil) == HostHash([]string{"c"}, nil, "door") {
		t.Fatal("a record's events do not change its hash: a lost update of them would never heal")
	}
}

// Attack: node C, a peer with its own valid broker user, tells A that B
// listens to nothing, to have A keep B's events from it. A takes a
// record only from the node it names (the transport's origin), so the
// claim is refused and B's record stands. Control: B's own update is
// taken.
func TestListeningClaimedForAnotherNode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a, view := watchListeners(h, "A")
		b := h.node("B", nil)
		b.SetListening([]string{"door.*"})
		c := h.node("C", nil)
		h.start(a, b, c)
		if err := a.SetExpected([]string{"A", "B", "C"}); err != nil {
			t.Fatal(err)
		}
		h.settle()
		if l := view(); l == nil || l.All || !l.Wants("door.front") {
			t.Fatalf("before the claim: %+v, want B's door.*", l)
		}
		bStarted := b.cfg.StartedAt
		a.HandleSystem(TypeUpdate, good(Message{V: 1, Type: TypeUpdate, Node: "B", StartedAt: bStarted, Seq: 1 << 20, Proto: ProtocolVersion}), "C")
		h.settle()
		if l := view(); l == nil || l.All || !l.Wants("door.front") {
			t.Fatalf("after C claimed B listens to nothing: %+v, want B's door.* still", l)
		}
		if got := value(t, a.m.rejected.WithLabelValues("origin_mismatch")); got != 1 {
			t.Errorf("C's claim for B counted %v times as rejected (origin_mismatch), want 1", got)
		}
		b.SetListening(nil) // control: B's own word
		h.settle()
		if l := view(); l == nil || l.All || l.Wants("door.front") {
			t.Fatalf("after B's own update: %+v, want nobody on door.front", l)
		}
	})
}

// Attack: a peer says it listens to more topic patterns than a node
// matches its events against (MaxListeners, across all peers); the view
// is then "all", as sending every event costs no more than before,
// instead of a match against each of them for every event. Control: with
// that peer saying what a node says, the view lists the patterns.
func TestListeningFlood(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a, view := watchListeners(h, "A")
		b := h.node("B", nil)
		c := h.node("C", nil)
		var flood []string
		for i := range MaxEvents {
			flood = append(flood, fmt.Sprintf("junk%d.*", i))
		}
		b.SetListening(flood)
		c.SetListening([]string{"zz.#"}) // one more: past the bound across peers
		h.start(a, b, c)
		if err := a.SetExpected([]string{"A", "B", "C"}); err != nil {
			t.Fatal(err)
		}
		h.settle()
		if l := view(); l == nil || !l.All || !strings.Contains(l.Why, "more than the 1024") {
			t.Fatalf("B listens to %d patterns and C to one: %+v, want all, saying why", len(flood), l)
		}
		b.SetListening([]string{"door.*"})
		h.settle()
		if l := view(); l == nil || l.All || !slices.Equal(l.Patterns, []string{"door.*", "zz.#"}) {
			t.Fatalf("control, B on door.*: %+v", l)
		}
	})
}

// What a node says it listens to: a heartbeat whose hash differs from the
// record held makes the peer's interest unknown until it answers (an
// update was lost); more patterns than a record carries are said as "#";
// the previous run's patterns are said too until they expire; and node
// records that name only the node itself (a mesh of one) still know the
// peers heard.
func TestListeningEdges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a, view := watchListeners(h, "A")
		b := h.node("B", nil)
		b.SetListening([]string{"door.*"})
		h.start(a, b)
		if err := a.SetExpected([]string{"A"}); err != nil {
			t.Fatal(err)
		}
		h.settle()
		if l := view(); l == nil || l.All || !slices.Equal(l.Patterns, []string{"door.*"}) {
			t.Fatalf("records naming only A (a mesh of one), B heard: %+v, want B's door.*", l)
		}
		if err := a.SetExpected([]string{"A", "B"}); err != nil {
			t.Fatal(err)
		}
		h.settle()
		if l := view(); l == nil || l.All || !slices.Equal(l.Patterns, []string{"door.*"}) {
			t.Fatalf("B heard: %+v", l)
		}

		// B's update is lost; its heartbeat's hash says so.
		b.link.setDrop(TypeUpdate, true)
		b.link.setDrop(TypeInfo, true)
		b.SetListening([]string{"door.*", "garden.#"})
		h.settle()
		if l := view(); l == nil || l.All || l.Wants("garden.tap") {
			t.Fatalf("before B's heartbeat: %+v (its update was dropped)", l)
		}
		h.advance(6 * time.Second) // B's heartbeat (every 5 s)
		if l := view(); l == nil || !l.All {
			t.Fatalf("after B's heartbeat with another hash: %+v, want all until B answers", l)
		}
		b.link.setDrop(TypeInfo, false)
		h.advance(6 * time.Second) // the next heartbeat asks again, and B answers
		if l := view(); l == nil || l.All || !l.Wants("garden.tap") {
			t.Fatalf("after B answered: %+v, want garden.# too", l)
		}
		b.link.setDrop(TypeUpdate, false)

		// More patterns than a record carries: "#".
		var many []string
		for i := range MaxEvents + 1 {
			many = append(many, fmt.Sprintf("t%d", i))
		}
		b.SetListening(many)
		h.settle()
		if l := view(); l == nil || l.All || !slices.Equal(l.Patterns, []string{"#"}) || !l.Wants("anything") {
			t.Fatalf("B listens to %d patterns: %+v, want it to say #", len(many), l)
		}

		// The previous run's patterns, said until they expire.
		c := h.node("C", nil)
		c.KeepListening([]string{"alarm.*"}, time.Now().Add(30*time.Second))
		if err := a.SetExpected([]string{"A", "B", "C"}); err != nil {
			t.Fatal(err)
		}
		b.SetListening(nil)
		h.start(c)
		if l := view(); l == nil || l.All || !l.Wants("alarm.kitchen") {
			t.Fatalf("C keeps its previous run's alarm.*: %+v", l)
		}
		h.advance(31 * time.Second)
		if l := view(); l == nil || l.All || l.Wants("alarm.kitchen") {
			t.Fatalf("after C's previous run's bindings expired: %+v, want nobody on alarm.kitchen", l)
		}
	})
}
