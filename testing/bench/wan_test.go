package bench

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// Sizes of the WAN profile: a home's link to a central broker, with the
// whole profile in a few minutes.
const (
	// wanDelay is added each way between each node and the broker, and
	// between each raw client and the broker: a round trip to the broker
	// costs 2 × wanDelay more than on loopback.
	wanDelay         = 25 * time.Millisecond
	wanSubmitters    = 1024  // concurrent submitters on node A
	wanRoundTrips    = 100   // timed round trips per latency figure
	wanWarmUp        = 10    // untimed round trips before them
	wanDrainCommands = 20000 // commands waiting in the outbox
	// Time boxes of the submissions of one throughput run, and of one
	// setting of the raw sweep: a run submits benchCommands, or stops
	// submitting after this; it still waits until every command it
	// submitted is handled.
	wanRunFor   = 8 * time.Second
	wanSweepFor = 3 * time.Second
)

// The raw baseline's settings the sweep tries: its async confirm window
// and its consumer's prefetch. 256 of either held raw near 5,000 msg/s
// whatever the other; 4,096 is meshbox's own publish window and stage
// credit ceiling.
var (
	wanWindows    = []int{1024, 2048, 4096}
	wanPrefetches = []int{1024, 2048, 4096}
)

// BenchmarkWAN measures meshbox where a mesh runs, far from its broker:
// wanDelay is added each way between each node and the broker (each node
// reaches it through a proxy of its own, meshtest.Proxy.Delay), and the
// same between each raw client and the broker. Both nodes run in this
// process at their default configuration (bar wan-command-batch16). It
// prints
//
//	BENCH wan-command ours=<msg/s> baseline=<msg/s> ratio=<ours/baseline> baseline_settings=window=<n>,prefetch=<n> …
//	BENCH wan-command-batch16 ours=<msg/s> baseline=<msg/s> ratio=<ours/baseline> baseline_settings=… …
//	BENCH wan-request ours=<µs> baseline=<floor µs> ratio=<ours/floor> p99=<µs> raw_rpc=<µs> raw_rpc_p99=<µs> raw_ratio=<r>
//	BENCH wan-event ours=<µs> baseline=<floor µs> ratio=<ours/floor> p99=<µs> raw=<µs> raw_p99=<µs> raw_ratio=<r>
//	BENCH wan-drain ours=<msg/s> baseline=<msg/s> ratio=<ours/baseline> first_handled=<ms> after_first=<msg/s> baseline_settings=…
//
// and a SWEEP line per setting of the raw baseline.
//
// wan-command: commands submitted on A by wanSubmitters concurrent
// submitters (each answered once the broker confirmed it), handled on B,
// as BenchmarkBridge's command; the baseline is raw amqp091-go at its
// best through the same delay: the sweep runs it (submitting for at
// most wanSweepFor) at every confirm window of wanWindows and consumer
// prefetch of wanPrefetches, and the best setting is the baseline. The
// median of benchRounds runs alternating with the baseline's, each
// submitting benchCommands (or for at most wanRunFor), from the first
// submission until the last command is handled. Target ratio >= 0.9.
// wan-command-batch16: the same with bridge.command_batch 16 on both
// nodes.
//
// wan-request: p50 of a cross-node round trip (a program on A calls a
// capability a program on B hosts) against its floor, 2 round trips to
// the broker (4 × wanDelay); raw_rpc is a raw amqp091-go RPC round trip
// through topic exchanges and the same delay. Target ratio <= 1.05. Each
// latency figure takes wanRoundTrips of ours and of the raw one in turn
// (interleavedRounds), after wanWarmUp of each.
//
// wan-event: p50 of an event published by a program on A until a
// program on B has it, against its floor, 1 round trip to the broker
// (2 × wanDelay); raw is raw amqp091-go publishing a persistent message
// through a topic exchange to a quorum queue a consumer reads. Target
// ratio <= 1.1.
//
// wan-drain: wanDrainCommands commands accepted into A's outbox while
// A's link is cut, then the link is restored: commands per second from
// the restore until B has handled them all (first_handled: until B
// handled the first, A's reconnect included; after_first: the rate from
// then on, the median of its own); the baseline is raw amqp091-go at the
// sweep's best setting publishing as many through the same delay, timed
// from dialing its connection, to a consumer that is already there. The
// median of benchRounds rounds alternating with the baseline's. Target
// ratio >= 0.9.
func BenchmarkWAN(b *testing.B) {
	w := newWANMesh(b, "wan-a", "wan-b", "wan-a16", "wan-b16")
	nodeA, nodeB := w.start(b, "wan-a"), w.start(b, "wan-b")
	// The batch16 pair starts here, so that its log stays out of its
	// benchmark's output, and is closed once that is done.
	batch16 := func(c *appliance.Config) { c.Bridge.CommandBatch = 16 }
	a16, b16 := w.start(b, "wan-a16", batch16), w.start(b, "wan-b16", batch16)

	b.Run("command", func(b *testing.B) {
		for range b.N {
			w.commandRounds(b, "wan-command", nodeA, nodeB, "wan")
		}
	})
	b.Run("command-batch16", func(b *testing.B) {
		for range b.N {
			w.commandRounds(b, "wan-command-batch16", a16, b16, "wan16")
		}
	})
	if err := errors.Join(a16.Close(), b16.Close()); err != nil {
		b.Errorf("close the batch16 nodes: %v", err)
	}
	b.Run("request", func(b *testing.B) {
		for range b.N {
			t := interleavedRounds(b, wanWarmUp, wanRoundTrips, requestRoundTrip(b, nodeA, nodeB),
				rawRPCRoundTrip(b, w.raw.pub, w.raw.con, true))
			ours, raw, floor := t[0], t[1], 4*wanDelay
			report("wan-request", us(ours.p50), us(floor), "µs",
				fmt.Sprintf("p50 latency, %v each way between each node and the broker; baseline: the floor, 2 round trips to the broker; lower is better; target ratio <= 1.05", wanDelay),
				wanRawFields("raw_rpc", ours, raw)...)
		}
	})
	b.Run("event", func(b *testing.B) {
		for range b.N {
			t := interleavedRounds(b, wanWarmUp, wanRoundTrips, eventOneWay(b, nodeA, nodeB), rawEventOneWay(b, w.raw))
			ours, raw, floor := t[0], t[1], 2*wanDelay
			report("wan-event", us(ours.p50), us(floor), "µs",
				fmt.Sprintf("p50 latency from A's program to B's, %v each way between each node and the broker; baseline: the floor, 1 round trip to the broker; lower is better; target ratio <= 1.1", wanDelay),
				wanRawFields("raw", ours, raw)...)
		}
	})
	b.Run("drain", func(b *testing.B) {
		for range b.N {
			best := w.bestRaw(b)
			raw := best.shape("wan-drain-raw", wanDrainCommands, 0)
			raw.fromConnect = true
			var ours, base, after []throughput
			var first []time.Duration
			for range benchRounds {
				d := w.drainThroughput(b, nodeA, nodeB)
				ours, after, first = append(ours, d.all), append(after, d.afterFirst), append(first, d.first)
				r := rawShapeThroughput(b, w.rmq, w.raw, raw)
				b.Logf("raw: %d messages from dialing until the consumer had them all: %.0f msg/s", wanDrainCommands, r.perSec)
				base = append(base, r)
			}
			slices.Sort(first)
			o, r := median(ours), median(base)
			report("wan-drain", o.perSec, r.perSec, "msg/s",
				fmt.Sprintf("%d commands from A's outbox once its link is back, until handled on B; baseline: raw from dialing; higher is better; target ratio >= 0.9", wanDrainCommands),
				fmt.Sprintf("first_handled=%.0fms", ms(first[len(first)/2])), fmt.Sprintf("after_first=%.1f", median(after).perSec), best.field())
		}
	})
}

