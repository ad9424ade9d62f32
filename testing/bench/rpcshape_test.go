package bench

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/testing/meshtest"
)

// rpcShape is one variant of the raw AMQP RPC round trip through a topic
// exchange, to see what a request's and a reply's shape costs the broker.
type rpcShape struct {
	name string
	// props: mandatory, user_id (validated by the broker), type, message
	// id, timestamp and expiration, as the bridge publishes requests.
	props bool
	// headers: none, one (the key id) or three (origin, key id, and a
	// request's capability).
	headers int
	// hop: the queues are bound to an exchange per node, itself bound to
	// the shared exchange (an older mesh's topology); dangling: that
	// exchange is bound to the shared one but the queues are not.
	hop, dangling bool
	// without drops one of props: "expiration", "timestamp" or
	// "message-id".
	without string
	// bind is how the request queue is bound: "" with to.<node>.req.#
	// (as a node binds it), "star" with to.<node>.req.*, "exact" with the
	// request's own key.
	bind string
}

// BenchmarkRPCShape measures the raw AMQP RPC round trip of the request
// baseline through a topic exchange with a request's shape added step by
// step, interleaved, and prints p50 and p99 of each. It runs only when
// MESHBOX_BENCH_SHAPE=1:
//
//	MESHBOX_BENCH_SHAPE=1 go test -run '^$' -bench RPCShape -benchtime 1x ./testing/bench/
func BenchmarkRPCShape(b *testing.B) {
	if os.Getenv("MESHBOX_BENCH_SHAPE") != "1" {
		b.Skip("set MESHBOX_BENCH_SHAPE=1 to measure the raw RPC per message shape")
	}
	rmq := meshtest.NewRabbitMQ(b)
	amqpURL := rmq.Vhost(b)
	shapes := []rpcShape{
		{name: "topic"},
		{name: "props", props: true},
		{name: "props+3headers", props: true, headers: 3},
		{name: "props+1header", props: true, headers: 1},
		{name: "props+1header+hop", props: true, headers: 1, hop: true},
		{name: "props+3headers+hop", props: true, headers: 3, hop: true},
		{name: "props+1header+dangling", props: true, headers: 1, dangling: true},
		{name: "props-expiration+1header", props: true, headers: 1, without: "expiration"},
		{name: "props-timestamp+1header", props: true, headers: 1, without: "timestamp"},
		{name: "props-message-id+1header", props: true, headers: 1, without: "message-id"},
		{name: "props+1header+bind-star", props: true, headers: 1, bind: "star"},
		{name: "props+1header+bind-exact", props: true, headers: 1, bind: "exact"},
	}
	for range b.N {
		var fns []func() error
		for i, s := range shapes {
			fns = append(fns, rawRPCShape(b, amqpURL, s, i))
		}
		t := interleavedQuantiles(b, fns...)
		for i, s := range shapes {
			fmt.Printf("RPCSHAPE %-24s p50=%7.1fµs p99=%7.1fµs\n", s.name, us(t[i].p50), us(t[i].p99))
		}
	}
}

// rawRPCShape is rawRPCRoundTrip through a topic exchange of its own
// (number n) with the message shape s.
func rawRPCShape(b *testing.B, amqpURL string, s rpcShape, n int) func() error {
	b.Helper()
	must := func(err error) {
		if err != nil {
			b.Fatalf("rpc shape %s: %v", s.name, err)
		}
	}
	_, srvIn := rawChannel(b, amqpURL)
	srvConn, _ := rawChannel(b, amqpURL)
	srvOut, err := srvConn.Channel()
	must(err)
	_, cliOut := rawChannel(b, amqpURL)
	cliConn, _ := rawChannel(b, amqpURL)
	cliIn, err := cliConn.Channel()
	must(err)
	rq, err := srvIn.QueueDeclare("", false, true, true, false, nil)
	must(err)
	pq, err := cliIn.QueueDeclare("", false, true, true, false, nil)
	must(err)
	ex := fmt.Sprintf("bench.rpcshape.%d", n)
	srv, cli := fmt.Sprintf("srv%d", n), fmt.Sprintf("cli%d", n)
	reqKey, replyKey := "to."+srv+".req.echo", "to."+cli+".reply"
	must(srvIn.ExchangeDeclare(ex, "topic", false, true, false, false, nil))
	reqEx, replyEx := ex, ex
	if s.hop || s.dangling {
		for _, peer := range []string{srv, cli} {
			must(srvIn.ExchangeDeclare(ex+"."+peer, "topic", false, true, false, false, nil))
			must(srvIn.ExchangeBind(ex+"."+peer, "to."+peer+".#", ex, false, nil))
		}
		if s.hop {
			reqEx, replyEx = ex+"."+srv, ex+"."+cli
		}
	}
	bindKey := map[string]string{"": "to." + srv + ".req.#", "star": "to." + srv + ".req.*", "exact": reqKey}[s.bind]
	must(srvIn.QueueBind(rq.Name, bindKey, reqEx, false, nil))
	must(cliIn.QueueBind(pq.Name, replyKey, replyEx, false, nil))
	reqs, err := srvIn.Consume(rq.Name, "", true, true, false, false, nil)
	must(err)
	replies, err := cliIn.Consume(pq.Name, "", true, true, false, false, nil)
	must(err)
	msg := func(id, replyTo string, request bool) amqp.Publishing {
		p := amqp.Publishing{CorrelationId: id, ReplyTo: replyTo, Body: []byte("ping")}
		if s.props {
			p.UserId, p.Type, p.Timestamp = "guest", "request", time.Now()
			if request {
				p.MessageId, p.Expiration = id, "5000"
			}
			switch s.without {
			case "expiration":
				p.Expiration = ""
			case "timestamp":
				p.Timestamp = time.Time{}
			case "message-id":
				p.MessageId = ""
			}
		}
		switch s.headers {
		case 1:
			p.Headers = amqp.Table{"Meshbox-Key": "k-0123456789abcdef"}
		case 3:
			p.Headers = amqp.Table{"Meshbox-Key": "k-0123456789abcdef", "Meshbox-Origin": "bench-a", "Meshbox-Capability": "echo"}
		}
		return p
	}
	go func() { // server: exits when its channel closes (cleanup)
		for d := range reqs {
			_ = srvOut.Publish(ex, replyKey, s.props, false, msg(d.CorrelationId, "", false))
		}
	}()
	i := 0
	return func() error {
		i++
		id := strconv.Itoa(i)
		if err := cliOut.Publish(ex, reqKey, s.props, false, msg(id, pq.Name, true)); err != nil {
			return err
		}
		return awaitReply(replies, id)
	}
}
