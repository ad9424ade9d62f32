package bench

import (
	"cmp"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// messageShape is one variant of the raw command baseline, to see what a
// message's shape costs the broker.
type messageShape struct {
	name     string
	prefetch int    // the consumer's (0: benchRawPrefetch)
	exchange bool   // through a topic exchange (else the default one)
	kind     string // the exchange's type when not topic: direct, fanout
	// nodeUser: published on mesh by a node's own broker user, whose
	// topic permissions the broker checks on every publish.
	nodeUser bool
	// batch: each message carries this many commands' bodies (0: one);
	// figures are per command.
	batch   int
	args    amqp.Table // extra queue arguments
	headers amqp.Table
	userID  bool
	body    int
	// window is the publisher's async confirm window (0:
	// benchSubmitters).
	window int
	// commands is how many commands the run publishes (0: benchCommands).
	commands int
	// within, when set, stops publishing after it; the run still waits
	// until every message it published is confirmed and acked.
	within time.Duration
	// fromConnect: the run's time starts before the publisher dials its
	// connection and opens its channel, as a node's does after a link
	// comes back.
	fromConnect bool
}

// rawLinks are the broker URLs of a raw run's clients: setup declares
// the queue, pub publishes (node instead when the shape publishes as a
// node's broker user), con consumes. On the WAN profile pub and con go
// through links of their own that add latency.
type rawLinks struct{ setup, pub, con, node string }

// directLinks are the links of a raw run whose clients all connect to
// amqpURL directly (nodeURL: the node user's).
func directLinks(amqpURL, nodeURL string) rawLinks {
	return rawLinks{setup: amqpURL, pub: amqpURL, con: amqpURL, node: nodeURL}
}

// BenchmarkRawShape measures the raw command baseline with the message
// shape of the bridge's commands added step by step (topic exchange,
// queue arguments, headers, user_id, a sealed body's size), and prints
// the broker's and the process's CPU per message for each. It runs only
// when MESHBOX_BENCH_SHAPE=1:
//
//	MESHBOX_BENCH_SHAPE=1 go test -run '^$' -bench RawShape -benchtime 1x ./testing/bench/
func BenchmarkRawShape(b *testing.B) {
	if os.Getenv("MESHBOX_BENCH_SHAPE") != "1" {
		b.Skip("set MESHBOX_BENCH_SHAPE=1 to measure the raw baseline per message shape")
	}
	rmq := meshtest.NewRabbitMQ(b)
	amqpURL := rmq.Vhost(b)
	hdr := amqp.Table{"Meshbox-Origin": "bench-a", "Meshbox-Key": "k-0123456789abcdef"}
	qargs := amqp.Table{"x-delivery-limit": int64(1000), "x-dead-letter-exchange": "mesh.dlx"}
	shapes := []messageShape{
		{name: "raw"},
		{name: "topic", exchange: true},
		{name: "direct", exchange: true, kind: "direct"},
		{name: "fanout", exchange: true, kind: "fanout"},
		{name: "topic+args", exchange: true, args: qargs},
		{name: "topic+args+headers", exchange: true, args: qargs, headers: hdr},
		{name: "topic+args+headers+user", exchange: true, args: qargs, headers: hdr, userID: true},
		{name: "all+body58", exchange: true, args: qargs, headers: hdr, userID: true, body: 58},
		{name: "all+body58+node-user", exchange: true, args: qargs, headers: hdr, userID: true, body: 58, nodeUser: true},
		{name: "all+node-user, 4 per msg", exchange: true, args: qargs, headers: hdr, userID: true, body: 4 * 64, nodeUser: true, batch: 4},
		{name: "all+node-user, 16 per msg", exchange: true, args: qargs, headers: hdr, userID: true, body: 16 * 64, nodeUser: true, batch: 16},
	}
	links := directLinks(amqpURL, benchBrokerUsers(b, rmq, amqpURL, "shape-node")["shape-node"])
	for range b.N {
		res := make(map[string][]throughput)
		for range 3 {
			for _, s := range shapes {
				res[s.name] = append(res[s.name], rawShapeThroughput(b, rmq, links, s))
			}
		}
		for _, s := range shapes {
			m := median(res[s.name])
			fmt.Printf("SHAPE %-26s msg/s=%6.0f cpu=%5.1fµs broker=%5.1fµs\n", s.name, m.perSec, us(m.cpu), us(m.broker))
		}
	}
}

// rawShapeThroughput publishes s.commands (default benchCommands)
// persistent messages of shape s to a quorum queue of its own with an
// async confirm window of s.window (default benchSubmitters), consumed
// with the shape's prefetch and an ack per message: commands per second
// until the consumer has acked every message published, and this
// process's and the broker's CPU time per command. Its connections are
// closed and its queue deleted when it returns.
func rawShapeThroughput(b *testing.B, rmq *meshtest.Rabbit, links rawLinks, s messageShape) throughput {
	b.Helper()
	pubURL := links.pub
	if s.nodeUser {
		pubURL = links.node
	}
	setupConn, setup := rawChannel(b, links.setup)
	conConn, con := rawChannel(b, links.con)
	var pubConn *amqp.Connection
	rawRuns++
	name := fmt.Sprintf("bench.shape.%d", rawRuns)
	defer func() {
		if pubConn != nil {
			_ = pubConn.Close()
		}
		_ = conConn.Close()
		// An idle quorum queue still costs the broker a little: the next
		// runs do not share it with this one's.
		_, _ = setup.QueueDelete(name, false, false, false)
		_ = setupConn.Close()
	}()
	args := amqp.Table{"x-queue-type": "quorum"}
	for k, v := range s.args {
		args[k] = v
	}
	q, err := setup.QueueDeclare(name, true, false, false, false, args)
	if err != nil {
		b.Fatal(err)
	}
	exchange, key := "", q.Name
	if s.exchange {
		kind := s.kind
		if kind == "" {
			kind = "topic"
		}
		exchange, key = "bench."+kind, "cmd."+q.Name
		if s.nodeUser {
			exchange = "mesh" // declared by the admin (benchBrokerUsers)
		} else if err := setup.ExchangeDeclare(exchange, kind, true, false, false, false, nil); err != nil {
			b.Fatal(err)
		}
		if err := setup.QueueBind(q.Name, key, exchange, false, nil); err != nil {
			b.Fatal(err)
		}
	}
	window := cmp.Or(s.window, benchSubmitters)
	var pub *amqp.Channel
	var confirms chan amqp.Confirmation
	openPub := func() {
		pubConn, pub = rawChannel(b, pubURL)
		if err := pub.Confirm(false); err != nil {
			b.Fatal(err)
		}
		confirms = pub.NotifyPublish(make(chan amqp.Confirmation, window))
	}
	if !s.fromConnect {
		openPub()
	}
	if err := con.Qos(cmp.Or(s.prefetch, benchRawPrefetch), 0, false); err != nil {
		b.Fatal(err)
	}
	ds, err := con.Consume(q.Name, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	batch := max(1, s.batch)
	msgs := cmp.Or(s.commands, benchCommands) / batch
	acked := newHandledCount(msgs)
	go func() { // consumer: exits when its connection closes (on return)
		for d := range ds {
			if err := d.Ack(false); err != nil {
				return
			}
			acked.add()
		}
	}()
	body := make([]byte, max(1, s.body))
	p := amqp.Publishing{DeliveryMode: amqp.Persistent, Body: body, MessageId: "0123456789abcdef0123456789abcdef", Headers: s.headers}
	if s.userID {
		p.UserId = "guest"
		if s.nodeUser {
			p.UserId = bridge.BrokerUser("shape-node", 1)
		}
		p.Type = "command"
		p.Timestamp = time.Now()
	}
	slots := make(chan struct{}, window) // a slot per message not yet confirmed
	var nacked atomic.Int64
	cpu0, bcpu0 := cpuTime(b), rmq.CPUTime(b)
	start := time.Now()
	if s.fromConnect {
		openPub()
	}
	go func() { // confirmer: exits when the publisher's connection closes (on return)
		for c := range confirms {
			if !c.Ack {
				nacked.Add(1)
			}
			<-slots
		}
	}()
	published := 0
	for ; published < msgs && (s.within == 0 || time.Since(start) < s.within); published++ {
		slots <- struct{}{}
		if err := pub.Publish(exchange, key, true, false, p); err != nil {
			b.Fatal(err)
		}
	}
	for range window { // every slot free again: every message confirmed
		slots <- struct{}{}
	}
	acked.expect(published)
	select {
	case <-acked.all:
	case <-time.After(2 * time.Minute):
		b.Fatalf("%s: the consumer did not get every message within 2m", s.name)
	}
	d := time.Since(start)
	cpu, bcpu := cpuTime(b)-cpu0, rmq.CPUTime(b)-bcpu0
	if n := nacked.Load(); n != 0 {
		b.Fatalf("%s: %d messages nacked", s.name, n)
	}
	n := time.Duration(published * batch)
	return throughput{float64(n) / d.Seconds(), cpu / n, bcpu / n}
}
