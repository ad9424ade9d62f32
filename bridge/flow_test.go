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
	for i := 0; i < f.window; i++ {
		f.answered(lat)
		f.delivered() // the broker sends the next one at once
	}
	for range inflight {
		f.gone()
	}
	return f.wanted()
}

func TestStageFlowGrowsOnlyWhenSaturatedAndQuick(t *testing.T) {
	f := newStageFlow("s", 32, 1, 256)
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
	f := newStageFlow("s", 32, 1, 256)
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
	f := newStageFlow("s", 32, 1, 256)
	for range 3 {
		window(f, f.wanted()*32, 50*time.Millisecond)
	}
	if got := f.wanted(); got != 8 {
		t.Fatalf("consumers of a parallel handler after 3 saturated windows: got %d, want 8", got)
	}
}

// With batches of 4, a consumer takes 8 messages (Prefetch/CommandBatch):
// a slow node holds about Prefetch commands, as without batches, and a
// quick one may open MaxStagePrefetch/8 consumers. Saturation is judged
// in commands: 8 consumers' worth of batches in flight is saturated.
func TestStageFlowCountsCreditInCommands(t *testing.T) {
	f := newStageFlow("s", 32, 4, 256)
	if f.prefetch != 8 || f.max != 32 {
		t.Fatalf("prefetch %d messages, at most %d consumers; want 8 and 32", f.prefetch, f.max)
	}
	batched := func(inflight int, lat time.Duration) int {
		for range inflight / 4 {
			f.deliveredMsg(4)
		}
		return window(f, inflight, lat)
	}
	if got := batched(8, time.Millisecond); got != 1 {
		t.Fatalf("consumers after 8 commands in flight of a credit of 32: got %d, want 1", got)
	}
	if got := batched(32, time.Millisecond); got != 2 {
		t.Fatalf("consumers after a window saturated in commands (32 of 32): got %d, want 2", got)
	}
	if fixed := newStageFlow("s", 64, 4, 64); fixed.max != 1 || fixed.prefetch != 16 {
		t.Fatalf("a fixed credit of 64: %d consumers of %d messages, want 1 of 16 (one consumer keeps the order)", fixed.max, fixed.prefetch)
	}
	slow := newStageFlow("s", 32, 4, 256)
	slow.deliveredMsg(4)
	slow.delivered()
	slow.answered(50 * time.Millisecond)
	for range 10 {
		for range 8 {
			slow.deliveredMsg(4)
		}
		window(slow, 32, 32*50*time.Millisecond)
	}
	if got := slow.wanted(); got != 1 {
		t.Fatalf("consumers of a slow serial handler with batches: got %d, want 1", got)
	}
}