// wanRawFields are the extra fields of a WAN latency line: ours' p99,
// and the raw client's p50 and p99 (named name) and ours against it.
func wanRawFields(name string, ours, raw quantiles) []string {
	return []string{fmt.Sprintf("p99=%.1f", us(ours.p99)), fmt.Sprintf("%s=%.1f", name, us(raw.p50)),
		fmt.Sprintf("%s_p99=%.1f", name, us(raw.p99)), fmt.Sprintf("raw_ratio=%.2f", benchRatio(us(ours.p50), us(raw.p50)))}
}

// wanMesh is BenchmarkWAN's mesh: a benchBroker whose nodes and raw
// clients reach the broker through proxies that add wanDelay each way.
type wanMesh struct {
	*benchBroker
	proxies map[string]*meshtest.Proxy // by node, and "raw-a", "raw-b"
	// raw are the raw baselines' links: the publisher (or RPC client) on
	// A's side, the consumer (or RPC server) on B's, each through a
	// proxy of its own.
	raw  rawLinks
	best *rawSetting // the raw sweep's best, once it ran
}

// newWANMesh starts a broker and a mesh database for nodes (none of
// them started) and the raw baselines' delayed links.
func newWANMesh(b *testing.B, nodes ...string) *wanMesh {
	b.Helper()
	w := &wanMesh{benchBroker: newBenchBroker(b, nodes...), proxies: map[string]*meshtest.Proxy{}}
	w.raw = rawLinks{setup: w.amqpURL, pub: w.delayed(b, "raw-a", w.amqpURL), con: w.delayed(b, "raw-b", w.amqpURL)}
	return w
}

