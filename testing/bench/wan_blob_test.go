package bench

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/blobs"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// The link of the WAN blob benchmark: a home uplink, with the WAN
// profile's delay (wanDelay).
const (
	wanBlobSize  = 5 << 20
	wanBandwidth = 1_000_000 // bits per second, each way
)

// BenchmarkWANBlob fetches a blob from a node behind a slow, distant link
// (its broker connections through a proxy that delays every chunk of data
// by wanDelay each way and limits it to wanBandwidth each way), with the
// default configuration on both nodes, in a mesh database (so sealed). It
// prints
//
//	BENCH wan-blob ours=<s> baseline=<s> ratio=<ours/baseline> link_bytes=<n> link_ratio=<n/blob>
//
// ours: the seconds `blobs.Fetcher` takes to fetch wanBlobSize bytes from
// the far node. baseline: the floor, the blob's bits at wanBandwidth.
// link_bytes: what the serving node wrote into the link during the fetch
// (counted by a relay in front of the proxy), link_ratio that over the
// blob's size. Targets: ratio at most 1.15, link_ratio at most 1.10.
func BenchmarkWANBlob(b *testing.B) {
	rmq := meshtest.NewRabbitMQ(b)
	amqpURL := rmq.Vhost(b)
	dbURL := benchMeshDB(b, amqpURL, "wan-a", "wan-b")
	u, err := url.Parse(amqpURL)
	if err != nil {
		b.Fatal(err)
	}
	px := meshtest.NewProxy(b, u.Host)
	px.Delay(b, wanDelay)
	px.Bandwidth(b, wanBandwidth)
	tap := meshtest.NewByteTap(b, px.Addr())
	nodeA := startBenchNode(b, "wan-a", tap.Rewrite(amqpURL, u.Host), dbURL)
	nodeB := startBenchNode(b, "wan-b", amqpURL, dbURL)
	ref := benchPutBlobSize(b, nodeA, wanBlobSize)
	meshtest.WaitFor(b, 60*time.Second, "wan-b sees wan-a", func() bool {
		for _, p := range nodeB.Status().Peers {
			if p.Name == "wan-a" && p.State == "up" {
				return true
			}
		}
		return false
	})
	floor := float64(wanBlobSize) * 8 / wanBandwidth
	for range b.N {
		took, up, res := wanFetch(b, nodeB, ref, tap)
		report("wan-blob", took.Seconds(), floor, "s",
			fmt.Sprintf("%d MiB from a node behind %d kbit/s and %s each way, default configuration; %d requests, %d retried; lower is better, targets ratio<=1.15 link_ratio<=1.10",
				wanBlobSize>>20, wanBandwidth/1000, wanDelay, res.Requests, res.Retries),
			fmt.Sprintf("link_bytes=%d", up), fmt.Sprintf("link_ratio=%.3f", float64(up)/wanBlobSize))
	}
}

// wanFetch fetches ref on node n and returns how long it took, the bytes
// the serving node wrote into its link meanwhile (tap), and the result.
func wanFetch(b *testing.B, n *appliance.Appliance, ref blobs.Ref, tap *meshtest.ByteTap) (time.Duration, int64, blobs.Result) {
	b.Helper()
	nc := benchConn(b, n.NATSURL(), meshtest.AdminOption(b, n.DataDir()))
	out := filepath.Join(b.TempDir(), "fetched")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	tap.Reset()
	start := time.Now()
	res, err := (&blobs.Fetcher{Conn: nc}).Fetch(ctx, ref, out)
	took := time.Since(start)
	if err != nil {
		b.Fatalf("fetch after %s: %v", took.Round(time.Millisecond), err)
	}
	// Late replies still on their way count too: give them a moment.
	time.Sleep(2 * time.Second)
	_ = os.Remove(out)
	return took, tap.Up(), res
}
