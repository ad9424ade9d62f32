package bench

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/node"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// Peer counts and runs of the discovery benchmark.
var discoverySizes = []int{10, 50, 200}

const discoveryRuns = 5 // runs per size; the median is printed

// BenchmarkDiscovery measures how long a node takes to build its full mesh
// view: from node.Start until every peer is up with its capabilities known.
// The node is real (embedded NATS server, bridge, node) on a real RabbitMQ;
// its peers are lightweight in-process participants, each with its own
// system queue bound as the bridge binds it, that answer the node's hello
// with the real protocol (node.DecodeMessage / node.EncodeMessage) over the
// same broker. The bridge is connected before the clock starts, so the
// figure is discovery alone. It prints, per size, the median of
// discoveryRuns runs, and the growth from the smallest to the largest:
//
//	BENCH discovery-<n> ours=<ms>
//	BENCH discovery-growth ours=<ms at 200 / ms at 10> peers=20
//
// Target: under one second at 200 peers.
func BenchmarkDiscovery(b *testing.B) {
	r := meshtest.NewRabbitMQ(b)
	results := map[int]time.Duration{}
	for _, n := range discoverySizes {
		url := r.Vhost(b)
		sims := startSimPeers(b, url, n)
		var times []time.Duration
		for run := range discoveryRuns {
			times = append(times, timeDiscovery(b, url, fmt.Sprintf("bench-%d-%d", n, run), n))
		}
		sims.close(b)
		slices.Sort(times)
		med := times[len(times)/2]
		results[n] = med
		b.Logf("discovery of %d peers: runs %v, median %v", n, times, med)
		fmt.Printf("BENCH discovery-%d ours=%.1f\n", n, ms(med))
	}
	lo, hi := discoverySizes[0], discoverySizes[len(discoverySizes)-1]
	fmt.Printf("BENCH discovery-growth ours=%.2f peers=%d\n", float64(results[hi])/float64(results[lo]), hi/lo)
	if results[hi] > time.Second {
		b.Logf("discovery of %d peers took %v: above the one-second target", hi, results[hi])
	}
}

// timeDiscovery starts a node named name on the broker at url and returns
// how long it took to see all want peers up with their records.
func timeDiscovery(b *testing.B, url, name string, want int) time.Duration {
	b.Helper()
	_, took, stop := joinMesh(b, url, name, want, new(atomic.Int64))
	stop()
	return took
}

// complete reports whether peers holds want simulated peers, up and with
// their capabilities known.
func complete(peers []node.Peer, want int) bool { return countComplete(peers) >= want }

func countComplete(peers []node.Peer) int {
	c := 0
	for _, p := range peers {
		if strings.HasPrefix(p.Name, "sim-") && p.State == node.StateUp && len(p.Capabilities) > 0 {
			c++
		}
	}
	return c
}

// simPeers are lightweight participants in the discovery protocol: one AMQP
// connection, one channel and system queue per peer (bound as the bridge
// binds a node's), one goroutine per peer that answers queries and version 2 hellos with an info.
type simPeers struct {
	conn  *amqp.Connection
	pubMu sync.Mutex
	pub   *amqp.Channel
	wg    sync.WaitGroup
}

func startSimPeers(b *testing.B, url string, n int) *simPeers {
	b.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		b.Fatal(err)
	}
	s := &simPeers{conn: conn}
	if s.pub, err = conn.Channel(); err != nil {
		b.Fatal(err)
	}
	if err := s.pub.ExchangeDeclare("mesh", "topic", true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	started := time.Now().UTC()
	for i := range n {
		name := fmt.Sprintf("sim-%03d", i)
		ch, err := conn.Channel()
		if err != nil {
			b.Fatal(err)
		}
		ex, q := "node."+name, "node."+name+".system"
		steps := []error{
			ch.ExchangeDeclare(ex, "topic", true, false, false, false, nil),
			ch.ExchangeBind(ex, "to."+name+".#", "mesh", false, nil),
		}
		_, err = ch.QueueDeclare(q, false, true, true, false, nil)
		steps = append(steps, err,
			ch.QueueBind(q, "sys.#", "mesh", false, nil),
			ch.QueueBind(q, "to."+name+".sys.#", ex, false, nil))
		for _, err := range steps {
			if err != nil {
				b.Fatalf("sim peer %s: %v", name, err)
			}
		}
		ds, err := ch.Consume(q, "", true, true, false, false, nil)
		if err != nil {
			b.Fatal(err)
		}
		caps := []string{"echo", "sim." + name}
		s.wg.Add(1)
		go func() { // exits when the connection closes (close)
			defer s.wg.Done()
			var seq uint64
			for d := range ds {
				key, ok := systemKey(d.RoutingKey, name)
				if !ok {
					continue
				}
				origin, _ := d.Headers[codec.HeaderOrigin].(string)
				m, err := node.DecodeMessage(key, d.Body, origin)
				asks := m != nil && (m.Type == node.TypeQuery || m.Type == node.TypeHello && m.Proto >= 2) // as a version 2 node answers
				if err != nil || !asks || (m.To != "" && m.To != name) || m.Node == name {
					continue
				}
				seq++
				body, err := node.EncodeMessage(&node.Message{V: node.ProtocolVersion, Type: node.TypeInfo, Node: name, To: m.Node,
					StartedAt: started, Seq: seq, Version: "sim", Capabilities: caps, HeartbeatMS: 5000})
				if err != nil {
					continue
				}
				s.publish("to."+m.Node+".sys."+node.TypeInfo, name, body)
			}
		}()
	}
	return s
}

// publish sends a system message as the bridge does: on the mesh exchange,
// type "system", the origin in Meshbox-Origin.
func (s *simPeers) publish(key, origin string, body []byte) {
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	_ = s.pub.Publish("mesh", key, false, false, amqp.Publishing{
		Type:        "system",
		ContentType: "application/json",
		Timestamp:   time.Now(),
		Headers:     amqp.Table{codec.HeaderOrigin: origin},
		Body:        body,
	})
}

func (s *simPeers) close(b *testing.B) {
	b.Helper()
	if err := s.conn.Close(); err != nil {
		b.Errorf("close sim peers: %v", err)
	}
	s.wg.Wait()
}

// systemKey returns the system key of a broadcast (sys.<key>) or of a
// message addressed to self (to.<self>.sys.<key>).
func systemKey(routingKey, self string) (string, bool) {
	if k, ok := strings.CutPrefix(routingKey, "sys."); ok {
		return k, true
	}
	return strings.CutPrefix(routingKey, "to."+self+".sys.")
}