// delayed returns brokerURL through a new proxy, known as side, that
// adds wanDelay each way; it is stopped when b ends.
func (w *wanMesh) delayed(b *testing.B, side, brokerURL string) string {
	b.Helper()
	upstream := "127.0.0.1:" + strconv.Itoa(w.rmq.Port())
	px := meshtest.NewProxy(b, upstream)
	px.Delay(b, wanDelay)
	w.proxies[side] = px
	return px.Rewrite(brokerURL, upstream)
}

// start runs node name on its own broker user through a delayed link of
// its own, both closed when b ends.
func (w *wanMesh) start(b *testing.B, name string, configure ...func(*appliance.Config)) *appliance.Appliance {
	b.Helper()
	return startBenchNode(b, name, w.delayed(b, name, w.users[name]), w.dbURL, configure...)
}

// rawSetting is a setting of the raw command baseline.
type rawSetting struct{ window, prefetch int }

// shape is the raw baseline's message shape at s, publishing up to
// commands (0: benchCommands) for at most within (0: no limit).
func (s rawSetting) shape(name string, commands int, within time.Duration) messageShape {
	return messageShape{name: name, window: s.window, prefetch: s.prefetch, commands: commands, within: within}
}

func (s rawSetting) field() string {
	return fmt.Sprintf("baseline_settings=window=%d,prefetch=%d", s.window, s.prefetch)
}

// bestRaw returns the best setting of the raw command baseline through
// the delay, sweeping them all on its first call (a SWEEP line each).
func (w *wanMesh) bestRaw(b *testing.B) rawSetting {
	b.Helper()
	if w.best != nil {
		return *w.best
	}
	var best rawSetting
	var bestRate float64
	for _, win := range wanWindows {
		for _, p := range wanPrefetches {
			s := rawSetting{win, p}
			r := rawShapeThroughput(b, w.rmq, w.raw, s.shape("wan-sweep", 0, wanSweepFor))
			fmt.Printf("SWEEP wan-raw window=%d prefetch=%d msg/s=%.0f cpu_per_msg=%.1fµs broker_cpu_per_msg=%.1fµs\n", win, p, r.perSec, us(r.cpu), us(r.broker))
			if r.perSec > bestRate {
				best, bestRate = s, r.perSec
			}
		}
	}
	w.best = &best
	return best
}

// commandRounds measures the command throughput of nodes a and b on
// stage against the raw baseline at its best (benchRounds rounds
// alternating, the median of each) and reports it as name.
func (w *wanMesh) commandRounds(b *testing.B, name string, a, bb *appliance.Appliance, stage string) {
	b.Helper()
	best := w.bestRaw(b)
	load := commandLoad{stage: stage, commands: benchCommands, submitters: wanSubmitters, within: wanRunFor}
	var ours, raw []throughput
	for range benchRounds {
		ours = append(ours, commandThroughput(b, w.rmq, a, bb, load))
		r := rawShapeThroughput(b, w.rmq, w.raw, best.shape("wan-raw", 0, wanRunFor))
		b.Logf("raw (window %d, prefetch %d): %.0f msg/s, process CPU %v, broker CPU %v per message", best.window, best.prefetch, r.perSec, r.cpu, r.broker)
		raw = append(raw, r)
	}
	o, r := median(ours), median(raw)
	report(name, o.perSec, r.perSec, "msg/s",
		fmt.Sprintf("throughput, %v each way between each node and the broker, %d submitters; baseline: raw at the sweep's best; higher is better; target ratio >= 0.9", wanDelay, wanSubmitters),
		best.field(), fmt.Sprintf("cpu_per_cmd=%.1fµs", us(o.cpu)), fmt.Sprintf("baseline_cpu_per_msg=%.1fµs", us(r.cpu)))
}

// drained is what drainThroughput measured.
type drained struct {
	all        throughput    // from the restore until B handled every command
	first      time.Duration // from the restore until B handled the first
	afterFirst throughput    // from then until B handled every command (no CPU figures)
}

