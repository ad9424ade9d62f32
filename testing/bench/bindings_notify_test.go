package bench

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// BenchmarkBindingsChange measures what one change of the mesh database
// costs the database when 1,000 nodes follow it: 1,000 cache.Managers,
// one per node record of the benchmark's mesh (see fill), each with its
// own bbolt cache and default configuration, share one meshdb.DB (a pool
// of 8 connections and one LISTEN connection whose notifications are
// fanned out to every manager — a real mesh holds one of each per node).
// After all have loaded, one mesh setting changes. It counts the loads
// and revision reads the managers make, the rows those loads return, the
// database's own count of transactions and rows read
// (pg_stat_database.xact_commit and tup_returned + tup_fetched), and how
// the reloads spread in time after the notification. It prints
//
//	BENCH bindings-change-1000 loads=<n> revision_reads=<n> rows_loaded=<n> db_xacts=<n> db_rows_read=<n> spread_ms=<first>..<last> peak_loads_per_100ms=<n>
func BenchmarkBindingsChange(b *testing.B) {
	ctx := context.Background()
	pg := meshtest.NewPostgres(b)
	url := pg.Database(b)
	db, err := meshdb.Open(ctx, url, meshdb.Options{StatementTimeout: time.Minute, MaxConns: 8})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Init(ctx, meshdb.InitOptions{Node: "node-0000", BrokerURL: "amqp://127.0.0.1:5672/"}); err != nil {
		b.Fatal(err)
	}
	fill(b, url)

	src := &countingSource{db: db}
	wctx, stopWatch := context.WithCancel(ctx)
	var watchDone sync.WaitGroup
	watchDone.Add(1)
	go func() { // the one LISTEN connection; exits when stopWatch is called
		defer watchDone.Done()
		_ = db.Watch(wctx, src.notifyAll, func(error) {})
	}()
	defer func() { stopWatch(); watchDone.Wait() }()

	dir := b.TempDir()
	var managers []*cache.Manager
	defer func() {
		for _, m := range managers {
			_ = m.Close()
		}
	}()
	for i := range benchNodes {
		node := fmt.Sprintf("node-%04d", i)
		store, err := cache.Open(filepath.Join(dir, node+".db"), cache.StoreOptions{Keep: 2})
		if err != nil {
			b.Fatal(err)
		}
		defer store.Close()
		m, err := cache.NewManager(cache.ManagerConfig{Node: node, Store: store, Source: src.forNode(),
			LoadTimeout: time.Minute, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		managers = append(managers, m)
		if err := m.Start(ctx); err != nil {
			b.Fatal(err)
		}
	}
	waitRevision(b, managers, 0) // every manager runs from the database

	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	var before int64
	if err := conn.QueryRow(ctx, "SELECT revision FROM mesh_revision").Scan(&before); err != nil {
		b.Fatal(err)
	}
	time.Sleep(2 * time.Second) // the start's loads and their statistics settle
	x0, r0 := dbStats(b, conn)
	src.reset()

	b.ResetTimer()
	changed := time.Now()
	if _, err := conn.Exec(ctx, "UPDATE settings SET value = $1 WHERE key = 'broker.url'", "amqp://127.0.0.1:5673/"); err != nil {
		b.Fatal(err)
	}
	waitRevision(b, managers, before)
	applied := time.Since(changed)
	b.StopTimer()
	time.Sleep(2 * time.Second) // the statistics of the last transactions reach pg_stat_database
	x1, r1 := dbStats(b, conn)

	loads, revs, rows, times := src.snapshot()
	var first, last time.Duration
	peak := 0
	if len(times) > 0 {
		slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
		first, last = times[0].Sub(changed), times[len(times)-1].Sub(changed)
		buckets := map[int64]int{}
		for _, t := range times {
			k := int64(t.Sub(changed) / (100 * time.Millisecond))
			buckets[k]++
			peak = max(peak, buckets[k])
		}
	}
	b.Logf("one change, %d nodes: all applied after %v", benchNodes, applied)
	fmt.Printf("BENCH bindings-change-%d loads=%d revision_reads=%d rows_loaded=%d db_xacts=%d db_rows_read=%d spread_ms=%.0f..%.0f peak_loads_per_100ms=%d applied_ms=%.0f\n",
		benchNodes, loads, revs, rows, x1-x0, r1-r0, ms(first), ms(last), peak, ms(applied))
}

// countingSource is the managers' shared source: it counts loads, the rows
// they return and revision reads, and fans the one LISTEN connection's
// notifications out to every manager's Watch.
type countingSource struct {
	db *meshdb.DB

	mu       sync.Mutex
	watchers []func()
	loads    int
	revs     int
	rows     int
	times    []time.Time // when each load started
}

// forNode returns the Source one manager uses.
func (s *countingSource) forNode() cache.Source { return nodeSource{s} }

func (s *countingSource) notifyAll() {
	s.mu.Lock()
	ws := slices.Clone(s.watchers)
	s.mu.Unlock()
	for _, w := range ws {
		w()
	}
}

func (s *countingSource) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loads, s.revs, s.rows, s.times = 0, 0, 0, nil
}

func (s *countingSource) snapshot() (loads, revs, rows int, times []time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.loads, s.revs, s.rows, slices.Clone(s.times)
}

type nodeSource struct{ s *countingSource }

func (n nodeSource) Load(ctx context.Context, node string) (cache.Snapshot, error) {
	start := time.Now()
	snap, err := n.s.db.Load(ctx, node)
	bb := snap.Bindings
	rows := 1 + len(bb.Nodes) + len(bb.Settings) + len(bb.Assignments) + len(bb.Overrides) + len(bb.Grants)
	n.s.mu.Lock()
	n.s.loads++
	n.s.rows += rows
	n.s.times = append(n.s.times, start)
	n.s.mu.Unlock()
	return snap, err
}

func (n nodeSource) Revision(ctx context.Context) (int64, error) {
	n.s.mu.Lock()
	n.s.revs++
	n.s.mu.Unlock()
	return n.s.db.Revision(ctx)
}

// Watch registers the manager for the shared connection's notifications
// and says it is connected, as meshdb's Watch does after it connects.
func (n nodeSource) Watch(ctx context.Context, changed func(), lost func(error)) error {
	n.s.mu.Lock()
	n.s.watchers = append(n.s.watchers, changed)
	n.s.mu.Unlock()
	changed()
	<-ctx.Done()
	return nil
}

// waitRevision waits until every manager runs bindings from the database
// at a revision above rev.
func waitRevision(b *testing.B, managers []*cache.Manager, rev int64) {
	b.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		behind := 0
		for _, m := range managers {
			if c, ok := m.Current(); !ok || c.Revision <= rev || m.Status().Source != cache.SourceDB {
				behind++
			}
		}
		if behind == 0 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d nodes not past revision %d after 2 minutes", behind, len(managers), rev)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dbStats returns the database's committed transactions and rows read.
func dbStats(b *testing.B, conn *pgx.Conn) (xacts, rows int64) {
	b.Helper()
	ctx := context.Background()
	if _, err := conn.Exec(ctx, "SELECT pg_stat_clear_snapshot()"); err != nil {
		b.Fatal(err)
	}
	err := conn.QueryRow(ctx, `SELECT xact_commit, tup_returned + tup_fetched FROM pg_stat_database WHERE datname = current_database()`).Scan(&xacts, &rows)
	if err != nil {
		b.Fatal(err)
	}
	return xacts, rows
}
