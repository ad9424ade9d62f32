package bench

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/testing/meshtest"
)

// floorCommandThroughput is the command benchmark's path built from raw
// parts only, used plainly, with none of meshbox's code: about what an
// implementation of the design reaches on this machine before it seals,
// checks or records anything. A program's command crosses the
// same hops as with meshbox: the submitter's NATS request to a plain NATS
// server (node A's), a gateway on that server (in process, as the bridge
// is) that publishes it with raw amqp091-go, persistent and mandatory, to
// a topic exchange (mesh traffic must go through one: the broker checks
// topic permissions only there) and answers once the broker confirmed it;
// a gateway on node B's NATS server that consumes the quorum queue with
// prefetch benchRawPrefetch, sends each delivery to the handler as a NATS
// request and acks it after the handler's answer. No sealing, no headers,
// no bookkeeping: each of those is meshbox's own cost on top.
func floorCommandThroughput(b *testing.B, rmq *meshtest.Rabbit, amqpURL string) throughput {
	b.Helper()
	srvA, srvB := plainNATSServer(b), plainNATSServer(b)
	pubConn, pub := rawChannel(b, amqpURL)
	conConn, con := rawChannel(b, amqpURL)
	defer func() {
		_ = pubConn.Close()
		_ = conConn.Close()
	}()
	rawRuns++
	q, err := pub.QueueDeclare(fmt.Sprintf("bench.floor.%d", rawRuns), true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	if err != nil {
		b.Fatal(err)
	}
	const exchange = "bench.floor"
	key := "cmd." + q.Name
	if err := pub.ExchangeDeclare(exchange, "topic", true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	if err := pub.QueueBind(q.Name, key, exchange, false, nil); err != nil {
		b.Fatal(err)
	}
	if err := pub.Confirm(false); err != nil {
		b.Fatal(err)
	}

	// Gateway A: NATS request in, persistent publish, answer on confirm.
	gwA := floorConn(b, srvA)
	confirms := pub.NotifyPublish(make(chan amqp.Confirmation, benchSubmitters))
	var (
		pubMu   sync.Mutex
		seq     uint64
		waiting = map[uint64]string{} // delivery tag -> reply subject
	)
	go func() { // confirmer: exits when the channel closes
		for c := range confirms {
			pubMu.Lock()
			reply := waiting[c.DeliveryTag]
			delete(waiting, c.DeliveryTag)
			pubMu.Unlock()
			if c.Ack {
				_ = gwA.Publish(reply, nil)
			}
		}
	}()
	if _, err := gwA.Subscribe("cmd.bench", func(m *nats.Msg) {
		pubMu.Lock()
		defer pubMu.Unlock()
		seq++
		waiting[seq] = m.Reply
		if err := pub.Publish(exchange, key, true, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: m.Data, MessageId: "m"}); err != nil {
			b.Error(err)
		}
	}); err != nil {
		b.Fatal(err)
	}

	// Gateway B: delivery in, NATS request to the handler, ack on answer.
	gwB := floorConn(b, srvB)
	if err := con.Qos(benchRawPrefetch, 0, false); err != nil {
		b.Fatal(err)
	}
	ds, err := con.Consume(q.Name, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := gwB.Subscribe("_INBOX.floor.*", func(m *nats.Msg) {
		tag, err := strconv.ParseUint(m.Subject[strings.LastIndexByte(m.Subject, '.')+1:], 10, 64)
		if err == nil {
			_ = con.Ack(tag, false)
		}
	}); err != nil {
		b.Fatal(err)
	}
	go func() { // forwarder: exits when the channel closes
		for d := range ds {
			_ = gwB.PublishRequest("work.bench", "_INBOX.floor."+strconv.FormatUint(d.DeliveryTag, 10), d.Body)
		}
	}()

	handled := newHandledCount(benchCommands)
	hnc := floorConn(b, srvB)
	if _, err := hnc.Subscribe("work.bench", func(m *nats.Msg) {
		handled.add()
		_ = m.Respond(nil)
	}); err != nil {
		b.Fatal(err)
	}
	snc := floorConn(b, srvA)
	for _, nc := range []*nats.Conn{gwA, gwB, hnc} {
		if err := nc.Flush(); err != nil {
			b.Fatal(err)
		}
	}

	r := submitCommands(b, rmq, snc, loopbackLoad, []byte("x"), func(*nats.Msg) bool { return true }, handled)
	b.Logf("floor: %d commands in %v, process CPU %v, broker CPU %v", benchCommands, r.took, r.cpu, r.broker)
	return r.throughput()
}

// floorConn connects in process to srv, as the bridge connects to its
// node's server; programs connect over TCP (floorConn is used for both:
// the programs' side of the floor is then, if anything, cheaper than
// theirs with meshbox).
func floorConn(b *testing.B, srv *server.Server) *nats.Conn {
	b.Helper()
	nc, err := nats.Connect(srv.ClientURL(), nats.InProcessServer(srv))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	return nc
}
