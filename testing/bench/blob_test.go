package bench

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/blobs"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// Sizes of the blob benchmark.
const (
	benchBlobSize   = 64 << 20 // bytes moved per run
	benchBlobRounds = 3        // runs of each, alternating; the median counts
)

// BenchmarkBlob compares a blob fetch across two nodes with raw amqp091-go
// moving the same chunks through the same broker, in one run. Two nodes,
// A and B, run in this process with the real appliance, in a mesh
// database (so sealed). It prints
//
//	BENCH blob ours=<MiB/s> baseline=<MiB/s> ratio=<ours/baseline>
//
// ours: a blob of benchBlobSize put on A, fetched on B with blobs.Fetcher
// as `meshbox blob get` does (each chunk a request from B to A through the
// broker and its reply, up to blobs.DefaultWindow chunks in flight as the
// measured rate allows, each chunk and the whole file verified, written to
// disk). baseline: raw amqp091-go
// publishing the same number of chunks of the same size, transient and
// without confirms (as requests and replies are), to a queue a consumer on
// another connection reads with a prefetch of the same window and acks:
// one way, no request, no sealing, no disk. The median of benchBlobRounds
// alternating runs of each. Higher is better; no target.
func BenchmarkBlob(b *testing.B) {
	rmq := meshtest.NewRabbitMQ(b)
	amqpURL := rmq.Vhost(b)
	dbURL := benchMeshDB(b, amqpURL, "blob-a", "blob-b")
	nodeA := startBenchNode(b, "blob-a", amqpURL, dbURL)
	nodeB := startBenchNode(b, "blob-b", amqpURL, dbURL)
	ref := benchPutBlob(b, nodeA)
	meshtest.WaitFor(b, 30*time.Second, "blob-b sees blob-a", func() bool {
		for _, p := range nodeB.Status().Peers {
			if p.Name == "blob-a" && p.State == "up" {
				return true
			}
		}
		return false
	})
	for range b.N {
		var ours, raw []throughput
		for range benchBlobRounds {
			ours = append(ours, blobFetchThroughput(b, nodeB, ref))
			raw = append(raw, rawChunkThroughput(b, amqpURL))
		}
		o, r := median(ours), median(raw)
		report("blob", o.perSec, r.perSec, "MiB/s",
			fmt.Sprintf("%d MiB across two nodes in %d KiB chunks, up to %d in flight, sealed and verified; higher is better", benchBlobSize>>20, blobs.ChunkSize>>10, blobs.DefaultWindow))
	}
}

// benchPutBlob stores benchBlobSize random bytes on node a.
func benchPutBlob(b *testing.B, a *appliance.Appliance) blobs.Ref {
	b.Helper()
	return benchPutBlobSize(b, a, benchBlobSize)
}

// benchPutBlobSize stores size random bytes on node a.
func benchPutBlobSize(b *testing.B, a *appliance.Appliance, size int64) blobs.Ref {
	b.Helper()
	path := filepath.Join(b.TempDir(), "blob")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	h := sha256.New()
	if _, err := io.CopyN(io.MultiWriter(f, h), rand.Reader, size); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	nc := benchConn(b, a.NATSURL(), meshtest.AdminOption(b, a.DataDir()))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := nc.RequestWithContext(ctx, blobs.SubjectOpen, nil); err != nil {
		b.Fatal(err)
	}
	store, err := blobs.Bind(ctx, nc)
	if err != nil {
		b.Fatal(err)
	}
	info, err := store.PutFile(ctx, path, 0)
	if err != nil {
		b.Fatal(err)
	}
	if want := hex.EncodeToString(h.Sum(nil)); info.SHA256 != want {
		b.Fatalf("put: got SHA-256 %s, want %s", info.SHA256, want)
	}
	return blobs.Ref{Node: a.Status().Node, SHA256: info.SHA256}
}

// blobFetchThroughput fetches ref on node n into a new file: MiB/s.
func blobFetchThroughput(b *testing.B, n *appliance.Appliance, ref blobs.Ref) throughput {
	b.Helper()
	nc := benchConn(b, n.NATSURL(), meshtest.AdminOption(b, n.DataDir()))
	out := filepath.Join(b.TempDir(), "fetched")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cpu0, start := cpuTime(b), time.Now()
	res, err := (&blobs.Fetcher{Conn: nc}).Fetch(ctx, ref, out)
	if err != nil {
		b.Fatal(err)
	}
	took := time.Since(start)
	if res.Size != benchBlobSize || res.Fetched != res.Chunks {
		b.Fatalf("fetch: got %+v", res)
	}
	_ = os.Remove(out)
	return throughput{perSec: float64(benchBlobSize) / (1 << 20) / took.Seconds(), cpu: (cpuTime(b) - cpu0) / time.Duration(res.Chunks)}
}

// rawChunkThroughput moves benchBlobSize bytes in chunks of
// blobs.ChunkSize from a raw publisher to a raw consumer: MiB/s.
func rawChunkThroughput(b *testing.B, amqpURL string) throughput {
	b.Helper()
	_, pub := rawChannel(b, amqpURL)
	_, sub := rawChannel(b, amqpURL)
	q, err := sub.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := sub.Qos(blobs.DefaultWindow, 0, false); err != nil {
		b.Fatal(err)
	}
	ds, err := sub.Consume(q.Name, "", false, true, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	chunk := make([]byte, blobs.ChunkSize)
	_, _ = rand.Read(chunk)
	n := benchBlobSize / blobs.ChunkSize
	got := make(chan error, 1)
	go func() { // the consumer: exits after n chunks or a closed channel
		for i := 0; i < n; i++ {
			d, ok := <-ds
			if !ok {
				got <- fmt.Errorf("consumer closed after %d chunks", i)
				return
			}
			if err := d.Ack(false); err != nil {
				got <- err
				return
			}
		}
		got <- nil
	}()
	ctx := context.Background()
	cpu0, start := cpuTime(b), time.Now()
	for range n {
		if err := pub.PublishWithContext(ctx, "", q.Name, false, false, amqp.Publishing{Body: chunk}); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-got; err != nil {
		b.Fatal(err)
	}
	took := time.Since(start)
	_ = sub.Close()
	_ = pub.Close()
	return throughput{perSec: float64(benchBlobSize) / (1 << 20) / took.Seconds(), cpu: (cpuTime(b) - cpu0) / time.Duration(n)}
}
