//go:build hoptrace

package bench

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/nats-io/nats.go"
)

// BenchmarkRequestHops takes the request round trip of BenchmarkBridge
// apart: where its time goes, hop by hop, next to the raw parts of its
// baseline measured in the same loop. Built only with the hoptrace tag
// (`make bench-hops`), which makes the bridge record when the request at
// hand passes each point (bridge.Hop); a normal build records nothing.
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
	rmq := meshtest.NewRabbitMQ(b)
	amqpURL := rmq.Vhost(b)
	dbURL := benchMeshDB(b, amqpURL, "bench-a", "bench-b")
	urls := benchBrokerUsers(b, rmq, amqpURL, "bench-a", "bench-b")
	nodeA := startBenchNode(b, "bench-a", urls["bench-a"], dbURL)
	nodeB := startBenchNode(b, "bench-b", urls["bench-b"], dbURL)

	host := benchConn(b, nodeB.NATSURL(), meshtest.AdminOption(b, nodeB.DataDir()))
	if _, err := host.Subscribe("cap.bench-echo", func(m *nats.Msg) {
		bridge.MarkHop(bridge.HopHostHas)
		_ = m.Respond(m.Data)
	}); err != nil {
		b.Fatal(err)
	}
	if err := host.Flush(); err != nil {
		b.Fatal(err)
	}
	caller := benchConn(b, nodeA.NATSURL(), meshtest.AdminOption(b, nodeA.DataDir()))
	call := func() error {
		_, err := caller.Request("cap.bench-echo", []byte("ping"), 5*time.Second)
		return err
	}
	benchWait(b, 30*time.Second, "A reaches bench-echo on B", func() bool { return call() == nil })

	natsRT := markedNATSRoundTrip(b)
	rpc := markedRPCRoundTrip(b, amqpURL, false)
	rpcTopic := markedRPCRoundTrip(b, amqpURL, true)

	stretch := make([][]time.Duration, bridge.HopCount)
	var nats2, broker, brokerTopic []time.Duration
	for i := range benchWarmUp + benchRoundTrips {
		bridge.MarkHop(bridge.HopCallerSent)
		if err := call(); err != nil {
			b.Fatal(err)
		}
		bridge.MarkHop(bridge.HopCallerHas)
		n, err := natsRT()
		if err != nil {
			b.Fatal(err)
		}
		r, err := rpc()
		if err != nil {
			b.Fatal(err)
		}
		rt, err := rpcTopic()
		if err != nil {
			b.Fatal(err)
		}
		if i < benchWarmUp {
			continue
		}
		for h := bridge.HopStandIn; h < bridge.HopCount; h++ {
			stretch[h] = append(stretch[h], time.Duration(bridge.HopMarks[h].Load()-bridge.HopMarks[h-1].Load()))
		}
		stretch[0] = append(stretch[0], time.Duration(bridge.HopMarks[bridge.HopCallerHas].Load()-bridge.HopMarks[bridge.HopCallerSent].Load()))
		nats2, broker, brokerTopic = append(nats2, 2*n), append(broker, r), append(brokerTopic, rt)
	}
	p50 := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
	names := map[bridge.Hop]string{
		bridge.HopStandIn:        "caller -> A's stand-in (NATS)",
		bridge.HopRequestWritten: "A's bridge: check, seal, hand to AMQP",
		bridge.HopRequestTaken:   "A -> broker -> B's bridge",
		bridge.HopHostAsked:      "B's bridge: open, hand to the host",
		bridge.HopHostHas:        "B's bridge -> host (NATS)",
		bridge.HopHostAnswered:   "host -> B's bridge (NATS)",
		bridge.HopReplyWritten:   "B's bridge: seal the reply, hand to AMQP",
		bridge.HopReplyTaken:     "B -> broker -> A's bridge",
		bridge.HopCallerAnswered: "A's bridge: open, answer the caller",
		bridge.HopCallerHas:      "A's bridge -> caller (NATS)",
	}
	med := make([]time.Duration, bridge.HopCount)
	for h := range bridge.HopCount {
		med[h] = p50(stretch[h])
		if h > 0 {
			fmt.Printf("HOPS %-42s p50=%.1fµs\n", names[h], us(med[h]))
		}
	}
	sum := func(hs ...bridge.Hop) (t time.Duration) {
		for _, h := range hs {
			t += med[h]
		}
		return t
	}
	natsOurs := sum(bridge.HopStandIn, bridge.HopHostHas, bridge.HopHostAnswered, bridge.HopCallerHas)
	brokerOurs := sum(bridge.HopRequestTaken, bridge.HopReplyTaken)
	code := sum(bridge.HopRequestWritten, bridge.HopHostAsked, bridge.HopReplyWritten, bridge.HopCallerAnswered)
	base := p50(nats2) + p50(broker)
	report("request-hops", us(med[0]), us(base), "µs", "a request round trip taken apart, p50 of each stretch; nats: ours' four NATS stretches against two raw NATS round trips; broker: ours' two stretches through the broker against a raw RPC round trip (default exchange; topic: through a topic exchange); bridge: meshbox's own code on the way",
		fmt.Sprintf("nats=%.1f", us(natsOurs)), fmt.Sprintf("baseline_nats=%.1f", us(p50(nats2))),
		fmt.Sprintf("broker=%.1f", us(brokerOurs)), fmt.Sprintf("baseline_broker=%.1f", us(p50(broker))),
		fmt.Sprintf("baseline_broker_topic=%.1f", us(p50(brokerTopic))), fmt.Sprintf("bridge=%.1f", us(code)))
}

// markedNATSRoundTrip is natsRoundTrip on a plain NATS server, returning
// each round trip's duration.
func markedNATSRoundTrip(b *testing.B) func() (time.Duration, error) {
	b.Helper()
	rt := natsRoundTrip(b, plainNATS(b))
	return func() (time.Duration, error) {
		start := time.Now()
		err := rt()
		return time.Since(start), err
	}
}

// markedRPCRoundTrip is rawRPCRoundTrip, returning each round trip's
// duration.
func markedRPCRoundTrip(b *testing.B, amqpURL string, viaTopic bool) func() (time.Duration, error) {
	b.Helper()
	rt := rawRPCRoundTrip(b, amqpURL, viaTopic)
	return func() (time.Duration, error) {
		start := time.Now()
		err := rt()
		return time.Since(start), err
	}
}
