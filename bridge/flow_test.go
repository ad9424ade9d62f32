package bridge

import (
	"testing"
	"time"
)

// window feeds f one window of answers of latency lat, with at most
// inflight deliveries at the handler at once, and returns want.
func window(f *stageFlow, inflight int, lat time.Duration) int {
	for range inflight {
		f.delivered()
	}
	for i := 0; i < f.prefetch; i++ {
		f.answered(lat)
		f.delivered() // the broker sends the next one at once
	}
	for range inflight {
		f.gone()
	}
	return f.wanted()
}

func TestStageFlowGrowsOnlyWhenSaturatedAndQuick(t *testing.T) {
	f := newStageFlow("s", 32, 256)
	if got := window(f, 8, time.Millisecond); got != 1 {
		t.Fatalf("consumers after a window far from saturated: got %d, want 1", got)
	}
	for _, want := range []int{2, 4, 8} {
		if got := window(f, f.wanted()*32, time.Millisecond); got != want {
			t.Fatalf("consumers after a saturated, quick window: got %d, want %d", got, want)
		}
	}
	if got := window(f, 8*32, time.Millisecond); got != 8 {
		t.Fatalf("consumers beyond MaxStagePrefetch/Prefetch: got %d, want 8", got)
	}
	if got := window(f, 8*32, 50*time.Millisecond); got != 8 {
		t.Fatalf("consumers after a window between quick and slow: got %d, want 8 (kept)", got)
	}
	if got := window(f, 8*32, 200*time.Millisecond); got != 4 {
		t.Fatalf("consumers after a slow window: got %d, want 4 (halved)", got)
	}
	for range 4 {
		window(f, 32, time.Second)
	}
	if got := f.wanted(); got != 1 {
		t.Fatalf("consumers after slow windows: got %d, want 1 (never fewer)", got)
	}
}

// A handler that works one command at a time, 50 ms each: its first
// answer takes 50 ms, then every delivery waits behind the consumer's
// other 31 (1.6 s). It never gains credit.
func TestStageFlowSerialSlowHandlerStaysAtOneConsumer(t *testing.T) {
	f := newStageFlow("s", 32, 256)
	f.delivered()
	f.answered(50 * time.Millisecond)
	for range 10 {
		window(f, 32, 32*50*time.Millisecond)
	}
	if got := f.wanted(); got != 1 {
		t.Fatalf("consumers of a slow serial handler: got %d, want 1", got)
	}
}

// A handler that answers in 50 ms however many commands it has (it works
// on them in parallel) gains credit while saturated: more credit is more
// throughput, not a longer wait.
func TestStageFlowParallelHandlerGains(t *testing.T) {
	f := newStageFlow("s", 32, 256)
	for range 3 {
		window(f, f.wanted()*32, 50*time.Millisecond)
	}
	if got := f.wanted(); got != 8 {
		t.Fatalf("consumers of a parallel handler after 3 saturated windows: got %d, want 8", got)
	}
}
