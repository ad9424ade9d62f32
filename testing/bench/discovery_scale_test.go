package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/node"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
)

// Mesh sizes of the scale benchmark, side by side in one run.
var scaleSizes = []int{200, 1000}

const (
	scaleJoinRuns = 3 // joins per size; the median is printed
	scaleKills    = 3 // peers killed at the largest size; the median is printed
)

// scaleResult is what one mesh size measured.
type scaleResult struct {
	n             int
	view          time.Duration // median time for a new node to build its full view
	meshPerSec    float64       // deliveries/s to every node's system queue, counted by the nodes
	brokerPerSec  float64       // the same from the broker's management statistics (deliver_get)
	window        time.Duration // the steady-state window counted
	heartbeat     time.Duration // the heartbeat interval at this size
	memPerPeer    float64       // heap bytes per peer of the node's view
	killed        time.Duration // median time to notice a killed peer (largest size only)
	killedMax     time.Duration
	heartbeatWndw time.Duration // the heartbeat window a hung peer is judged by
	brokerMemPer  float64       // mean memory of a system queue on the broker (the queue's process, as the management API reports it)
}

// BenchmarkDiscoveryAtScale runs a real node (embedded NATS server,
// bridge, node) in meshes of 200 and 1,000 simulated peers that speak
// the discovery protocol over the same real broker (see simMesh), and
// measures:
//
//   - view: from node.Start until every peer is up with its record (the
//     median of scaleJoinRuns joins);
//   - steady-state deliveries per second through the broker, for the
//     whole mesh and per node: counted by the simulation (every delivery
//     to a peer's or the node's system queue) over a window after the
//     join, and from the broker's side (the vhost's deliver_get in the
//     management API, which also holds the window's few returns);
//   - killed: how long until the node marks a killed peer gone (the peer
//     stops and the broker drops its queue, as when its process dies);
//   - mem: the growth of the process's live heap while the node learned
//     its peers, per peer (the simulation's own state was built before);
//     and the mean memory of a system queue on the broker in the steady
//     state, as the management API reports it.
//
// It prints, per size n:
//
//	BENCH discovery-<n> view_ms=<ms> deliveries_per_s=<mesh> per_node_per_s=<per node> broker_deliveries_per_s=<mesh> heartbeat_s=<interval>
//	BENCH discovery-1000 killed_noticed_ms=<median> max_ms=<max> heartbeat_window_s=<s> mem_per_peer_bytes=<bytes> broker_mem_per_system_queue_bytes=<bytes>
//
// Targets at 1,000: view under 500 ms, at most 10,000 deliveries/s for
// the whole mesh and one a second per node, a killed peer noticed within
// the heartbeat window.
func BenchmarkDiscoveryAtScale(b *testing.B) {
	r := meshtest.RabbitMQ(b)
	var results []scaleResult
	for _, n := range scaleSizes {
		res := measureScale(b, r, n, n == scaleSizes[len(scaleSizes)-1])
		results = append(results, res)
		b.Logf("discovery at %d peers: %+v", n, res)
	}
	for _, res := range results {
		fmt.Printf("BENCH discovery-%d view_ms=%.1f deliveries_per_s=%.0f per_node_per_s=%.2f broker_deliveries_per_s=%.0f heartbeat_s=%.1f\n",
			res.n, ms(res.view), res.meshPerSec, res.meshPerSec/float64(res.n+1), res.brokerPerSec, res.heartbeat.Seconds())
	}
	last := results[len(results)-1]
	fmt.Printf("BENCH discovery-%d killed_noticed_ms=%.0f max_ms=%.0f heartbeat_window_s=%.0f mem_per_peer_bytes=%.0f broker_mem_per_system_queue_bytes=%.0f\n",
		last.n, ms(last.killed), ms(last.killedMax), last.heartbeatWndw.Seconds(), last.memPerPeer, last.brokerMemPer)
	first := results[0]
	if last.view > 500*time.Millisecond {
		b.Logf("view of %d peers took %v: above the 500 ms target", last.n, last.view)
	}
	if last.meshPerSec > 10000 {
		b.Logf("%.0f deliveries/s at %d nodes: above the 10,000 target", last.meshPerSec, last.n)
	}
	if perNode := last.meshPerSec / float64(last.n+1); perNode > 1 {
		b.Logf("per node: %.2f/s at %d (%.2f/s at %d): above the target of 1/s", perNode, last.n, first.meshPerSec/float64(first.n+1), first.n)
	}
}

