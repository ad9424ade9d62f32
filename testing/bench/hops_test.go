//go:build hoptrace

package bench

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/hoptrace"
)

// BenchmarkRequestHops takes the request round trip of BenchmarkBridge
// apart: where its time goes, hop by hop, next to the raw parts of its
// baseline measured in the same loop. Built only with the hoptrace tag
// (`make bench-hops`), which makes the bridge record when the request at
// hand passes each point (hoptrace.Hop); a normal build records nothing.
//
// It prints one HOPS line per stretch of the round trip (p50 over
// benchRoundTrips round trips), then
//
//	BENCH request-hops ours=<µs> baseline=<µs> ratio=<r> nats=<µs> baseline_nats=<µs> broker=<µs> baseline_broker=<µs> baseline_broker_topic=<µs> bridge=<µs>
//
// nats: the four NATS stretches of ours (programs to bridges and back),
// against two raw NATS request round trips; broker: ours' two stretches
// through the broker (from the AMQP library's write to the other bridge
// taking the message), against a raw amqp091-go RPC round trip through the
// default exchange and through a topic exchange; bridge: the time spent in
// meshbox's own code on the way (the four stretches inside the bridges).
func BenchmarkRequestHops(b *testing.B) {
	_, amqpURL, nodeA, nodeB := benchMesh(b)

	call := requestRoundTripWith(b, nodeA, nodeB, func() { hoptrace.Mark(hoptrace.HopHostHas) })
	natsRT := timed(natsRoundTrip(b, plainNATS(b)))
	rpc := timed(rawRPCRoundTrip(b, amqpURL, amqpURL, false))
	rpcTopic := timed(rawRPCRoundTrip(b, amqpURL, amqpURL, true))

	// Ours and the three raw round trips, each round in the next of the
	// balanced orders (as interleavedRounds does, and for its reason).
	stretch := make([][]time.Duration, hoptrace.HopCount)
	raw := make([][]time.Duration, 3) // NATS, RPC, RPC through a topic exchange
	rawFns := []func() (time.Duration, error){natsRT, rpc, rpcTopic}
	orders := balancedOrders(4)
	for r := range benchWarmUp + benchRoundTrips {
		for _, i := range orders[r%len(orders)] {
			if i > 0 {
				d, err := rawFns[i-1]()
				if err != nil {
					b.Fatal(err)
				}
				if r >= benchWarmUp {
					raw[i-1] = append(raw[i-1], d)
				}
				continue
			}
			hoptrace.Mark(hoptrace.HopCallerSent)
			if err := call(); err != nil {
				b.Fatal(err)
			}
			hoptrace.Mark(hoptrace.HopCallerHas)
			if r < benchWarmUp {
				continue
			}
			for h := hoptrace.HopStandIn; h < hoptrace.HopCount; h++ {
				stretch[h] = append(stretch[h], time.Duration(hoptrace.Marks[h].Load()-hoptrace.Marks[h-1].Load()))
			}
			stretch[0] = append(stretch[0], time.Duration(hoptrace.Marks[hoptrace.HopCallerHas].Load()-hoptrace.Marks[hoptrace.HopCallerSent].Load()))
		}
	}
	p50 := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
	names := map[hoptrace.Hop]string{
		hoptrace.HopStandIn:        "caller -> A's stand-in (NATS)",
		hoptrace.HopRequestWritten: "A's bridge: check, seal, hand to AMQP",
		hoptrace.HopRequestTaken:   "A -> broker -> B's bridge",
		hoptrace.HopHostAsked:      "B's bridge: open, hand to the host",
		hoptrace.HopHostHas:        "B's bridge -> host (NATS)",
		hoptrace.HopHostAnswered:   "host -> B's bridge (NATS)",
		hoptrace.HopReplyWritten:   "B's bridge: seal the reply, hand to AMQP",
		hoptrace.HopReplyTaken:     "B -> broker -> A's bridge",
		hoptrace.HopCallerAnswered: "A's bridge: open, answer the caller",
		hoptrace.HopCallerHas:      "A's bridge -> caller (NATS)",
	}
	med := make([]time.Duration, hoptrace.HopCount)
	for h := range hoptrace.HopCount {
		med[h] = p50(stretch[h])
		if h > 0 {
			fmt.Printf("HOPS %-42s p50=%.1fµs\n", names[h], us(med[h]))
		}
	}
	sum := func(hs ...hoptrace.Hop) (t time.Duration) {
		for _, h := range hs {
			t += med[h]
		}
		return t
	}
	natsOurs := sum(hoptrace.HopStandIn, hoptrace.HopHostHas, hoptrace.HopHostAnswered, hoptrace.HopCallerHas)
	brokerOurs := sum(hoptrace.HopRequestTaken, hoptrace.HopReplyTaken)
	code := sum(hoptrace.HopRequestWritten, hoptrace.HopHostAsked, hoptrace.HopReplyWritten, hoptrace.HopCallerAnswered)
	nats1, broker, brokerTopic := p50(raw[0]), p50(raw[1]), p50(raw[2])
	base := 2*nats1 + broker
	report("request-hops", us(med[0]), us(base), "µs", "a request round trip taken apart, p50 of each stretch; nats: ours' four NATS stretches against two raw NATS round trips; broker: ours' two stretches through the broker against a raw RPC round trip (default exchange; topic: through a topic exchange); bridge: meshbox's own code on the way",
		fmt.Sprintf("nats=%.1f", us(natsOurs)), fmt.Sprintf("baseline_nats=%.1f", us(2*nats1)),
		fmt.Sprintf("broker=%.1f", us(brokerOurs)), fmt.Sprintf("baseline_broker=%.1f", us(broker)),
		fmt.Sprintf("baseline_broker_topic=%.1f", us(brokerTopic)), fmt.Sprintf("bridge=%.1f", us(code)))
}

// timed returns rt measuring each round trip's duration.
func timed(rt func() error) func() (time.Duration, error) {
	return func() (time.Duration, error) {
		start := time.Now()
		err := rt()
		return time.Since(start), err
	}
}
