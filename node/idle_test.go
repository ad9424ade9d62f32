package node

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"
)

// What an idle node sends and hears at the default configuration, counted
// message by message over an hour: a probe of each of its two ring
// successors every probe interval, which reaches no node, and a heartbeat
// every heartbeat interval, and nothing else; it hears its peers'
// heartbeats and nothing else, and no more of them a second in a mesh of
// 20 than in one of 10. A killed peer is still noticed by every node
// within one probe interval.
func TestIdleTraffic(t *testing.T) {
	const window = time.Hour
	heard := map[int]float64{} // heartbeats a node hears per second, by mesh size
	for _, size := range []int{10, 20} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t)
				defaults := func(c *Config) { c.HeartbeatInterval, c.DiscoveryInterval, c.MissedHeartbeats = 0, 0, 0 }
				var nodes []*testNode
				for i := range size {
					nodes = append(nodes, h.node(fmt.Sprintf("N%02d", i), defaults, fmt.Sprintf("cap.c%d", i)))
				}
				h.start(nodes...)
				h.advance(time.Hour) // the joins are long over

				a := nodes[0]
				sentBefore := len(a.link.sentKeys())
				inBefore := messagesIn(t, a)
				h.advance(window)
				sent := map[string]int{}
				for _, k := range a.link.sentKeys()[sentBefore:] {
					sent[k]++
				}
				in := messagesIn(t, a)
				for typ, c := range inBefore {
					in[typ] -= c
				}

				hb := HeartbeatIntervalFor(size, DefaultHeartbeatInterval, DefaultHeartbeatBudget)
				atMost := func(d time.Duration) int { return int(float64(window)/(float64(d)*(1-jitterFraction))) + 1 }
				atLeast := func(d time.Duration) int { return int(window / d) }
				want := map[string][2]int{ // key: at least, at most
					"sys.heartbeat":    {atLeast(hb), atMost(hb)},
					"to.N01.sys.probe": {atLeast(DefaultDiscoveryInterval), atMost(DefaultDiscoveryInterval)},
					"to.N02.sys.probe": {atLeast(DefaultDiscoveryInterval), atMost(DefaultDiscoveryInterval)},
				}
				for key, c := range sent {
					w, ok := want[key]
					switch {
					case !ok:
						t.Errorf("idle %s sent %d × %s in %v, want none", a.cfg.Name, c, key, window)
					case c < w[0] || c > w[1]:
						t.Errorf("idle %s sent %d × %s in %v, want %d..%d", a.cfg.Name, c, key, window, w[0], w[1])
					}
				}
				for key, w := range want {
					if sent[key] == 0 {
						t.Errorf("idle %s sent no %s in %v, want %d..%d", a.cfg.Name, key, window, w[0], w[1])
					}
				}
				for typ, c := range in {
					if typ != TypeHeartbeat && c != 0 {
						t.Errorf("idle %s took in %v × %s in %v, want none", a.cfg.Name, c, typ, window)
					}
				}
				peers := size - 1
				if c := int(in[TypeHeartbeat]); c < peers*atLeast(hb) || c > peers*atMost(hb) {
					t.Errorf("idle %s heard %d heartbeats from %d peers in %v, want %d..%d", a.cfg.Name, c, peers, window, peers*atLeast(hb), peers*atMost(hb))
				}
				heard[size] = in[TypeHeartbeat] / window.Seconds()

				victim := nodes[size/2]
				victim.link.setCut(true) // killed: says nothing more...
				h.remove(victim)         // ...and the broker dropped its queue
				killed := time.Now()
				h.advance(DefaultDiscoveryInterval)
				for _, n := range nodes {
					if n == victim {
						continue
					}
					p := wantState(t, n, victim.cfg.Name, StateGone)
					if took := p.Since.Sub(killed); p.Reason != reasonNotConnected || took > DefaultDiscoveryInterval {
						t.Errorf("%s: %s gone after %v for %q, want within %v for %q", n.cfg.Name, victim.cfg.Name, took, p.Reason, DefaultDiscoveryInterval, reasonNotConnected)
					}
				}
			})
		})
	}
	if heard[10] == 0 || heard[20] > heard[10]*1.2 {
		t.Errorf("a node hears %.4f heartbeats/s in a mesh of 20 and %.4f in one of 10: want no more with more peers", heard[20], heard[10])
	}
}

// messagesIn returns the discovery messages n took in so far, by type.
func messagesIn(t *testing.T, n *testNode) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, typ := range []string{TypeHello, TypeQuery, TypeInfo, TypeUpdate, TypeHeartbeat, TypeBye, TypePing, TypeGone} {
		out[typ] = value(t, n.m.messages.WithLabelValues(typ, "in"))
	}
	return out
}

// A change of the bindings revision brings the node's next heartbeat,
// which carries it, forward to within a probe interval; the same revision
// again changes nothing.
func TestRevisionChangeHeartbeatsSoon(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		defaults := func(c *Config) { c.HeartbeatInterval = 0 }
		a := h.node("A", defaults)
		b := h.node("B", defaults)
		h.start(a, b)
		h.advance(10 * time.Minute)
		a.SetRevision(7)
		a.mu.Lock()
		due := a.nextHeartbeat
		a.mu.Unlock()
		if wait := time.Until(due); wait > DefaultDiscoveryInterval {
			t.Fatalf("heartbeat after a revision change due in %v, want within %v", wait, DefaultDiscoveryInterval)
		}
		a.SetRevision(7)
		a.mu.Lock()
		again := a.nextHeartbeat
		a.mu.Unlock()
		if !again.Equal(due) {
			t.Fatalf("the same revision again moved the heartbeat from %v to %v", due, again)
		}
		h.advance(DefaultDiscoveryInterval)
		if got := b.peer(t, "A").Revision; got != 7 {
			t.Fatalf("B's view of A's revision: got %d, want 7", got)
		}
	})
}