func measureScale(b *testing.B, r *meshtest.Rabbit, n int, kills bool) scaleResult {
	b.Helper()
	began := time.Now()
	step := func(what string) { // progress on stderr: the benchmark's log comes only at its end
		fmt.Fprintf(os.Stderr, "discovery-%d: %s after %v\n", n, what, time.Since(began).Round(time.Millisecond))
	}
	amqpURL := r.Vhost(b)
	res := scaleResult{n: n, heartbeat: node.HeartbeatIntervalFor(n+1, node.DefaultHeartbeatInterval, node.DefaultHeartbeatBudget)}
	res.heartbeatWndw = time.Duration(node.DefaultMissedHeartbeats) * res.heartbeat
	sims := startSimMesh(b, amqpURL, n, n+1)
	defer sims.close(b)
	step("simulated peers started")

	var nodeIn atomic.Int64
	var times []time.Duration
	var nd *node.Node
	for run := range scaleJoinRuns {
		var before runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		var took time.Duration
		var closeNode func()
		nd, took, closeNode = joinMesh(b, amqpURL, fmt.Sprintf("bench-%d-%d", n, run), n, &nodeIn)
		times = append(times, took)
		if run < scaleJoinRuns-1 {
			closeNode()
			continue
		}
		defer closeNode()
		var after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&after)
		res.memPerPeer = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
	}
	res.view = medianDuration(times)
	step(fmt.Sprintf("joined %d times", len(times)))

	// Steady state: let the join's answers drain, then count.
	time.Sleep(2 * time.Second)
	window := 15 * time.Second
	if n >= 1000 {
		window = 25 * time.Second // fewer heartbeats per second: a longer count
	}
	vhost := vhostOf(b, amqpURL)
	b0, t0 := brokerDeliveries(b, r, vhost, -1)
	s0, n0, start := sims.deliveries.Load(), nodeIn.Load(), time.Now()
	time.Sleep(window)
	s1, n1, end := sims.deliveries.Load(), nodeIn.Load(), time.Now()
	b1, t1 := brokerDeliveries(b, r, vhost, b0)
	res.window = end.Sub(start)
	res.meshPerSec = float64(s1-s0+n1-n0) / res.window.Seconds()
	if t1.After(t0) {
		res.brokerPerSec = float64(b1-b0) / t1.Sub(t0).Seconds()
	}

	res.brokerMemPer = queueMemory(b, r, vhost)
	step("steady state counted")
	if !kills {
		return res
	}
	var noticed []time.Duration
	for k := range scaleKills {
		victim := sims.names[(k+1)*n/(scaleKills+1)]
		sims.kill(b, victim)
		killed := time.Now()
		deadline := killed.Add(res.heartbeatWndw + 5*time.Second)
		for peerState(nd, victim) != node.StateGone {
			if time.Now().After(deadline) {
				b.Fatalf("killed peer %s not noticed within the heartbeat window %v", victim, res.heartbeatWndw)
			}
			time.Sleep(time.Millisecond)
		}
		noticed = append(noticed, time.Since(killed))
		step("killed peer noticed")
	}
	res.killedMax = slicesMax(noticed)
	res.killed = medianDuration(noticed)
	return res
}

