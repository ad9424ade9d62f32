package appliance

import (
	"slices"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/node"
)

// TestTrendRing: the ring keeps the last max samples, oldest first, as
// columns of one length; rates are per second since the sample before,
// never negative, and 0 for the first.
func TestTrendRing(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	r := newTrendRing(3)
	if v := r.view(trendEvery); len(v.At) != 0 || v.EverySeconds != 5 {
		t.Fatalf("empty ring: got %+v, want no samples, every 5 s", v)
	}
	for i, s := range []trendSample{
		{outbox: 1, broker: "connecting", carried: [3]float64{0, 0, 0}},
		{outbox: 2, broker: "connected", carried: [3]float64{50, 10, 5}},
		{outbox: 3, broker: "connected", carried: [3]float64{100, 10, 30}},
		{outbox: 4, broker: "offline", carried: [3]float64{90, 20, 30}}, // a counter that went back
	} {
		s.at = t0.Add(time.Duration(i) * trendEvery)
		s.rowsPending, s.peersUp = 10*i, i
		r.add(s)
	}
	v := r.view(trendEvery)
	cols := []int{len(v.At), len(v.Outbox), len(v.Requests), len(v.Commands), len(v.Events), len(v.RowsPending), len(v.PeersUp), len(v.Broker)}
	if slices.ContainsFunc(cols, func(n int) bool { return n != 3 }) {
		t.Fatalf("columns: lengths %v, want 3 each (the last 3 samples)", cols)
	}
	if v.At[0] != t0.Add(trendEvery).UnixMilli() || !slices.Equal(v.Outbox, []int64{2, 3, 4}) ||
		!slices.Equal(v.Broker, []string{"connected", "connected", "offline"}) ||
		!slices.Equal(v.RowsPending, []int{10, 20, 30}) || !slices.Equal(v.PeersUp, []int{1, 2, 3}) {
		t.Errorf("samples: got %+v, want the last three, oldest first", v)
	}
	// 50 requests, 10 commands and 5 events in 5 s, then 50, 0, 25, then
	// requests back by 10 (none), 10 commands, no events.
	if !slices.Equal(v.Requests, []float64{10, 10, 0}) || !slices.Equal(v.Commands, []float64{2, 0, 2}) || !slices.Equal(v.Events, []float64{1, 5, 0}) {
		t.Errorf("rates: requests %v commands %v events %v, want [10 10 0] [2 0 2] [1 5 0]", v.Requests, v.Commands, v.Events)
	}
}

// TestSampleOf: a sample takes the outbox, the pending rows of every table,
// the peers that are up and the broker link's state from the status.
func TestSampleOf(t *testing.T) {
	st := Status{
		Outbox: bridge.OutboxStatus{Depth: 7},
		Broker: bridge.BrokerStatus{LinkStatus: bridge.LinkStatus{State: bridge.StateOffline}},
		Rows:   []rows.TableStatus{{Pending: 2}, {Pending: 3}},
		Peers:  []node.Peer{{Name: "a", State: node.StateUp}, {Name: "b", State: node.StateGone}, {Name: "c", State: node.StateUp}},
	}
	now := time.Now()
	s := sampleOf(st, nil, now)
	if s.outbox != 7 || s.rowsPending != 5 || s.peersUp != 2 || s.broker != bridge.StateOffline || !s.at.Equal(now) {
		t.Errorf("sample: got %+v, want outbox 7, 5 rows pending, 2 peers up, offline", s)
	}
}
