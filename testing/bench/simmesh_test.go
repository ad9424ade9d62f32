package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/internal/wire"
	"github.com/meshbox/meshbox/node"
)

// simMesh is a mesh of simulated peers speaking the current discovery
// protocol over the real broker: each peer has its own system queue,
// bound as the bridge binds a node's (exclusive to its connection, so the
// broker drops it when the connection goes), and its own goroutine that
// answers queries, sends jittered heartbeats at the interval the protocol
// gives its mesh size (node.HeartbeatIntervalFor), probes its two
// successors on the ring with mandatory probes (no body; the simulation
// names the prober in the properties, where a bridge keeps its own
// record), tells the mesh when a probe comes back unroutable (gone) and
// checks others' gone messages with a probe of its own. Peers are multiplexed over a few AMQP connections (one consuming
// and one publishing channel each). Peers know each other from the start
// (their records never change, so no hash differs); a node that is not a
// simulated peer (the node under test) is recorded and asked when its
// hash is unknown, as a node would.
type simMesh struct {
	total int      // mesh size the peers assume (them and the node under test)
	names []string // sorted peer names: the ring
	conns []*simConn
	peers map[string]*simPeer

	deliveries atomic.Int64 // messages the broker delivered to the peers
	started    time.Time    // when the peers' process "started" (started_at of every message)

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // the peers' and return drainers' goroutines
}

type simConn struct {
	conn    *amqp.Connection
	sub     *amqp.Channel
	pubMu   sync.Mutex
	pub     *amqp.Channel
	returns chan amqp.Return
}

type simPeer struct {
	name   string
	c      *simConn
	ring   []string // the peers it probes
	ctag   string
	ds     <-chan amqp.Delivery
	cancel context.CancelFunc
	queue  string
}

// probe kinds, in AppId: a ring probe whose "no route" is announced, or a
// check of another's gone message.
const (
	simProbe = "probe"
	simCheck = "check"
)

const simConns = 8

