package bench

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/node"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// Mesh sizes of the idle-bytes benchmark and its target: the bytes per
// second, both directions, that one idle node may cost its link to the
// broker in a mesh of 10.
var idleBytesSizes = []int{3, 10}

const idleBytesTarget = 100.0

// Defaults of the idle-bytes benchmark's timing; MESHBOX_BENCH_IDLE_WARMUP
// and MESHBOX_BENCH_IDLE_WINDOW (Go durations) override them. The window
// covers a whole heartbeat interval of a mesh of 10 and some more, so that
// every node's heartbeat is in it once or twice: a shorter one may see
// none, and then counts the probes and the AMQP heartbeats alone.
const (
	idleBytesWarmUp = 10 * time.Second
	idleBytesWindow = node.DefaultHeartbeatInterval + 30*time.Second
)

// BenchmarkIdleBytes measures what an idle node costs its link to the
// broker: the bytes per second on its TCP connections to the broker, up
// and down, in a mesh of 3 and one of 10 idle nodes, measured side by
// side over the same window. Every node is a real node (the appliance:
// embedded NATS, bridge, discovery) in this process, with its own broker
// user and the mesh database, so that it seals and signs as a node of a
// real mesh does, at its default configuration; each node's broker
// connections go through a counting TCP proxy of its own
// (meshtest.CountingProxy). The count starts once every node sees every
// other up and the warm-up has passed, and runs over the window, with
// nothing sent by any program. It prints, per mesh size,
//
//	BENCH idle-bytes-<n> ours=<B/s> up=<B/s> down=<B/s> baseline=100 ratio=<ours/100> max=<B/s> ...
//
// where ours is the mean over the nodes of a node's bytes per second, up
// plus down, and max the busiest node's. Lower is better; the target is
// ours <= 100 at 10 nodes. The baseline is that target, not a
// measurement. Lines IDLE idle-bytes-<n> take the mean node's figure
// apart by direction, AMQP method and routing key: messages per second,
// bytes per second, bytes per message.
func BenchmarkIdleBytes(b *testing.B) {
	warmUp := idleDuration(b, "MESHBOX_BENCH_IDLE_WARMUP", idleBytesWarmUp)
	window := idleDuration(b, "MESHBOX_BENCH_IDLE_WINDOW", idleBytesWindow)
	rmq := meshtest.NewRabbitMQ(b)
	pg := meshtest.NewPostgres(b)
	for range b.N {
		meshes := make([][]idleNode, len(idleBytesSizes))
		for i, n := range idleBytesSizes {
			meshes[i] = startIdleMesh(b, rmq, pg, n)
		}
		for _, mesh := range meshes {
			waitMeshView(b, mesh)
		}
		time.Sleep(warmUp) // real time is the thing under test here
		before := make([][]idleSample, len(meshes))
		for i, mesh := range meshes {
			before[i] = sampleIdle(mesh)
		}
		start := time.Now()
		time.Sleep(window)
		wall := time.Since(start)
		for i, mesh := range meshes {
			reportIdleBytes(b, mesh, before[i], sampleIdle(mesh), wall)
		}
		for _, mesh := range meshes {
			for _, nd := range mesh {
				if c := nd.proxy.Connections(); c != 2 {
					b.Logf("%s: %d broker connections through its proxy, want 2 (publishing and consuming): a reconnect in the window?", nd.name, c)
				}
			}
		}
	}
}

// idleDuration reads a duration from the environment variable name, or
// returns def when it is unset.
func idleDuration(b *testing.B, name string, def time.Duration) time.Duration {
	b.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		b.Fatalf("%s=%q: want a positive Go duration such as 60s", name, v)
	}
	return d
}

// idleNode is one node of an idle mesh and the proxy its broker
// connections go through.
type idleNode struct {
	name  string
	a     *appliance.Appliance
	proxy *meshtest.CountingProxy
}

