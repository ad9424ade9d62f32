package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// benchMeshDB makes a mesh database whose nodes are nodes, with the broker
// at amqpURL, and returns its (owner's) URL: the bench's nodes read their
// keys from it and seal what they send.
func benchMeshDB(b *testing.B, amqpURL string, nodes ...string) string {
	b.Helper()
	return meshDBAt(b, meshtest.NewPostgres(b).Database(b), amqpURL, nodes...)
}

// meshDBAt makes the empty database at url a mesh database as benchMeshDB
// does, and returns url.
func meshDBAt(b *testing.B, url, amqpURL string, nodes ...string) string {
	b.Helper()
	withMeshDB(b, url, func(ctx context.Context, db *meshdb.DB) error {
		if _, err := db.Init(ctx, meshdb.InitOptions{Node: nodes[0], BrokerURL: meshtest.NoCredential(amqpURL)}); err != nil {
			return err
		}
		return addNodes(ctx, db, nodes[1:])
	})
	return url
}

// withMeshDB calls fn with the mesh database at url, open for the call;
// an error of either fails b.
func withMeshDB(b *testing.B, url string, fn func(context.Context, *meshdb.DB) error) {
	b.Helper()
	ctx := context.Background()
	db, err := meshdb.Open(ctx, url, meshdb.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	if err := fn(ctx, db); err != nil {
		b.Fatal(err)
	}
}

// addNodes adds nodes to the mesh database db.
func addNodes(ctx context.Context, db *meshdb.DB, nodes []string) error {
	for _, n := range nodes {
		if _, err := db.AddNode(ctx, cache.NodeRecord{Name: n}); err != nil {
			return err
		}
	}
	return nil
}

// BenchmarkSeal measures what sealing costs per message: AES-256-GCM seal
// and open of a body with the associated data the bridge binds (routing
// key, ids, origin, key id), per body size. It prints
//
//	BENCH seal-<size> ours=<µs per seal+open> mb_per_s=<body MB sealed and opened per second>
//
// Lower is better; no target: the bridge's command and request lines
// (BenchmarkBridge) are measured with sealing on, so they carry this cost.
func BenchmarkSeal(b *testing.B) {
	k := seal.NewContentKey()
	ring, err := seal.NewKeyring([]seal.ContentKey{k}, k.ID)
	if err != nil {
		b.Fatal(err)
	}
	sl, err := ring.Sealer()
	if err != nil {
		b.Fatal(err)
	}
	for range b.N {
		sealCost(b, ring, sl)
	}
}

// sealCost prints the BENCH seal lines.
func sealCost(b *testing.B, ring *seal.Keyring, sl *seal.Sealer) {
	for _, size := range []int{100, 1 << 10, 16 << 10, 256 << 10} {
		body := make([]byte, size)
		buf := make([]byte, 0, size+seal.Overhead)
		ad := seal.AssociatedData(nil, "meshbox message v1", "command", "cmd.resize", "0123456789ABCDEFGHIJKLMNOP", "", "", "bench-a", sl.ID())
		loops := max(200, 2_000_000/size) // about 2 MB of bodies per size
		start := time.Now()
		for range loops {
			sealed := sl.Seal(buf[:0], ad, body)
			if _, err := ring.Open(sealed[:0], sl.ID(), ad, sealed); err != nil {
				b.Fatal(err)
			}
		}
		ours := time.Since(start)
		perMsg := float64(ours.Nanoseconds()) / float64(loops) / 1e3
		fmt.Printf("BENCH seal-%d ours=%.2f unit=µs mb_per_s=%.0f (AES-256-GCM seal and open of a %d-byte body with its associated data, per message, lower is better)\n",
			size, perMsg, float64(size)/perMsg, size)
	}
}
