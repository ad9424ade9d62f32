package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// value reads a counter or gauge.
func value(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	switch {
	case d.Counter != nil:
		return d.Counter.GetValue()
	case d.Gauge != nil:
		return d.Gauge.GetValue()
	}
	t.Fatalf("metric %v is neither counter nor gauge", m.Desc())
	return 0
}

func wantRoutes(t *testing.T, n *testNode, want map[string][]string) {
	t.Helper()
	if got := n.link.Routes(); !maps.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("%s: link routes: got %v, want %v", n.cfg.Name, got, want)
	}
	if got := n.Routes(); !maps.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("%s: Routes(): got %v, want %v", n.cfg.Name, got, want)
	}
}

func wantState(t *testing.T, n *testNode, peer, state string) Peer {
	t.Helper()
	p := n.peer(t, peer)
	if p.State != state {
		t.Fatalf("%s: peer %s: got state %q, want %q (%+v)", n.cfg.Name, peer, p.State, state, p)
	}
	return p
}

func TestJoinAndQuery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a := h.node("A", nil, "cap.alpha", "work.resize")
		h.start(a)
		if got := a.Peers(); len(got) != 0 {
			t.Fatalf("A alone: got peers %+v, want none", got)
		}

		time.Sleep(time.Second)
		b := h.node("B", func(c *Config) { c.Version = "2.0.0"; c.StartedAt = time.Now() }, "cap.beta", "cap.image.resize", "work.thumb")
		b.SetRevision(42)
		h.start(b)

		// A learns of B from B's hello, B of A from A's answer to it.
		pb := wantState(t, a, "B", StateUp)
		if !slices.Equal(pb.Capabilities, []string{"beta", "image.resize"}) || !slices.Equal(pb.Stages, []string{"thumb"}) {
			t.Fatalf("A's record of B: got caps %v stages %v, want [beta image.resize] [thumb]", pb.Capabilities, pb.Stages)
		}
		if pb.Version != "2.0.0" || pb.Revision != 42 || !pb.StartedAt.Equal(time.Now()) || pb.LastSeen.IsZero() {
			t.Fatalf("A's record of B: got %+v, want version 2.0.0, revision 42, started_at now, last_seen set", pb)
		}
		pa := wantState(t, b, "A", StateUp)
		if !slices.Equal(pa.Capabilities, []string{"alpha"}) || !slices.Equal(pa.Stages, []string{"resize"}) {
			t.Fatalf("B's record of A: got %v %v, want [alpha] [resize]", pa.Capabilities, pa.Stages)
		}
		wantRoutes(t, a, map[string][]string{"beta": {"B"}, "image.resize": {"B"}})
		wantRoutes(t, b, map[string][]string{"alpha": {"A"}})

		// B's hello was answered with an info addressed to B; B asked
		// nobody (a version 2 hello needs no broadcast query).
		if !slices.Contains(a.link.sentKeys(), "to.B.sys.info") {
			t.Fatalf("A sent %v, want an info to B", a.link.sentKeys())
		}
		if got := b.link.sentKeys(); len(got) == 0 || got[0] != "sys.hello" || slices.Contains(got, "sys.query") {
			t.Fatalf("B's messages: got %v, want a hello first and no broadcast query", got)
		}

		caps := a.Capabilities()
		if !slices.Equal(caps.Local, []string{"alpha"}) || !slices.Equal(caps.LocalStages, []string{"resize"}) ||
			!slices.Equal(caps.Remote["beta"], []string{"B"}) || !slices.Equal(caps.RemoteStages["thumb"], []string{"B"}) {
			t.Fatalf("A's capabilities: got %+v", caps)
		}
		if got := value(t, a.m.peers.WithLabelValues(StateUp)); got != 1 {
			t.Fatalf("meshbox_peers{state=up} on A: got %v, want 1", got)
		}
		if got := value(t, a.m.caps.WithLabelValues("remote")); got != 2 {
			t.Fatalf("meshbox_capabilities{where=remote} on A: got %v, want 2", got)
		}
		if got := value(t, a.m.messages.WithLabelValues(TypeHello, "in")); got != 1 {
			t.Fatalf("hello in on A: got %v, want 1", got)
		}
	})
}