// drainThroughput cuts A's link, has wanDrainCommands commands accepted
// into A's outbox, restores the link and measures until B has handled
// them all.
func (w *wanMesh) drainThroughput(b *testing.B, nodeA, nodeB *appliance.Appliance) drained {
	b.Helper()
	commandRuns++
	body := []byte(strconv.Itoa(commandRuns))
	handled := newHandledCount(wanDrainCommands)
	var (
		firstOnce sync.Once
		first     time.Time
	)
	sub, snc := commandHandler(b, nodeA, nodeB, "wan-drain", func(m *nats.Msg) {
		if string(m.Data) == string(body) {
			firstOnce.Do(func() { first = time.Now() })
			handled.add()
		}
	})
	defer func() { _ = sub.Unsubscribe() }()
	px := w.proxies[nodeA.Status().Node]
	px.Cut(b)
	meshtest.WaitFor(b, 30*time.Second, "A's link down", func() bool { return nodeA.Status().Broker.State != "connected" })
	load := commandLoad{stage: "wan-drain", commands: wanDrainCommands, submitters: wanSubmitters}
	acceptStart := time.Now()
	if n := submit(b, snc, load, body, acceptedBy("outbox"), acceptStart); n != wanDrainCommands {
		b.Fatalf("%d of %d commands accepted into the outbox", n, wanDrainCommands)
	}
	acceptedIn := time.Since(acceptStart)
	cpu0, bcpu0 := cpuTime(b), w.rmq.CPUTime(b)
	start := time.Now()
	px.Restore(b)
	select {
	case <-handled.all:
	case <-time.After(2 * time.Minute):
		b.Fatalf("after 2m: %d of %d commands handled", handled.count(), wanDrainCommands)
	}
	took := time.Since(start)
	cpu, bcpu := cpuTime(b)-cpu0, w.rmq.CPUTime(b)-bcpu0
	firstIn := first.Sub(start)
	b.Logf("ours: %d commands accepted into A's outbox in %v; from the restore: the first handled on B after %v, all after %v", wanDrainCommands, acceptedIn, firstIn, took)
	n := time.Duration(wanDrainCommands)
	return drained{
		all:        throughput{float64(wanDrainCommands) / took.Seconds(), cpu / n, bcpu / n},
		first:      firstIn,
		afterFirst: throughput{perSec: float64(wanDrainCommands-1) / (took - firstIn).Seconds()},
	}
}

// eventOneWay returns one event published by a program on A, once a
// program on B has it.
func eventOneWay(b *testing.B, nodeA, nodeB *appliance.Appliance) func() error {
	b.Helper()
	subject := wire.EventSubject("bench-wan")
	got := make(chan string, 64)
	hnc := benchConn(b, nodeB.NATSURL(), meshtest.AdminOption(b, nodeB.DataDir()))
	if _, err := hnc.Subscribe(subject, func(m *nats.Msg) { got <- string(m.Data) }); err != nil {
		b.Fatal(err)
	}
	if err := hnc.Flush(); err != nil {
		b.Fatal(err)
	}
	pnc := benchConn(b, nodeA.NATSURL(), meshtest.AdminOption(b, nodeA.DataDir()))
	n := 0
	send := func() error {
		n++
		id := strconv.Itoa(n)
		if err := pnc.Publish(subject, []byte(id)); err != nil {
			return err
		}
		return awaitBody(got, id)
	}
	meshtest.WaitFor(b, 30*time.Second, "B has A's events", func() bool { return send() == nil })
	return send
}

// awaitBody waits (at most 5 s) for body on got, skipping those before
// it (late ones of earlier tries).
func awaitBody(got <-chan string, body string) error {
	timeout := time.After(5 * time.Second)
	for {
		select {
		case s := <-got:
			if s == body {
				return nil
			}
		case <-timeout:
			return fmt.Errorf("no event %s within 5s", body)
		}
	}
}

// rawEventOneWay is eventOneWay's raw counterpart: a persistent message
// published on links.pub to a topic exchange, routed to a quorum queue
// a consumer on links.con reads and acks; it returns once the consumer
// has it.
func rawEventOneWay(b *testing.B, links rawLinks) func() error {
	b.Helper()
	_, setup := rawChannel(b, links.setup)
	rawRuns++
	q, err := setup.QueueDeclare(fmt.Sprintf("bench.events.%d", rawRuns), true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	if err != nil {
		b.Fatal(err)
	}
	const exchange = "bench.events"
	if err := setup.ExchangeDeclare(exchange, "topic", true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	if err := setup.QueueBind(q.Name, "evt.#", exchange, false, nil); err != nil {
		b.Fatal(err)
	}
	_, pub := rawChannel(b, links.pub)
	_, con := rawChannel(b, links.con)
	ds, err := con.Consume(q.Name, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	return func() error {
		n++
		id := strconv.Itoa(n)
		if err := pub.Publish(exchange, "evt.bench-wan", false, false, amqp.Publishing{DeliveryMode: amqp.Persistent, MessageId: id, Body: []byte(id)}); err != nil {
			return err
		}
		select {
		case d := <-ds:
			_ = d.Ack(false)
			if d.MessageId != id {
				return fmt.Errorf("event %s, want %s", d.MessageId, id)
			}
			return nil
		case <-time.After(5 * time.Second):
			return fmt.Errorf("no event %s within 5s", id)
		}
	}
}