// startSimMesh starts n peers on the broker at url, in a mesh of total
// nodes.
func startSimMesh(b *testing.B, url string, n, total int) *simMesh {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &simMesh{total: total, peers: map[string]*simPeer{}, ctx: ctx, cancel: cancel, started: time.Now().UTC()}
	for range simConns {
		conn, err := amqp.Dial(url)
		if err != nil {
			b.Fatal(err)
		}
		c := &simConn{conn: conn}
		if c.sub, err = conn.Channel(); err != nil {
			b.Fatal(err)
		}
		if c.pub, err = conn.Channel(); err != nil {
			b.Fatal(err)
		}
		if err := c.pub.ExchangeDeclare("mesh", "topic", true, false, false, false, nil); err != nil {
			b.Fatal(err)
		}
		c.returns = c.pub.NotifyReturn(make(chan amqp.Return, 1024))
		s.conns = append(s.conns, c)
		s.wg.Add(1)
		go s.drainReturns(c) // exits when the connection closes
	}
	for i := range n {
		s.names = append(s.names, fmt.Sprintf("sim-%04d", i))
	}
	// Declare in parallel, one goroutine per connection.
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, simConns)
	for ci, c := range s.conns {
		wg.Add(1)
		go func() { // exits when its peers are declared
			defer wg.Done()
			for i := ci; i < n; i += simConns {
				p, err := s.declare(c, s.names[i], i)
				if err != nil {
					errs[ci] = err
					return
				}
				mu.Lock()
				s.peers[p.name] = p
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	for _, name := range s.names {
		p := s.peers[name]
		pctx, pcancel := context.WithCancel(ctx)
		p.cancel = pcancel
		s.wg.Add(1)
		go s.run(pctx, p, s.started) // exits when the peer is killed or the mesh closed
	}
	return s
}

func (s *simMesh) declare(c *simConn, name string, i int) (*simPeer, error) {
	ex, q := "node."+name, "node."+name+".system"
	ch := c.sub
	steps := []error{
		ch.ExchangeDeclare(ex, "topic", true, false, false, false, nil),
		ch.ExchangeBind(ex, "to."+name+".#", "mesh", false, nil),
	}
	_, err := ch.QueueDeclare(q, false, true, true, false, nil)
	steps = append(steps, err,
		ch.QueueBind(q, "sys.#", "mesh", false, nil),
		ch.QueueBind(q, "to."+name+".sys.#", ex, false, nil))
	for _, err := range steps {
		if err != nil {
			return nil, fmt.Errorf("sim peer %s: %w", name, err)
		}
	}
	ds, err := ch.Consume(q, name, true, true, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("sim peer %s: consume: %w", name, err)
	}
	ring := make([]string, 0, 2)
	for k := 1; k <= 2 && k < len(s.names); k++ {
		ring = append(ring, s.names[(i+k)%len(s.names)])
	}
	return &simPeer{name: name, c: c, ring: ring, ctag: name, ds: ds, queue: q}, nil
}

// run is one peer: its deliveries, heartbeats and probes.
func (s *simMesh) run(ctx context.Context, p *simPeer, started time.Time) {
	defer s.wg.Done()
	caps := []string{"echo", "sim." + p.name}
	hash := node.HostHash(caps, nil)
	hb := node.HeartbeatIntervalFor(s.total, node.DefaultHeartbeatInterval, node.DefaultHeartbeatBudget)
	probe := node.DefaultDiscoveryInterval
	// Random phases: the mesh is in its steady state from the start.
	hbT := time.NewTimer(time.Duration(rand.Int64N(int64(hb))))
	prT := time.NewTimer(time.Duration(rand.Int64N(int64(probe))))
	defer hbT.Stop()
	defer prT.Stop()
	var seq uint64
	known := map[string]string{} // hash of each node that is not a simulated peer
	send := func(to, typ string, mod func(*node.Message), appID string) {
		seq++
		m := node.Message{V: 1, Type: typ, Node: p.name, To: to, StartedAt: started, Seq: seq, Proto: node.ProtocolVersion}
		if typ == node.TypePing || typ == node.TypeGone {
			m.V = 2
		}
		if mod != nil {
			mod(&m)
		}
		body, err := node.EncodeMessage(&m)
		if err != nil {
			return
		}
		key := "sys." + typ
		if to != "" {
			key = "to." + to + ".sys." + typ
		}
		s.publish(p.c, key, p.name, body, to != "", appID)
	}
	record := func(m *node.Message) {
		m.Version, m.Capabilities, m.Hash, m.HeartbeatMS = "sim", caps, hash, hb.Milliseconds()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-hbT.C:
			send("", node.TypeHeartbeat, func(m *node.Message) {
				m.Version, m.Hash, m.HeartbeatMS = "sim", hash, hb.Milliseconds()
			}, "")
			hbT.Reset(hb - time.Duration(rand.Float64()*0.2*float64(hb)))
		case <-prT.C:
			for _, to := range p.ring {
				s.publish(p.c, "to."+to+".sys."+wire.ProbeKey, p.name, nil, true, simProbe)
			}
			prT.Reset(probe - time.Duration(rand.Float64()*0.2*float64(probe)))
		case d, ok := <-p.ds:
			if !ok {
				return
			}
			s.deliveries.Add(1)
			key, ok := systemKey(d.RoutingKey, p.name)
			if !ok {
				continue
			}
			origin, _ := d.Headers[codec.HeaderOrigin].(string)
			if key == wire.ProbeKey || strings.HasPrefix(origin, "sim-") && (key == node.TypeHeartbeat || key == node.TypePing) {
				continue // a probe asks nothing; a peer's record never changes: nothing to learn (and the simulation's CPU is the node's)
			}
			m, err := node.DecodeMessage(key, d.Body, origin)
			if err != nil || m.Node == p.name || (m.To != "" && m.To != p.name) {
				continue
			}
			sim := strings.HasPrefix(m.Node, "sim-")
			switch m.Type {
			case node.TypeQuery:
				send(m.Node, node.TypeInfo, record, "")
			case node.TypeHello, node.TypeInfo, node.TypeUpdate:
				if !sim {
					known[m.Node] = m.Hash
				}
				if m.Type == node.TypeHello && m.Proto >= 2 {
					send(m.Node, node.TypeInfo, record, "") // as a version 2 node answers a hello
				}
			case node.TypeHeartbeat:
				if h, ok := known[m.Node]; !sim && (!ok || h != m.Hash) {
					send(m.Node, node.TypeQuery, nil, "")
				}
			case node.TypeGone:
				s.publish(p.c, "to."+m.Peer+".sys."+wire.ProbeKey, p.name, nil, true, simCheck)
			case node.TypeBye:
				delete(known, m.Node)
			}
		}
	}
}

// publish sends a system message as the bridge does: on the mesh
// exchange, type "system", the origin in Meshbox-Origin; mandatory when
// addressed, so the broker returns it when its addressee has no queue.
func (s *simMesh) publish(c *simConn, key, origin string, body []byte, mandatory bool, appID string) {
	c.pubMu.Lock()
	defer c.pubMu.Unlock()
	_ = c.pub.Publish("mesh", key, mandatory, false, amqp.Publishing{
		Type:        "system",
		ContentType: "application/json",
		AppId:       appID,
		Timestamp:   time.Now(),
		Headers:     amqp.Table{codec.HeaderOrigin: origin},
		Body:        body,
	})
}

// drainReturns handles the probes the broker could not route: a ring
// probe's prober tells the mesh its successor is gone. Exits when the
// connection closes.
func (s *simMesh) drainReturns(c *simConn) {
	defer s.wg.Done()
	var seq atomic.Uint64
	for r := range c.returns {
		if r.AppId != simProbe {
			continue
		}
		prober, _ := r.Headers[codec.HeaderOrigin].(string)
		gone, ok := strings.CutPrefix(r.RoutingKey, "to.")
		if !ok || prober == "" {
			continue
		}
		gone, _, _ = strings.Cut(gone, ".sys.")
		// The prober's run: a message from an earlier run would be dropped
		// as late. Its seq is counted apart from the prober's (gone
		// messages carry no record, so their seq is not compared).
		m := node.Message{V: 2, Type: node.TypeGone, Node: prober, Peer: gone, StartedAt: s.started,
			Seq: seq.Add(1), Proto: node.ProtocolVersion}
		body, err := node.EncodeMessage(&m)
		if err != nil {
			continue
		}
		s.publish(c, "sys."+node.TypeGone, prober, body, false, "")
	}
}

// kill stops peer name as a killed process stops: it says nothing more
// and the broker drops its queue. It returns when the queue is gone.
func (s *simMesh) kill(b *testing.B, name string) {
	b.Helper()
	p := s.peers[name]
	p.cancel()
	ch, err := p.c.conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	if _, err := ch.QueueDelete(p.queue, false, false, false); err != nil {
		b.Fatalf("delete the queue of %s: %v", name, err)
	}
}

func (s *simMesh) close(b *testing.B) {
	b.Helper()
	s.cancel()
	for _, c := range s.conns {
		if err := c.conn.Close(); err != nil {
			b.Errorf("close sim mesh: %v", err)
		}
	}
	s.wg.Wait()
}

// medianDuration returns the median of ds (sorted in place).
func medianDuration(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)/2]
}