// There is no periodic broadcast query: a peer whose answers were lost at
// start is asked again, alone, as soon as the node hears from it (here its
// heartbeat).
func TestPeerThatMissedStartIsAskedWhenHeard(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a := h.node("A", nil)
		b := h.node("B", nil, "cap.beta")
		// Nothing B says reaches A until it is let through.
		for _, typ := range []string{"hello", "heartbeat", "info", "query", "ping"} {
			b.link.setDrop(typ, true)
		}
		h.start(b)
		h.start(a)
		h.advance(25 * time.Second)
		if a.hasPeer("B") {
			t.Fatalf("A knows B before B answered: %+v", a.peer(t, "B"))
		}
		b.link.setDrop("info", false)
		b.link.setDrop("heartbeat", false)
		h.advance(5 * time.Second) // B's next heartbeat
		if got := a.peer(t, "B"); got.State != StateUp || !slices.Equal(got.Capabilities, []string{"beta"}) {
			t.Fatalf("after hearing from B: got %+v, want B up with [beta]", got)
		}
		wantRoutes(t, a, map[string][]string{"beta": {"B"}})
		if !slices.Contains(a.link.sentKeys(), "to.B.sys.query") {
			t.Fatalf("A sent %v, want an addressed query to B", a.link.sentKeys())
		}
	})
}

func TestCapabilityAppearsAndDisappears(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a := h.node("A", nil)
		b := h.node("B", nil)
		h.start(a, b)
		wantRoutes(t, a, map[string][]string{})

		b.setLocal("cap.echo", "cap.x", "_INBOX.abc", "cap.*", "cap.>", "work.>")
		h.settle() // B announces at once, A routes
		wantRoutes(t, a, map[string][]string{"echo": {"B"}, "x": {"B"}})
		if got := b.Capabilities().Local; !slices.Equal(got, []string{"echo", "x"}) {
			t.Fatalf("B local: got %v, want [echo x] (wildcards do not host)", got)
		}
		if got := value(t, b.m.messages.WithLabelValues(TypeUpdate, "out")); got != 1 {
			t.Fatalf("updates sent by B: got %v, want 1", got)
		}

		b.setLocal("cap.x")
		h.settle()
		wantRoutes(t, a, map[string][]string{"x": {"B"}})
		b.link.mu.Lock()
		lastLocal := b.link.local[len(b.link.local)-1]
		b.link.mu.Unlock()
		if got := lastLocal; !slices.Equal(got, []string{"x"}) {
			t.Fatalf("B's OnLocalChange: got %v, want [x]", got)
		}
	})
}

func TestLostUpdateHealsByHeartbeatHash(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a := h.node("A", nil)
		b := h.node("B", nil, "cap.one")
		h.start(a, b)
		b.link.setDrop("update", true)
		b.setLocal("cap.one", "cap.two")
		h.settle()
		wantRoutes(t, a, map[string][]string{"one": {"B"}})
		// B's next heartbeat carries a hash A does not know: A asks B alone.
		h.advance(5 * time.Second)
		wantRoutes(t, a, map[string][]string{"one": {"B"}, "two": {"B"}})
		if !slices.Contains(a.link.sentKeys(), "to.B.sys.query") {
			t.Fatalf("A sent %v, want an addressed query to B", a.link.sentKeys())
		}
	})
}

func TestHeartbeatTimeoutGoneAndBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a := h.node("A", nil)
		b := h.node("B", nil, "cap.x")
		c := h.node("C", nil, "cap.x", "cap.only-c")
		h.start(a, b, c)
		wantRoutes(t, a, map[string][]string{"x": {"B", "C"}, "only-c": {"C"}})
		lastSeen := a.peer(t, "C").LastSeen

		// C dies: nothing it sends arrives any more.
		c.link.setCut(true)
		h.advance(15 * time.Second) // exactly 3 intervals of silence: not yet
		wantState(t, a, "C", StateUp)
		h.advance(time.Second)
		p := wantState(t, a, "C", StateGone)
		if p.Reason != "missed 3 heartbeats" {
			t.Fatalf("gone reason: got %q, want %q", p.Reason, "missed 3 heartbeats")
		}
		wantState(t, a, "B", StateUp)
		wantRoutes(t, a, map[string][]string{"x": {"B"}})
		if since, ok := a.link.Gone()["C"]; !ok || !since.Equal(lastSeen) {
			t.Fatalf("A's link gone marks: got %v, want C since %v", a.link.Gone(), lastSeen)
		}
		if got := value(t, a.m.peers.WithLabelValues(StateGone)); got != 1 {
			t.Fatalf("meshbox_peers{state=gone}: got %v, want 1", got)
		}

		// C is back (same run, or a restart: both work).
		c.link.setCut(false)
		h.advance(5 * time.Second)
		wantState(t, a, "C", StateUp)
		wantRoutes(t, a, map[string][]string{"x": {"B", "C"}, "only-c": {"C"}})
		if _, ok := a.link.Gone()["C"]; ok {
			t.Fatalf("A's link still marks C gone: %v", a.link.Gone())
		}
	})
}

func TestPeerRestartReplacesRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a := h.node("A", nil)
		c1 := h.node("C", nil, "cap.old")
		h.start(a, c1)
		wantRoutes(t, a, map[string][]string{"old": {"C"}})

		// C is killed (no bye) and a new process with the same name starts.
		c1.link.setCut(true)
		h.remove(c1)
		time.Sleep(2 * time.Second)
		// The new run is a meshbox that advertises no version (a downgrade):
		// the old run's version must not stick to it.
		c2 := h.node("C", func(c *Config) { c.StartedAt = time.Now(); c.Version = "" }, "cap.new")
		h.start(c2)
		p := wantState(t, a, "C", StateUp)
		if !p.StartedAt.Equal(time.Now()) || !slices.Equal(p.Capabilities, []string{"new"}) || p.Version != "" {
			t.Fatalf("A's record of restarted C: got %+v, want the new run with [new] and no version", p)
		}
		wantRoutes(t, a, map[string][]string{"new": {"C"}})

		// A late message from the old run changes nothing.
		old := Message{V: 1, Type: TypeUpdate, Node: "C", StartedAt: c1.cfg.StartedAt, Seq: 99, Capabilities: []string{"old"}}
		body, _ := EncodeMessage(&old)
		a.HandleSystem(old.Type, body, "C")
		h.settle()
		wantRoutes(t, a, map[string][]string{"new": {"C"}})
		if got := value(t, a.m.rejected.WithLabelValues("stale")); got != 1 {
			t.Fatalf("rejected{stale}: got %v, want 1", got)
		}
	})
}

func TestByeMarksGoneAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a := h.node("A", nil)
		b := h.node("B", nil, "cap.x")
		h.start(a, b)
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		h.settle()
		p := wantState(t, a, "B", StateGone)
		if p.Reason != "left" {
			t.Fatalf("reason: got %q, want left", p.Reason)
		}
		wantRoutes(t, a, map[string][]string{})
		if _, ok := a.link.Gone()["B"]; !ok {
			t.Fatalf("A's link gone marks: got %v, want B", a.link.Gone())
		}
		if keys := b.link.sentKeys(); keys[len(keys)-1] != "sys.bye" {
			t.Fatalf("B's last message: got %v, want sys.bye", keys)
		}
	})
}

func TestLocalWinsForPlainCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a := h.node("A", nil, "cap.echo")
		b := h.node("B", nil, "cap.echo", "cap.other")
		h.start(a, b)
		wantRoutes(t, a, map[string][]string{"other": {"B"}})
		if got := a.Capabilities().Remote["echo"]; !slices.Equal(got, []string{"B"}) {
			t.Fatalf("A's remote hosts of echo: got %v, want [B] (status lists every host)", got)
		}
		// The local host stops: calls now need the stand-in.
		a.setLocal()
		h.settle()
		wantRoutes(t, a, map[string][]string{"echo": {"B"}, "other": {"B"}})
		// It comes back: the stand-in is withdrawn again.
		a.setLocal("cap.echo")
		h.settle()
		wantRoutes(t, a, map[string][]string{"other": {"B"}})
	})
}

func TestCallsSpreadOverLiveHosts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a := h.node("A", nil)
		b := h.node("B", nil, "cap.echo")
		c := h.node("C", nil, "cap.echo")
		h.start(a, b, c)
		wantRoutes(t, a, map[string][]string{"echo": {"B", "C"}})
		b.link.setCut(true)
		h.advance(16 * time.Second)
		wantRoutes(t, a, map[string][]string{"echo": {"C"}})
	})
}

func TestExpectedButAbsent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a := h.node("A", func(c *Config) { c.GoneRetention = time.Minute })
		b := h.node("B", nil)
		h.start(a, b)
		err := a.SetExpected([]string{"A", "B", "D", "bad name!"})
		if err == nil {
			t.Fatal("SetExpected with an invalid name: got nil error")
		}
		h.settle()
		if a.hasPeer("A") {
			t.Fatal("A lists itself as a peer")
		}
		pb := wantState(t, a, "B", StateUp)
		if !pb.Expected {
			t.Fatalf("B: got expected=false, want true")
		}
		pd := wantState(t, a, "D", StateAbsent)
		if !pd.Expected || !pd.LastSeen.IsZero() {
			t.Fatalf("D: got %+v, want expected, never seen", pd)
		}
		if got := value(t, a.m.peers.WithLabelValues(StateAbsent)); got != 1 {
			t.Fatalf("meshbox_peers{state=expected-but-absent}: got %v, want 1", got)
		}

		// D appears, then is killed: it is gone, not absent.
		d := h.node("D", func(c *Config) { c.StartedAt = time.Now() })
		h.start(d)
		wantState(t, a, "D", StateUp)
		d.link.setCut(true)
		h.advance(16 * time.Second)
		wantState(t, a, "D", StateGone)

		// Expected peers are never forgotten; others are, after the retention.
		if err := a.SetExpected([]string{"D"}); err != nil {
			t.Fatal(err)
		}
		b.link.setCut(true)
		h.advance(16 * time.Second)
		wantState(t, a, "B", StateGone)
		h.advance(time.Minute)
		if a.hasPeer("B") {
			t.Fatalf("unexpected gone peer B still listed after the retention: %+v", a.Peers())
		}
		if _, ok := a.link.Gone()["B"]; ok {
			t.Fatal("forgotten peer B still marked gone on the link")
		}
		wantState(t, a, "D", StateGone)

		// Dropping nodes from the records: an absent one is removed at
		// once; a gone one is no longer kept, and D has been gone for
		// longer than the retention.
		if err := a.SetExpected([]string{"E"}); err != nil {
			t.Fatal(err)
		}
		h.settle()
		wantState(t, a, "E", StateAbsent)
		if a.hasPeer("D") {
			t.Fatalf("D, gone for longer than the retention, still listed after it left the node records: %+v", a.Peers())
		}
		if err := a.SetExpected(nil); err != nil {
			t.Fatal(err)
		}
		if a.hasPeer("E") {
			t.Fatal("E still listed after it left the node records")
		}
	})
}

func TestBroadcastFailureSuspendsExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a := h.node("A", nil)
		b := h.node("B", nil, "cap.x")
		h.start(a, b)

		// A loses the broker: its publishes fail and nothing reaches it.
		a.link.setFail(errBrokerAway)
		h.remove(a)
		h.advance(time.Minute)
		wantState(t, a, "B", StateUp)
		if got := value(t, a.m.errors.WithLabelValues("publish")); got == 0 {
			t.Fatal("meshbox_discovery_errors_total{op=publish}: got 0, want > 0")
		}

		// The broker is back, but B died meanwhile: A asks again, and judges
		// B's silence from the moment it could hear B again.
		b.link.setCut(true)
		a.link.setFail(nil)
		h.mesh.mu.Lock()
		h.mesh.nodes["A"] = a.Node
		h.mesh.mu.Unlock()
		n := len(a.link.sentKeys())
		// A does not poll the link: until its next heartbeat it stays
		// quiet, and the link's report that it connected wakes it at once.
		h.settle()
		if keys := a.link.sentKeys()[n:]; len(keys) != 0 {
			t.Fatalf("before the link reported itself up A sent %v, want nothing", keys)
		}
		a.LinkUp()
		h.settle()
		keys := a.link.sentKeys()[n:]
		if !slices.Contains(keys, "sys.hello") {
			t.Fatalf("right after the link came up A sent %v, want a hello", keys)
		}
		wantState(t, a, "B", StateUp)
		h.advance(15 * time.Second)
		wantState(t, a, "B", StateUp)
		h.advance(time.Second)
		wantState(t, a, "B", StateGone)
	})
}

// A node whose link is not connected (a standalone node has no broker at
// all) does not wake to fail a publish at every heartbeat and probe: it
// waits for the link to report itself up, and then discovers at once and
// heartbeats again.
func TestWaitsForLinkUpWhileNotConnected(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		var connected atomic.Bool
		a := h.node("A", func(c *Config) { c.Connected = connected.Load })
		a.link.setFail(errBrokerAway)
		h.start(a)
		if a.link.attemptCount() == 0 {
			t.Fatal("A tried nothing at its start, want its hello")
		}
		n := a.link.attemptCount()
		h.advance(10 * time.Minute)
		if got := a.link.attemptCount() - n; got != 0 {
			t.Fatalf("while its link was not connected A tried %d sends in 10 minutes, want 0", got)
		}

		connected.Store(true)
		a.link.setFail(nil)
		a.LinkUp()
		h.settle()
		keys := a.link.sentKeys()
		if !slices.Contains(keys, "sys.hello") {
			t.Fatalf("right after the link came up A sent %v, want a hello", keys)
		}
		n = len(keys)
		h.advance(time.Minute)
		beats := 0
		for _, k := range a.link.sentKeys()[n:] {
			if k == "sys."+TypeHeartbeat {
				beats++
			}
		}
		if beats < 8 {
			t.Fatalf("heartbeats in the minute after the link came up: got %d, want about 12", beats)
		}
	})
}

// A link that is connected but failed a publish gets no LinkUp: the node
// tries again at its next heartbeat.
func TestRetriesAtHeartbeatWhileConnected(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a := h.node("A", func(c *Config) { c.Connected = func() bool { return true } })
		a.link.setFail(errBrokerAway)
		h.start(a)
		n := a.link.attemptCount()
		h.advance(time.Minute)
		if got := a.link.attemptCount() - n; got < 8 {
			t.Fatalf("sends tried in a minute while publishing failed on a connected link: got %d, want about 12 (one per heartbeat)", got)
		}
	})
}

func TestBadWireInputIsDroppedAndCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a := h.node("A", nil)
		h.start(a)
		good := func(m Message) []byte {
			b, err := EncodeMessage(&m)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
		now := time.Now()
		inputs := []struct {
			key, origin string
			body        []byte
			reason      string
		}{
			{"hello", "", []byte("not json"), "malformed"},
			{"hello", "", nil, "malformed"},
			{"hello", "", make([]byte, MaxMessageBytes+1), "too_large"},
			{"hello", "", good(Message{V: ProtocolVersion + 1, Type: TypeHello, Node: "X", StartedAt: now}), "version"},
			{"ping", "", good(Message{V: 1, Type: TypePing, Node: "X", To: "A", StartedAt: now}), "unknown_type"},
			{"shout", "", good(Message{V: 1, Type: "shout", Node: "X", StartedAt: now}), "unknown_type"},
			{"hello", "", good(Message{V: 1, Type: TypeHello, Node: "X Y", StartedAt: now}), "bad_name"},
			{"hello", "Z", good(Message{V: 1, Type: TypeHello, Node: "X", StartedAt: now}), "origin_mismatch"},
			{"update", "", good(Message{V: 1, Type: TypeHello, Node: "X", StartedAt: now}), "key_mismatch"},
			{"hello", "", good(Message{V: 1, Type: TypeHello, Node: "X", StartedAt: now, Capabilities: make([]string, MaxCapabilities+1)}), "too_many"},
			{"hello", "", good(Message{V: 1, Type: TypeHello, Node: "X", StartedAt: now, Capabilities: []string{"ok", "cap.>"}}), "bad_name"},
			{"hello", "", good(Message{V: 1, Type: TypeHello, Node: "X"}), "bad_field"},
		}
		for _, in := range inputs {
			before := value(t, a.m.rejected.WithLabelValues(in.reason))
			a.HandleSystem(in.key, in.body, in.origin)
			if got := value(t, a.m.rejected.WithLabelValues(in.reason)); got != before+1 {
				t.Errorf("%s %.40q: rejected{%s}: got %v, want %v", in.key, in.body, in.reason, got, before+1)
			}
		}
		h.settle()
		if got := a.Peers(); len(got) != 0 {
			t.Fatalf("peers after bad input: got %+v, want none", got)
		}

		// Our own broadcast coming back is ignored silently; another process
		// with our name is counted.
		a.HandleSystem("heartbeat", good(Message{V: 1, Type: TypeHeartbeat, Node: "A", StartedAt: a.cfg.StartedAt}), "A")
		a.HandleSystem("heartbeat", good(Message{V: 1, Type: TypeHeartbeat, Node: "A", StartedAt: now.Add(time.Hour)}), "A")
		if got := value(t, a.m.rejected.WithLabelValues("name_conflict")); got != 1 {
			t.Fatalf("rejected{name_conflict}: got %v, want 1", got)
		}
		// A query addressed to another node is not ours to answer.
		n := len(a.link.sentKeys())
		a.HandleSystem("query", good(Message{V: 1, Type: TypeQuery, Node: "P", To: "Q", StartedAt: now}), "P")
		h.settle()
		if got := a.link.sentKeys()[n:]; len(got) != 0 {
			t.Fatalf("A answered a query addressed to Q: sent %v", got)
		}
		// A nil node drops everything.
		var nilNode *Node
		nilNode.HandleSystem("hello", nil, "")
	})
}

func TestTooManyPeers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a := h.node("A", nil)
		h.start(a)
		now := time.Now()
		a.mu.Lock()
		for i := range maxPeers {
			name := fmt.Sprintf("p%d", i)
			a.peers[name] = &peer{name: name, state: StateGone, since: now, expected: true}
		}
		a.mu.Unlock()
		body, _ := EncodeMessage(&Message{V: 1, Type: TypeHeartbeat, Node: "newcomer", StartedAt: now})
		a.HandleSystem("heartbeat", body, "newcomer")
		if got := value(t, a.m.rejected.WithLabelValues("too_many_peers")); got != 1 {
			t.Fatalf("rejected{too_many_peers}: got %v, want 1", got)
		}
	})
}

