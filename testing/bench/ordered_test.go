package bench

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats.go"
)

// orderedDelays are the delays each way between node and broker at which
// BenchmarkOrdered measures: loopback, and home links of 20, 50 and 80 ms
// round trips.
var orderedDelays = []time.Duration{0, 10 * time.Millisecond, 25 * time.Millisecond, 40 * time.Millisecond}

// BenchmarkOrdered measures ordered handling as a function of the link's
// round trip to the broker. A handler that must see a stage's commands
// one at a time in queue order has two ways:
//
//   - credit 1 (bridge.prefetch, bridge.max_stage_prefetch and
//     bridge.command_batch 1 on the handling node, command_batch 1 on the
//     submitting one: a batch's commands go to the handler side by
//     side): the broker hands the
//     next command only once the ack of the last one reached it, one
//     round trip per command;
//   - Meshbox-Order-Key on each command, at the default credit: the node
//     holds many commands and hands the next of a key as soon as the
//     handler answered the last, without a round trip.
//
// For each delay of orderedDelays it queues commands (about 3 s of
// credit-1 handling) and prints
//
//	BENCH ordered-credit1-rtt<ms> ours=<cmd/s> baseline=<1/rtt> ratio=…
//	BENCH ordered-key-rtt<ms> ours=<cmd/s> baseline=<credit-1 figure> ratio=…
//
// the first against its ceiling of one command per round trip, the second
// (one key: every command in one order) against the first.
func BenchmarkOrdered(b *testing.B) {
	w := newWANMesh(b, "ord-a", "ord-a1", "ord-b", "ord-k")
	nodeA := w.start(b, "ord-a")
	credit1 := func(c *appliance.Config) {
		c.Bridge.Prefetch, c.Bridge.MaxStagePrefetch, c.Bridge.CommandBatch = 1, 1, 1
	}
	nodeA1 := w.start(b, "ord-a1", credit1) // no batches: one command per message
	serial := w.start(b, "ord-b", credit1)
	keyed := w.start(b, "ord-k")
	for range b.N {
		for _, d := range orderedDelays {
			for _, side := range []string{"ord-a", "ord-a1", "ord-b", "ord-k"} {
				w.proxies[side].Delay(b, d)
			}
			rtt := 2 * d
			n := int(3 * time.Second / (rtt + 2*time.Millisecond))
			n = min(max(n, 60), 2000)
			one := orderedRate(b, nodeA1, serial, "ord-serial", n, "")
			ms := strconv.Itoa(int(rtt.Milliseconds()))
			ceiling := 0.0
			if rtt > 0 {
				ceiling = 1 / rtt.Seconds()
			}
			report("ordered-credit1-rtt"+ms, one, ceiling, "cmd/s",
				fmt.Sprintf("commands handled one at a time in queue order with credit 1 (prefetch, max_stage_prefetch, command_batch 1), %v round trip to the broker; baseline: one command per round trip (none on loopback); higher is better", rtt))
			byKey := orderedRate(b, nodeA, keyed, "ord-keyed", max(n, 2000), "one-key")
			report("ordered-key-rtt"+ms, byKey, one, "cmd/s",
				fmt.Sprintf("the same order with every command under one Meshbox-Order-Key at the default credit, %v round trip; baseline: credit 1; higher is better", rtt))
		}
	}
}

// orderedRate queues n commands for stage (with the order key key, if
// set) on A while B's handler holds them back, then lets the handler go
// and returns the commands per second B handles, from its first to its
// last. (That they come in order the bridge's tests check.)
func orderedRate(b *testing.B, nodeA, nodeB *appliance.Appliance, stage string, n int, key string) float64 {
	b.Helper()
	var (
		mu      sync.Mutex
		first   time.Time
		last    time.Time
		release = make(chan struct{})
		done    = make(chan struct{})
		count   atomic.Int64
	)
	run := strconv.Itoa(int(time.Now().UnixNano()))
	sub, snc := commandHandler(b, nodeA, nodeB, stage, func(m *nats.Msg) {
		<-release
		if string(m.Data) != run {
			return // an earlier run's
		}
		mu.Lock()
		if first.IsZero() {
			first = time.Now()
		}
		last = time.Now()
		mu.Unlock()
		if count.Add(1) == int64(n) {
			close(done)
		}
	})
	defer func() { _ = sub.Unsubscribe() }()
	var wg sync.WaitGroup
	var next, failed atomic.Int64
	for range 32 {
		wg.Add(1)
		go func() { // submitter: exits when n are submitted
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				m := nats.NewMsg(wire.CommandSubject(stage))
				m.Data = []byte(run)
				if key != "" {
					m.Header.Set(wire.HeaderOrderKey, key)
				}
				resp, err := snc.RequestMsg(m, 30*time.Second)
				if err != nil || resp.Header.Get(wire.HeaderAccepted) == "" {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if f := failed.Load(); f != 0 {
		b.Fatalf("%d of %d commands not accepted", f, n)
	}
	close(release)
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		b.Fatalf("after 2m: %d of %d handled", count.Load(), n)
	}
	mu.Lock()
	defer mu.Unlock()
	return float64(n-1) / last.Sub(first).Seconds()
}