// joinMesh starts node name (bridge connected first) on the broker at
// amqpURL and returns it once it sees want simulated peers up with their
// records, with the time that took from node.Start. Deliveries to the
// node's system queue are counted in in. close stops it.
func joinMesh(b *testing.B, amqpURL, name string, want int, in *atomic.Int64) (n *node.Node, took time.Duration, close func()) {
	b.Helper()
	srv := natstest.Start(b)
	dial := func(opts ...nats.Option) (*nats.Conn, error) {
		return natstest.Dialer(srv)(append([]nats.Option{nats.Name("meshbox-bridge")}, opts...)...)
	}
	api := natstest.Connect(b, srv, nats.Name("meshbox-api"))
	var nd atomic.Pointer[node.Node]
	logger := slog.New(slog.DiscardHandler)
	br, err := bridge.New(bridge.Config{
		Node:       name,
		URL:        amqpURL,
		OutboxPath: filepath.Join(b.TempDir(), "outbox.db"),
		Dial:       dial,
		OnSystem: func(key string, body []byte, origin string) {
			in.Add(1)
			nd.Load().HandleSystem(key, body, origin)
		},
		Logger: logger,
	}, api)
	if err != nil {
		b.Fatal(err)
	}
	if err := br.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	meshtest.WaitFor(b, 30*time.Second, "bridge connected", func() bool { return br.Status().Broker.State == bridge.StateConnected })
	n, err = node.New(node.Config{
		Name:    name,
		Version: "bench",
		Link:    br,
		NoRoute: func(err error) bool { return errors.Is(err, bridge.ErrNoRoute) },
		Logger:  logger,
	})
	if err != nil {
		b.Fatal(err)
	}
	nd.Store(n)
	close = func() {
		_ = n.Close()
		_ = br.Close()
	}
	start := time.Now()
	if err := n.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !complete(n.Peers(), want) {
		if time.Now().After(deadline) {
			b.Fatalf("node %s saw %d of %d peers after 30s", name, countComplete(n.Peers()), want)
		}
		// Copying the view of many peers holds the node's lock a while:
		// 1ms between looks for a few, 5ms for 1,000.
		time.Sleep(max(time.Millisecond, time.Duration(want)*5*time.Microsecond))
	}
	return n, time.Since(start), close
}

func peerState(n *node.Node, name string) string {
	for _, p := range n.Peers() {
		if p.Name == name {
			return p.State
		}
	}
	return ""
}

func slicesMax(ds []time.Duration) time.Duration {
	m := ds[0]
	for _, d := range ds {
		m = max(m, d)
	}
	return m
}

func vhostOf(b *testing.B, amqpURL string) string {
	b.Helper()
	u, err := url.Parse(amqpURL)
	if err != nil {
		b.Fatal(err)
	}
	return strings.TrimPrefix(u.Path, "/")
}

// brokerDeliveries reads the vhost's deliver_get counter from the
// management API. The broker refreshes it every few seconds, so it waits
// for the first value that differs from prev (any value when prev < 0)
// and returns it with the time it was seen: differences of two such
// readings cover whole refresh periods.
func brokerDeliveries(b *testing.B, r *meshtest.Rabbit, vhost string, prev int64) (int64, time.Time) {
	b.Helper()
	first := int64(-2)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		req, err := http.NewRequest(http.MethodGet, r.ManagementURL()+"/api/vhosts/"+url.PathEscape(vhost), nil)
		if err != nil {
			b.Fatal(err)
		}
		req.SetBasicAuth("guest", "guest")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		var v struct {
			Stats struct {
				DeliverGet int64 `json:"deliver_get"`
			} `json:"message_stats"`
		}
		err = json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		if err != nil {
			b.Fatal(err)
		}
		got := v.Stats.DeliverGet
		switch {
		case prev >= 0 && got != prev:
			return got, time.Now()
		case prev < 0 && first == -2:
			first = got // wait for the next refresh, to start on its edge
		case prev < 0 && got != first:
			return got, time.Now()
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.Fatalf("the broker's delivery statistics did not move in 30s")
	return 0, time.Time{}
}

// queueMemory returns the mean memory of the queues of vhost, as the
// management API reports it (the queue processes' memory).
func queueMemory(b *testing.B, r *meshtest.Rabbit, vhost string) float64 {
	b.Helper()
	req, err := http.NewRequest(http.MethodGet, r.ManagementURL()+"/api/queues/"+url.PathEscape(vhost)+"?columns=name,memory", nil)
	if err != nil {
		b.Fatal(err)
	}
	req.SetBasicAuth("guest", "guest")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var qs []struct {
		Name   string `json:"name"`
		Memory int64  `json:"memory"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&qs); err != nil {
		b.Fatalf("broker queues: %v", err)
	}
	var sum, n int64
	for _, q := range qs {
		if strings.HasSuffix(q.Name, ".system") {
			sum += q.Memory
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return float64(sum) / float64(n)
}
