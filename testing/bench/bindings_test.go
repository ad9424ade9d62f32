package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	bolt "go.etcd.io/bbolt"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// Size of the bindings benchmark's snapshot.
const (
	benchNodes     = 1000
	benchOverrides = 10000
	benchGrants    = 1000
	benchLoads     = 20 // loads timed per figure
)

// BenchmarkBindingsLoad loads one node's bindings — 1,000 node records,
// 10,000 overrides and 1,000 grants — from the mesh database (meshdb.Load:
// one REPEATABLE READ transaction, normalized and hashed) and from the bbolt
// cache (Store.Latest: decoded and hash-verified). Baselines in the same
// run: the same SELECTs with raw pgx, and a raw bbolt read plus JSON decode.
// It prints
//
//	BENCH bindings-load-db ours=<ms> baseline=<ms> ratio=<ours/baseline>
//	BENCH bindings-load-cache ours=<ms> baseline=<ms> ratio=<ours/baseline>
//
// with milliseconds per load.
func BenchmarkBindingsLoad(b *testing.B) {
	ctx := context.Background()
	pg := meshtest.NewPostgres(b)
	url := pg.Database(b)
	db, err := meshdb.Open(ctx, url, meshdb.Options{StatementTimeout: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Init(ctx, meshdb.InitOptions{Node: "node-0000", BrokerURL: "amqp://127.0.0.1:5672/"}); err != nil {
		b.Fatal(err)
	}
	fill(b, url)

	snap, err := db.Load(ctx, "node-0000")
	if err != nil {
		b.Fatal(err)
	}
	if n, o, g := len(snap.Bindings.Nodes), len(snap.Bindings.Overrides), len(snap.Bindings.Grants); n != benchNodes || o != benchOverrides || g != benchGrants {
		b.Fatalf("snapshot has %d nodes, %d overrides, %d grants; want %d, %d, %d", n, o, g, benchNodes, benchOverrides, benchGrants)
	}
	path := filepath.Join(b.TempDir(), "cache.db")
	store, err := cache.Open(path, cache.StoreOptions{})
	if err != nil {
		b.Fatal(err)
	}
	if err := store.Put(snap); err != nil {
		b.Fatal(err)
	}
	if err := store.Close(); err != nil {
		b.Fatal(err)
	}

	raw, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close(ctx)

	b.ResetTimer()
	for range b.N {
		dbOurs := perLoad(func() {
			if _, err := db.Load(ctx, "node-0000"); err != nil {
				b.Fatal(err)
			}
		})
		dbRaw := perLoad(func() { rawLoad(b, raw, "node-0000") })
		cacheOurs := timeCache(b, path)
		cacheRaw := timeRawCache(b, path)
		b.StopTimer()
		fmt.Printf("BENCH bindings-load-db ours=%.2f baseline=%.2f ratio=%.2f\n", ms(dbOurs), ms(dbRaw), ratio(dbOurs, dbRaw))
		fmt.Printf("BENCH bindings-load-cache ours=%.2f baseline=%.2f ratio=%.2f\n", ms(cacheOurs), ms(cacheRaw), ratio(cacheOurs, cacheRaw))
		b.ReportMetric(ms(dbOurs), "ms/db-load")
		b.ReportMetric(ms(cacheOurs), "ms/cache-load")
		b.StartTimer()
	}
}

// timeCache times Store.Latest (decode and hash check) on the cache file.
func timeCache(tb testing.TB, path string) time.Duration {
	tb.Helper()
	store, err := cache.Open(path, cache.StoreOptions{ReadOnly: true})
	if err != nil {
		tb.Fatal(err)
	}
	defer store.Close()
	return perLoad(func() {
		s, err := store.Latest()
		if err != nil || len(s.Bindings.Overrides) != benchOverrides {
			tb.Fatalf("cache load: %d overrides, %v", len(s.Bindings.Overrides), err)
		}
	})
}

// timeRawCache is the baseline for the cache: the newest value read with
// bbolt directly and JSON-decoded, without normalizing or the hash check.
func timeRawCache(tb testing.TB, path string) time.Duration {
	tb.Helper()
	bdb, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	defer bdb.Close()
	return perLoad(func() {
		var snap cache.Snapshot
		err := bdb.View(func(tx *bolt.Tx) error {
			_, v := tx.Bucket([]byte("snapshots")).Cursor().Last()
			return json.Unmarshal(v, &snap)
		})
		if err != nil || len(snap.Bindings.Overrides) != benchOverrides {
			tb.Fatalf("raw cache read: %d overrides, %v", len(snap.Bindings.Overrides), err)
		}
	})
}

// fill writes the benchmark's rows with COPY (the revision triggers fire
// for every row, as for any writer).
func fill(tb testing.TB, url string) {
	tb.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close(ctx)
	var nodes [][]any
	for i := 1; i < benchNodes; i++ { // node-0000 exists already
		nodes = append(nodes, []any{fmt.Sprintf("node-%04d", i), fmt.Sprintf("node-%04d.example.org", i), "ed25519:" + fmt.Sprint(i)})
	}
	var overrides, grants [][]any
	for i := range benchOverrides {
		overrides = append(overrides, []any{"node-0000", fmt.Sprintf("module-%03d", i%100), fmt.Sprintf("key-%05d", i), fmt.Sprintf("value %d", i)})
		// Another node's overrides, which the load must skip.
		overrides = append(overrides, []any{"node-0001", fmt.Sprintf("module-%03d", i%100), fmt.Sprintf("key-%05d", i), "other"})
	}
	for i := range benchGrants {
		grants = append(grants, []any{"node-0000", fmt.Sprintf("resource-%04d", i), fmt.Sprintf("node-%04d", i), fmt.Sprintf("credential-%d", i)})
		grants = append(grants, []any{"node-0002", fmt.Sprintf("resource-%04d", i), fmt.Sprintf("node-%04d", i), "other"})
	}
	for _, t := range []struct {
		table string
		cols  []string
		rows  [][]any
	}{
		{"nodes", []string{"name", "public_name", "identity"}, nodes},
		{"overrides", []string{"node", "module", "key", "value"}, overrides},
		{"grants", []string{"consumer", "resource", "provider", "credential"}, grants},
	} {
		if _, err := conn.CopyFrom(ctx, pgx.Identifier{t.table}, t.cols, pgx.CopyFromRows(t.rows)); err != nil {
			tb.Fatalf("fill %s: %v", t.table, err)
		}
	}
}

// rawLoad is the baseline for the database: the same queries with raw pgx,
// no transaction snapshot, no normalizing or hashing.
func rawLoad(tb testing.TB, conn *pgx.Conn, node string) {
	ctx := context.Background()
	for _, q := range []string{
		`SELECT name, public_name, identity FROM nodes`,
		`SELECT key, value FROM settings`,
		`SELECT module, selection, autostart FROM assignments WHERE node = '` + node + `'`,
		`SELECT module, key, value FROM overrides WHERE node = '` + node + `'`,
		`SELECT consumer, resource, provider, credential FROM grants WHERE consumer = '` + node + `'`,
	} {
		rows, err := conn.Query(ctx, q)
		if err != nil {
			tb.Fatal(err)
		}
		for rows.Next() {
			if _, err := rows.Values(); err != nil {
				tb.Fatal(err)
			}
		}
		rows.Close()
		if rows.Err() != nil {
			tb.Fatal(rows.Err())
		}
	}
}

// perLoad runs fn once to warm up, then benchLoads times, and returns
// the mean.
func perLoad(fn func()) time.Duration {
	fn() // warm up
	start := time.Now()
	for range benchLoads {
		fn()
	}
	return time.Since(start) / benchLoads
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func ratio(ours, raw time.Duration) float64 {
	if raw == 0 {
		return 0
	}
	return float64(ours) / float64(raw)
}
