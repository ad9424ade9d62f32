package bench

import (
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
	nodeURL := benchBrokerUsers(b, rmq, amqpURL, "shape-node")["shape-node"]
	for range b.N {
		res := make(map[string][]throughput)
		for range 3 {
			for _, s := range shapes {
				res[s.name] = append(res[s.name], rawShapeThroughput(b, rmq, amqpURL, nodeURL, s))
			}
		}
		for _, s := range shapes {
			m := median(res[s.name])
			fmt.Printf("SHAPE %-26s msg/s=%6.0f cpu=%5.1fµs broker=%5.1fµs\n", s.name, m.perSec, us(m.cpu), us(m.broker))
		}
	}
}

// rawShapeThroughput publishes benchCommands persistent messages of shape
// s to a quorum queue of its own with an async confirm window of
// benchSubmitters, consumed with the shape's prefetch and an ack per
// message: messages per second until the consumer has acked them all, and
// this process's and the broker's CPU time per message. Its connections
// are closed when it returns.
func rawShapeThroughput(b *testing.B, rmq *meshtest.Rabbit, amqpURL, nodeURL string, s messageShape) throughput {
	b.Helper()
	pubURL := amqpURL
	if s.nodeUser {
		pubURL = nodeURL
	}
	setupConn, pub := rawChannel(b, amqpURL)
	defer func() { _ = setupConn.Close() }()
	pubConn, pubCh := rawChannel(b, pubURL)
	conConn, con := rawChannel(b, amqpURL)
	defer func() {
		_ = pubConn.Close()
		_ = conConn.Close()
	}()
	rawRuns++
	args := amqp.Table{"x-queue-type": "quorum"}
	for k, v := range s.args {
		args[k] = v
	}
	q, err := pub.QueueDeclare(fmt.Sprintf("bench.shape.%d", rawRuns), true, false, false, false, args)
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
		} else if err := pub.ExchangeDeclare(exchange, kind, true, false, false, false, nil); err != nil {
			b.Fatal(err)
		}
		if err := pub.QueueBind(q.Name, key, exchange, false, nil); err != nil {
			b.Fatal(err)
		}
	}
	pub = pubCh
	if err := pub.Confirm(false); err != nil {
		b.Fatal(err)
	}
	confirms := pub.NotifyPublish(make(chan amqp.Confirmation, benchSubmitters))
	prefetch := s.prefetch
	if prefetch == 0 {
		prefetch = benchRawPrefetch
	}
	if err := con.Qos(prefetch, 0, false); err != nil {
		b.Fatal(err)
	}
	ds, err := con.Consume(q.Name, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	msgs := benchCommands / max(1, s.batch)
	acked := make(chan struct{})
	go func() { // consumer: exits after acking every message
		defer close(acked)
		n := 0
		for d := range ds {
			if err := d.Ack(false); err != nil {
				return
			}
			if n++; n == msgs {
				return
			}
		}
	}()
	window := make(chan struct{}, benchSubmitters)
	var nacked atomic.Int64
	confirmed := make(chan struct{})
	go func() { // confirmer: exits after every confirm arrived
		defer close(confirmed)
		for n := 0; n < msgs; n++ {
			c, ok := <-confirms
			if !ok {
				return
			}
			if !c.Ack {
				nacked.Add(1)
			}
			<-window
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
	cpu0, bcpu0 := cpuTime(b), rmq.CPUTime(b)
	start := time.Now()
	for range msgs {
		window <- struct{}{}
		if err := pub.Publish(exchange, key, true, false, p); err != nil {
			b.Fatal(err)
		}
	}
	<-confirmed
	select {
	case <-acked:
	case <-time.After(2 * time.Minute):
		b.Fatalf("%s: the consumer did not get every message within 2m", s.name)
	}
	d := time.Since(start)
	cpu, bcpu := cpuTime(b)-cpu0, rmq.CPUTime(b)-bcpu0
	if n := nacked.Load(); n != 0 {
		b.Fatalf("%s: %d messages nacked", s.name, n)
	}
	return throughput{float64(benchCommands) / d.Seconds(), cpu / benchCommands, bcpu / benchCommands}
}