// startIdleMesh starts a mesh of n nodes on a vhost of rmq and a database
// of pg, each node's broker connections through a counting proxy of its
// own.
func startIdleMesh(b *testing.B, rmq *meshtest.Rabbit, pg *meshtest.PG, n int) []idleNode {
	b.Helper()
	amqpURL := rmq.Vhost(b)
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("idle%d-%02d", n, i)
	}
	dbURL := meshDBAt(b, pg.Database(b), amqpURL, names...)
	urls := benchBrokerUsers(b, rmq, amqpURL, names...)
	upstream := fmt.Sprintf("127.0.0.1:%d", rmq.Port())
	nodes := make([]idleNode, n)
	for i, name := range names {
		px := meshtest.NewCountingProxy(b, upstream)
		cfg := meshtest.NodeConfig(b, name)
		cfg.Log.Level = "warn"
		cfg.Broker = appliance.Secret(px.Rewrite(urls[name], upstream))
		cfg.DB = appliance.Secret(dbURL)
		nodes[i] = idleNode{name: name, a: meshtest.StartNode(b, cfg), proxy: px}
	}
	return nodes
}

// waitMeshView waits until every node of mesh is connected and sees every
// other up.
func waitMeshView(b *testing.B, mesh []idleNode) {
	b.Helper()
	for _, nd := range mesh {
		meshtest.WaitFor(b, 60*time.Second, nd.name+" sees every peer up", func() bool {
			st := nd.a.Status()
			up := 0
			for _, p := range st.Peers {
				if p.State == node.StateUp {
					up++
				}
			}
			return st.Broker.State == bridge.StateConnected && up == len(mesh)-1
		})
	}
}

// idleSample is what one node's proxy carried so far.
type idleSample struct {
	up, down int64
	frames   meshtest.FrameStats
}

func sampleIdle(mesh []idleNode) []idleSample {
	out := make([]idleSample, len(mesh))
	for i, nd := range mesh {
		out[i] = idleSample{nd.proxy.Up(), nd.proxy.Down(), nd.proxy.Frames()}
	}
	return out
}

// reportIdleBytes prints the BENCH and IDLE lines of mesh from its
// samples before and after the window (wall).
func reportIdleBytes(b *testing.B, mesh []idleNode, before, after []idleSample, wall time.Duration) {
	b.Helper()
	n, secs := len(mesh), wall.Seconds()
	var sumUp, sumDown, maxTotal float64
	frames := meshtest.FrameStats{}
	for i := range mesh {
		up := float64(after[i].up-before[i].up) / secs
		down := float64(after[i].down-before[i].down) / secs
		sumUp, sumDown, maxTotal = sumUp+up, sumDown+down, max(maxTotal, up+down)
		for k, v := range after[i].frames.Sub(before[i].frames) {
			s := frames[k]
			s.Count, s.Bytes = s.Count+v.Count, s.Bytes+v.Bytes
			frames[k] = s
		}
	}
	up, down := sumUp/float64(n), sumDown/float64(n)
	ours := up + down
	heartbeats := frames[meshtest.FrameKind{Dir: "up", Method: "basic.publish", Key: "sys.heartbeat"}].Count
	fmt.Printf("BENCH idle-bytes-%d ours=%.1f up=%.1f down=%.1f baseline=%.0f ratio=%.2f max=%.1f unit=B/s window=%s heartbeats_sent=%d nodes=%d (bytes per second per idle node on its broker connections, mean over the nodes, lower is better; baseline: the target at 10 nodes, %.0f B/s)\n",
		n, ours, up, down, idleBytesTarget, ours/idleBytesTarget, maxTotal, wall.Round(time.Second), heartbeats, n, idleBytesTarget)
	kinds := make([]meshtest.FrameKind, 0, len(frames))
	for k := range frames {
		kinds = append(kinds, k)
	}
	slices.SortFunc(kinds, func(x, y meshtest.FrameKind) int {
		return cmp.Or(-cmp.Compare(frames[x].Bytes, frames[y].Bytes), cmp.Compare(x.Dir, y.Dir), cmp.Compare(x.Method, y.Method), cmp.Compare(x.Key, y.Key))
	})
	per := float64(n) * secs // node-seconds: the figures are the mean node's
	for _, k := range kinds {
		s := frames[k]
		size := 0.0
		if s.Count > 0 {
			size = float64(s.Bytes) / float64(s.Count)
		}
		fmt.Printf("IDLE idle-bytes-%d %-4s %-16s %-22s msgs_per_s=%.3f bytes_per_s=%.1f bytes_per_msg=%.0f\n",
			n, k.Dir, k.Method, cmp.Or(k.Key, "-"), float64(s.Count)/per, float64(s.Bytes)/per, size)
	}
}