func TestLifecycle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a := h.node("A", nil)
		if err := a.Close(); err != nil {
			t.Fatalf("close before start: %v", err)
		}
		if err := a.Close(); err != nil {
			t.Fatalf("second close: %v", err)
		}
		if err := a.Start(context.Background()); !errors.Is(err, ErrClosed) {
			t.Fatalf("start after close: got %v, want ErrClosed", err)
		}
		if got := a.link.sentKeys(); len(got) != 0 {
			t.Fatalf("a node never started sent %v", got)
		}

		b := h.node("B", nil)
		h.start(b)
		if err := b.Start(context.Background()); !errors.Is(err, ErrStarted) {
			t.Fatalf("second start: got %v, want ErrStarted", err)
		}

		// A bye that cannot be sent does not hold Close up for long.
		d := h.node("D", nil)
		h.start(d)
		d.link.setBlock(true)
		start := time.Now()
		if err := d.Close(); err != nil {
			t.Fatalf("close with the broker away: %v", err)
		}
		if el := time.Since(start); el != byeTimeout {
			t.Fatalf("close with a publish that never returns took %v, want %v", el, byeTimeout)
		}
	})
}

func TestConfigValidation(t *testing.T) {
	link := &fakeLink{}
	tests := []struct {
		name  string
		mod   func(*Config)
		field string
	}{
		{"ok", func(*Config) {}, ""},
		{"name", func(c *Config) { c.Name = "a.b" }, "Name"},
		{"empty name", func(c *Config) { c.Name = "" }, "Name"},
		{"link", func(c *Config) { c.Link = nil }, "Link"},
		{"version", func(c *Config) { c.Version = "1\n2" }, "Version"},
		{"negative interval", func(c *Config) { c.DiscoveryInterval = -1 }, "DiscoveryInterval"},
		{"tiny heartbeat", func(c *Config) { c.HeartbeatInterval = time.Millisecond }, "HeartbeatInterval"},
		{"missed", func(c *Config) { c.MissedHeartbeats = 101 }, "MissedHeartbeats"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{Name: "n1", Link: link}
			tt.mod(&cfg)
			_, err := New(cfg)
			var ce *ConfigError
			switch {
			case tt.field == "" && err != nil:
				t.Fatalf("got %v, want no error", err)
			case tt.field != "" && (!errors.As(err, &ce) || ce.Field != tt.field):
				t.Fatalf("got %v, want a ConfigError for %s", err, tt.field)
			case tt.field != "" && !errors.Is(err, ErrConfig):
				t.Fatalf("got %v, want it to wrap ErrConfig", err)
			}
		})
	}
	n, err := New(Config{Name: "n1", Link: link})
	if err != nil {
		t.Fatal(err)
	}
	if n.cfg.DiscoveryInterval != 5*time.Second || n.cfg.HeartbeatBudget != 5000 || n.cfg.HeartbeatInterval != 5*time.Minute || n.cfg.MissedHeartbeats != 3 {
		t.Fatalf("defaults: got %+v", n.cfg)
	}
}

// The loop sleeps until its next deadline, whatever it is: a peer whose
// heartbeat interval is far shorter than ours is gone as soon as its own
// window has passed, not at our next heartbeat.
func TestShortPeerWindowExpiresOnTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a := h.node("A", nil)
		b := h.node("B", func(c *Config) { c.HeartbeatInterval = 100 * time.Millisecond }, "cap.x")
		h.start(a, b)
		wantState(t, a, "B", StateUp)
		b.link.setCut(true)
		h.advance(300 * time.Millisecond) // exactly 3 of B's intervals: not yet
		wantState(t, a, "B", StateUp)
		h.advance(time.Millisecond)
		if p := wantState(t, a, "B", StateGone); p.Since.Sub(p.LastSeen) > 300*time.Millisecond+time.Microsecond {
			t.Fatalf("B gone %v after it was last seen, want just past its 300ms window", p.Since.Sub(p.LastSeen))
		}
	})
}
