package cache

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// revFakeSource is a fakeSource that can read the revision alone.
type revFakeSource struct {
	*fakeSource
	revReads int
}

func (f *revFakeSource) Revision(ctx context.Context) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.revReads++
	if f.down {
		return 0, errDown
	}
	return f.rev, nil
}

// bigBindings is testBindings in a mesh of nodes node records.
func bigBindings(i, nodes int) Bindings {
	b := testBindings(i)
	for k := len(b.Nodes); k < nodes; k++ {
		b.Nodes = append(b.Nodes, NodeRecord{Name: fmt.Sprintf("n%04d", k)})
	}
	return b
}

func newSpreadManager(tb testing.TB, src Source, maxDelay time.Duration) *Manager {
	tb.Helper()
	m, err := NewManager(ManagerConfig{
		Node: "n1", Store: openStore(tb, StoreOptions{}), Source: src, MaxNotifyDelay: maxDelay,
		Logger: slog.New(slog.DiscardHandler), Metrics: prometheus.NewRegistry(),
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = m.Close() })
	if err := m.Start(context.Background()); err != nil {
		tb.Fatal(err)
	}
	synctest.Wait()
	return m
}

// After a notification a node of a large mesh waits a random part of a
// second before it reloads; notifications during the wait join it.
func TestNotifyReloadIsSpread(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &fakeSource{rev: 1, b: bigBindings(1, 1000)}
		m := newSpreadManager(t, src, time.Second)
		src.mu.Lock()
		loads := src.loads
		src.mu.Unlock()
		notified := time.Now()
		src.set(2, bigBindings(2, 1000))
		src.set(3, bigBindings(3, 1000))
		for {
			synctest.Wait()
			if c, _ := m.Current(); c.Revision == 3 {
				break
			}
			if time.Since(notified) > time.Second {
				t.Fatalf("not reloaded within the 1s spread")
			}
			time.Sleep(time.Millisecond)
		}
		if took := time.Since(notified); took == 0 || took > time.Second {
			t.Fatalf("reloaded %v after the notification, want within (0, 1s]", took)
		}
		src.mu.Lock()
		defer src.mu.Unlock()
		if got := src.loads - loads; got != 1 {
			t.Fatalf("loads for two notifications in one wait: got %d, want 1", got)
		}
	})
}

// The spread grows with the mesh: a few milliseconds for a handful of
// nodes, up to the bound for 1,000 and more.
func TestNotifyDelayBounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, tt := range []struct {
			nodes    int
			maxDelay time.Duration
			bound    time.Duration
		}{
			{2, time.Second, 2 * time.Millisecond},
			{100, time.Second, 100 * time.Millisecond},
			{1000, time.Second, time.Second},
			{5000, 2 * time.Second, 2 * time.Second},
			{1000, -1, 0},
		} {
			src := &fakeSource{rev: 1, b: bigBindings(1, tt.nodes)}
			m := newSpreadManager(t, src, tt.maxDelay)
			var hi time.Duration
			for range 2000 {
				d := m.notifyDelay()
				if d < 0 || (tt.bound == 0 && d != 0) || (tt.bound > 0 && d >= tt.bound) {
					t.Fatalf("%d nodes, max %v: delay %v, want in [0, %v)", tt.nodes, tt.maxDelay, d, tt.bound)
				}
				hi = max(hi, d)
			}
			if hi < tt.bound/2 {
				t.Fatalf("%d nodes: delays up to %v only, want spread over [0, %v)", tt.nodes, hi, tt.bound)
			}
		}
	})
}

// A reload that finds, by the revision alone, the bindings it runs skips
// the full load; a new revision loads.
func TestReloadSkippedWhenRevisionCurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &revFakeSource{fakeSource: &fakeSource{rev: 1, b: testBindings(1)}}
		m := newSpreadManager(t, src, -1)
		src.mu.Lock()
		loads := src.loads
		changed := src.changed
		src.mu.Unlock()
		checks := metricValue(t, m.metrics.revisionChecks)
		changed() // a reconnect of the listening connection: nothing new
		synctest.Wait()
		src.mu.Lock()
		if src.loads != loads || src.revReads == 0 {
			t.Fatalf("after a notification at the same revision: %d loads, %d revision reads; want no load, a revision read", src.loads-loads, src.revReads)
		}
		src.mu.Unlock()
		if got := metricValue(t, m.metrics.revisionChecks) - checks; got != 1 {
			t.Fatalf("revision_checks_total grew by %v, want 1", got)
		}
		if st := m.Status(); st.DB != DBConnected || st.Source != SourceDB {
			t.Fatalf("status after a revision check: %+v", st)
		}
		src.set(2, testBindings(2))
		synctest.Wait()
		if c, _ := m.Current(); c.Revision != 2 {
			t.Fatalf("revision after a change: got %d, want 2", c.Revision)
		}
		src.mu.Lock()
		defer src.mu.Unlock()
		if src.loads != loads+1 {
			t.Fatalf("loads after a change: got %d, want 1", src.loads-loads)
		}
	})
}
