package bridge

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nats-io/nats.go"
	dto "github.com/prometheus/client_model/go"
)

// stallBridge is a bridge that is not started, checking stalls every 5s
// with a threshold of 30s.
func stallBridge(t *testing.T) *Bridge {
	t.Helper()
	b, err := New(Config{Node: "alpha", OutboxPath: filepath.Join(t.TempDir(), "outbox.db"), StallCheck: 5 * time.Second, StallAfter: 30 * time.Second,
		Dial: func(...nats.Option) (*nats.Conn, error) { return nil, errors.New("not started") }}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// stalledNow is the stage's stall reason ("": not stalled), checked
// against the gauge of stalled stages.
func stalledNow(t *testing.T, b *Bridge, stage string) string {
	t.Helper()
	list := b.stallList()
	var g dto.Metric
	if err := b.m.stalls.Write(&g); err != nil {
		t.Fatal(err)
	}
	if int(g.GetGauge().GetValue()) != len(list) {
		t.Errorf("meshbox_stalls %v, want %d (the stalls listed)", g.GetGauge().GetValue(), len(list))
	}
	for _, s := range list {
		if s.Stage == stage {
			return s.Reason
		}
	}
	return ""
}

// The stall rules, each on the clock of a synctest bubble: an alarm is
// raised at the second check in a row that sees its condition, and
// cleared at the first that does not.
func TestStallRules(t *testing.T) {
	t.Run("no consumer", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := stallBridge(t)
			b.observeQueue("s", 3, 0)
			if r := stalledNow(t, b, "s"); r != "" {
				t.Fatalf("after one check: stalled (%s), want not yet", r)
			}
			time.Sleep(b.cfg.StallCheck)
			b.observeQueue("s", 3, 0)
			if r := stalledNow(t, b, "s"); !strings.Contains(r, "no node consumes it") {
				t.Fatalf("after two checks: reason %q, want no node consumes it", r)
			}
			time.Sleep(b.cfg.StallCheck)
			b.observeQueue("s", 3, 1) // a consumer came; 10s without progress is below the threshold
			if r := stalledNow(t, b, "s"); r != "" {
				t.Fatalf("with a consumer: stalled (%s), want cleared at once", r)
			}
		})
	})
	t.Run("none taken", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := stallBridge(t)
			b.observeQueue("s", 3, 1)
			for range 6 { // 30s: at the threshold, not past it
				time.Sleep(b.cfg.StallCheck)
				b.observeQueue("s", 3, 1)
			}
			if r := stalledNow(t, b, "s"); r != "" {
				t.Fatalf("after 30s without progress: stalled (%s), want not yet", r)
			}
			time.Sleep(b.cfg.StallCheck)
			b.observeQueue("s", 3, 1)
			if r := stalledNow(t, b, "s"); r != "" {
				t.Fatalf("at the first check past the threshold: stalled (%s), want at the second", r)
			}
			time.Sleep(b.cfg.StallCheck)
			b.observeQueue("s", 4, 1) // growing is no progress
			if r := stalledNow(t, b, "s"); !strings.Contains(r, "none taken for 40s") {
				t.Fatalf("at the second check past the threshold: reason %q, want none taken for 40s", r)
			}
			time.Sleep(b.cfg.StallCheck)
			b.observeQueue("s", 2, 1) // one taken
			if r := stalledNow(t, b, "s"); r != "" {
				t.Fatalf("after progress: stalled (%s), want cleared", r)
			}
		})
	})
	t.Run("old deliveries", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := stallBridge(t)
			b.noteDeliveryAge("s", time.Now().Add(-40*time.Second))
			b.observeQueue("s", 1, 1)
			time.Sleep(b.cfg.StallCheck)
			b.observeQueue("s", 1, 1)
			if r := stalledNow(t, b, "s"); !strings.Contains(r, "had waited 40s") {
				t.Fatalf("reason %q, want the oldest delivery had waited 40s", r)
			}
			// No delivery measured within two checks: the age says nothing
			// any more.
			time.Sleep(b.cfg.StallCheck)
			b.observeQueue("s", 0, 1)
			if r := stalledNow(t, b, "s"); r != "" {
				t.Fatalf("10s after the last old delivery, queue empty: stalled (%s), want cleared", r)
			}
			b.noteDeliveryAge("s", time.Now().Add(-10*time.Second)) // young: no alarm
			b.observeQueue("s", 1, 1)
			time.Sleep(b.cfg.StallCheck)
			b.observeQueue("s", 1, 1)
			if r := stalledNow(t, b, "s"); r != "" {
				t.Fatalf("after a young delivery: stalled (%s), want not", r)
			}
		})
	})
}
