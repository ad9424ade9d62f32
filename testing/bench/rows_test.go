package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// The tables of rows, measured (issue "state as rows"): one table, bench,
// sealed with the mesh's key, on nodes running in this process with the
// real appliance; the API called over NATS as programs call it.
const (
	rowsTable        = "bench"
	rowsWriteCount   = 100000 // row writes of the write line
	rowsPerPut       = 1000   // rows of a batch put
	rowsPutsInFlight = 4      // batch puts in flight
	rowsConvergeEach = 10000  // rows each of the three nodes writes while cut off
	rowsJoinCount    = 100000 // rows in the table a new node joins
	rowsValueLen     = 64     // bytes of a row's payload field
	// rawRowsWindow is the raw baseline's confirms outstanding at once.
	// A sweep of 100,000 messages, three rounds on the 2-core machine of
	// docs/performance.md: 64 gave 32-37k msg/s; 256, 1,024 and 4,096
	// 42-54k each, within the noise of one another.
	rawRowsWindow = 1024
	// rowsPerMessage is the most row writes a node's log message carries
	// (the engine's publish batch).
	rowsPerMessage = 128
)

// rawBatchWindows are the confirm windows the batched baseline tries (a
// SWEEP line each); it keeps the best.
var rawBatchWindows = []int{4, 16, 64, 256}

// BenchmarkRows measures the tables of rows and prints three lines:
//
//	BENCH rows-write ours=<rows/s> baseline=<msg/s> ratio=<ours/baseline>
//
// ours: rowsWriteCount rows (of two fields, status and a 64-byte
// payload) written as a program that writes many rows writes them, in
// batch puts (putmany) of rowsPerPut rows, rowsPutsInFlight at a time,
// through one node's rows API, timed from the first request until the
// broker has confirmed every row into the table's log (the table's
// pending count back at 0): each batch committed on the node's disk
// first, then sealed and published with confirms. baseline: raw
// amqp091-go publishing as many persistent messages, each the size of
// one write sealed alone, with publisher confirms and rawRowsWindow
// outstanding, to a stream queue with the same arguments as a table's
// log. Higher is better; target >= 0.7. The line also gives the CPU time
// a row of this process (node, NATS server and writer) and of the
// broker, and baseline_batched: raw amqp091-go publishing the same rows
// in messages of rowsPerMessage, the bytes the node sends, at the best
// of rawBatchWindows outstanding (ratio_batched: ours over it).
//
//	BENCH rows-converge ours=<rows/s> baseline=<rows/s> ratio=<ours/baseline>
//
// Three nodes, each reaching the broker through a proxy of its own, are
// cut off from it; each writes rowsConvergeEach rows of its own; the
// links are restored. ours: the rows of all three (3 x rowsConvergeEach)
// over the time from the restore until every node holds all of them,
// nothing pending and nothing unread in the log (then checked cell for
// cell alike on the three). baseline: the rows-write figure of this
// run. Higher is better; target >= 0.5.
//
//	BENCH rows-join ours=<ms> baseline=<ms> ratio=<ours/baseline>
//
// A node writes rowsJoinCount rows and compacts the table (a snapshot
// of them all into its log, in parts of version 2, binary); then a node
// new to the table starts. ours: from its reader's start (the node connected
// and holding the table's key; its status's reading_since) until it
// holds every row and has read the log to its end; node_start, beside
// it, is the time from the node's start to its reader's. baseline: raw amqp091-go reading the
// same messages (from the offset the new node starts at, the newest
// snapshot's, to the log's end) with a prefetch of 2,048 (the node
// holds 256) and acks per 512, neither opening nor applying them. Three
// new nodes join one after the other, each followed by a raw read; the
// line is the median of each. Lower is better; target <= 2.0.
func BenchmarkRows(b *testing.B) {
	rmq := meshtest.NewRabbitMQ(b)
	var writeRate float64
	b.Run("write", func(b *testing.B) {
		amqpURL := rmq.Vhost(b)
		dbURL := rowsMeshDB(b, amqpURL, "rows-w")
		node := startRowsNode(b, "rows-w", amqpURL, dbURL)
		for range b.N {
			cpu0, bcpu0 := cpuTime(b), rmq.CPUTime(b)
			start := writeRows(b, node, "w", 0, rowsWriteCount)
			answered := time.Since(start)
			meshtest.WaitFor(b, 5*time.Minute, "rows-w's writes at the broker", func() bool {
				s := rowsStatus(node)
				return s != nil && s.Pending == 0 && s.Rows >= rowsWriteCount
			})
			took := time.Since(start)
			cpu, bcpu := (cpuTime(b)-cpu0)/rowsWriteCount, (rmq.CPUTime(b)-bcpu0)/rowsWriteCount
			writeRate = float64(rowsWriteCount) / took.Seconds()
			raw := rawStreamPublish(b, amqpURL, rowsWriteCount, sealedWriteSize())
			batched, batchWindow := rawBatchedPublish(b, amqpURL)
			report("rows-write", writeRate, raw, "rows/s",
				fmt.Sprintf("%d rows of two fields written by batch puts of %d rows, %d puts in flight, committed on the node's disk, then sealed into the table's log with confirms; "+
					"baseline raw amqp091-go, one persistent message a row of its size sealed alone (%d B), confirms with %d outstanding, into a stream queue; "+
					"baseline_batched the same rows in messages of %d as the node sends them (%d B), %d outstanding, the best of a sweep; higher is better; target ratio >= 0.7",
					rowsWriteCount, rowsPerPut, rowsPutsInFlight, sealedWriteSize(), rawRowsWindow, rowsPerMessage, sealedBatchSize(rowsPerMessage), batchWindow),
				fmt.Sprintf("took=%.2fs", took.Seconds()), fmt.Sprintf("answered=%.2fs", answered.Seconds()),
				fmt.Sprintf("cpu_per_row=%.1fµs", us(cpu)), fmt.Sprintf("broker_cpu_per_row=%.1fµs", us(bcpu)),
				fmt.Sprintf("baseline_batched=%.0f", batched), fmt.Sprintf("ratio_batched=%.2f", benchRatio(writeRate, batched)))
		}
	})
	b.Run("converge", func(b *testing.B) {
		amqpURL := rmq.Vhost(b)
		names := []string{"rows-c1", "rows-c2", "rows-c3"}
		dbURL := rowsMeshDB(b, amqpURL, names...)
		upstream := fmt.Sprintf("127.0.0.1:%d", rmq.Port())
		var nodes []*appliance.Appliance
		var proxies []*meshtest.Proxy
		for _, n := range names {
			px := meshtest.NewProxy(b, upstream)
			proxies = append(proxies, px)
			nodes = append(nodes, startRowsNode(b, n, px.Rewrite(amqpURL, upstream), dbURL))
		}
		for range b.N {
			for _, px := range proxies {
				px.Cut(b)
			}
			var wg sync.WaitGroup
			for i, n := range nodes {
				wg.Go(func() { writeRows(b, n, names[i], 0, rowsConvergeEach) })
			}
			wg.Wait()
			total := len(nodes) * rowsConvergeEach
			for i, n := range nodes {
				if s := rowsStatus(n); s == nil || s.Pending != rowsConvergeEach {
					b.Fatalf("%s, cut off, has %+v; want %d writes pending", names[i], s, rowsConvergeEach)
				}
			}
			start := time.Now()
			for _, px := range proxies {
				px.Restore(b)
			}
			meshtest.WaitFor(b, 10*time.Minute, "the three nodes hold every row", func() bool {
				for _, n := range nodes {
					s := rowsStatus(n)
					if s == nil || s.Rows != total || s.Pending != 0 || !s.Synced || s.Behind != 0 {
						return false
					}
				}
				return true
			})
			took := time.Since(start)
			first := rowsDigest(b, nodes[0])
			for i, n := range nodes[1:] {
				if d := rowsDigest(b, n); d != first {
					b.Fatalf("%s and %s hold different rows after converging", names[0], names[i+1])
				}
			}
			rate := float64(total) / took.Seconds()
			report("rows-converge", rate, writeRate, "rows/s",
				fmt.Sprintf("3 nodes each wrote %d rows cut off from the broker; rows of all three over the time from the restore until every node holds all and they are alike; baseline the rows-write rate of this run; higher is better; target ratio >= 0.5", rowsConvergeEach),
				fmt.Sprintf("took=%.2fs", took.Seconds()))
		}
	})
	b.Run("join", func(b *testing.B) { benchRowsJoin(b, rmq, "rows-join", 0) })
}

// BenchmarkWANRowsJoin is BenchmarkRows's join with the joiners, and
// the raw reads, reaching the broker through a link of wanDelay each
// way: what the round trips of a join cost on a home link.
//
//	BENCH wan-rows-join ours=<ms> baseline=<ms> ratio=<ours/baseline>
func BenchmarkWANRowsJoin(b *testing.B) {
	benchRowsJoin(b, meshtest.NewRabbitMQ(b), "wan-rows-join", wanDelay)
}

// benchRowsJoin is the join of BenchmarkRows on rmq, reported as line,
// the joiners and raw reads behind a link of delay each way (0: none).
func benchRowsJoin(b *testing.B, rmq *meshtest.Rabbit, line string, delay time.Duration) {
	amqpURL := rmq.Vhost(b)
	// The joiners join the mesh after the snapshot, as a new node
	// does: with a node it has not heard in the mesh, the writer
	// writes its snapshot in JSON, which nodes of before read.
	dbURL := rowsMeshDB(b, amqpURL, "rows-j0")
	// One snapshot, once the writer has read all its rows back: at
	// the default threshold (every 10,000 changes) the last one
	// came before the end of the writes as often as not, and the
	// rest (under the threshold) waited hours for the next.
	writer := startRowsNode(b, "rows-j0", amqpURL, dbURL, func(c *appliance.Config) { c.Rows.SnapshotEvery = rowsJoinCount })
	writeRows(b, writer, "j", 0, rowsJoinCount)
	done := time.Now()
	var last *rows.TableStatus
	defer func() {
		if b.Failed() && last != nil {
			b.Logf("rows-j0's table at the end: %+v", *last)
		}
	}()
	meshtest.WaitFor(b, 5*time.Minute, "rows-j0's writes at the broker and a snapshot of them", func() bool {
		s := rowsStatus(writer)
		last = s
		return s != nil && s.Pending == 0 && s.Behind == 0 && s.LastSnapshot != nil && s.LastSnapshot.After(done)
	})
	addMeshNodes(b, dbURL, "rows-j1", "rows-j2", "rows-j3")
	// The joiners, and the raw reads, reach the broker through a link
	// that adds delay each way (none: straight).
	joinURL, where, target := amqpURL, "", "target ratio <= 2.0"
	if delay > 0 {
		u, err := url.Parse(amqpURL)
		if err != nil {
			b.Fatal(err)
		}
		px := meshtest.NewProxy(b, u.Host)
		px.Delay(b, delay)
		joinURL = px.Rewrite(amqpURL, u.Host)
		where, target = fmt.Sprintf(", joining through a link of %s each way", delay), "no target: what a join over a home link costs"
	}
	for i := range b.N {
		var ours, raw, starts, cpus []time.Duration
		for round := range 3 {
			name := fmt.Sprintf("rows-j%d", round+1)
			if i > 0 {
				break // the joiners are new once
			}
			start := time.Now()
			stopProfile := joinProfile(b, round)
			n := startRowsNode(b, name, joinURL, dbURL)
			var reading time.Time
			var cpuAtReading time.Duration
			// Read every 2 ms (the tests' poller reads every 20), the
			// tables' status alone: the time is the node's to within
			// that, and the reads cost the join little.
			finePoll(b, 5*time.Minute, name+" holds the whole table", func() bool {
				s := rowsStatus(n)
				if s != nil && s.ReadingSince != nil && reading.IsZero() {
					reading, cpuAtReading = *s.ReadingSince, cpuTime(b)
				}
				return s != nil && s.Rows == rowsJoinCount && s.Synced && s.Behind == 0
			})
			held := time.Now()
			cpus = append(cpus, cpuTime(b)-cpuAtReading)
			stopProfile()
			if reading.IsZero() || start.After(reading) {
				b.Fatalf("%s: its reader's start is %v, the node's %v", name, reading, start)
			}
			ours = append(ours, held.Sub(reading))
			starts = append(starts, reading.Sub(start))
			// The joiner then checks its snapshot against the log
			// before it, in the background: the raw read and the next
			// round start once that is done, not beside it.
			meshtest.WaitFor(b, 5*time.Minute, name+" has checked its snapshot", func() bool {
				s := rowsStatus(n)
				return s != nil && !s.Verifying
			})
			r, msgs, bytes := rawStreamRead(b, joinURL)
			raw = append(raw, r)
			if round == 0 {
				fmt.Printf(line+": the new node reads %d log messages (%.1f MB) from the newest snapshot on\n", msgs, float64(bytes)/1e6)
			}
		}
		o, r := medianDuration(ours), medianDuration(raw)
		report(line, float64(o.Milliseconds()), float64(r.Milliseconds()), "ms",
			fmt.Sprintf("a node new to a table of %d rows (compacted)%s, from its reader's start (connected, holding the table's key: status reading_since) until it holds every row; baseline raw amqp091-go dialing and reading the same messages of the log (prefetch 2048, the node's 256; acks per 512), not opening them; cpu_ms this process's CPU from the reader's start until it holds every row (the joiner's, and the idle writer's and earlier joiners'); lower is better; %s", rowsJoinCount, where, target),
			fmt.Sprintf("node_start=%dms", medianDuration(starts).Milliseconds()),
			fmt.Sprintf("cpu_ms=%d", medianDuration(cpus).Milliseconds()))
	}
}

// rowsMeshDB is benchMeshDB with the table rowsTable defined.
func rowsMeshDB(b *testing.B, amqpURL string, nodes ...string) string {
	b.Helper()
	url := benchMeshDB(b, amqpURL, nodes...)
	spec, _ := json.Marshal(rows.TableSpec{})
	withMeshDB(b, url, func(ctx context.Context, db *meshdb.DB) error {
		_, err := db.SetSetting(ctx, appliance.TableSettingPrefix+rowsTable, string(spec))
		return err
	})
	return url
}

// addMeshNodes adds nodes to the mesh database at url.
func addMeshNodes(b *testing.B, url string, nodes ...string) {
	b.Helper()
	withMeshDB(b, url, func(ctx context.Context, db *meshdb.DB) error { return addNodes(ctx, db, nodes) })
}

// startRowsNode starts a node and waits until it reads the table's log.
func startRowsNode(b *testing.B, name, amqpURL, dbURL string, configure ...func(*appliance.Config)) *appliance.Appliance {
	b.Helper()
	n := startBenchNode(b, name, amqpURL, dbURL, append([]func(*appliance.Config){func(c *appliance.Config) { c.Log.Level = "warn" }}, configure...)...)
	meshtest.WaitFor(b, time.Minute, name+" reads the table's log", func() bool {
		s := rowsStatus(n)
		return s != nil && s.Synced
	})
	return n
}

// rowsStatus is the node's status of rowsTable (nil: none yet).
func rowsStatus(n *appliance.Appliance) *rows.TableStatus {
	for _, s := range n.RowsStatus() {
		if s.Table == rowsTable {
			return &s
		}
	}
	return nil
}

// rowsValue is a row's payload: rowsValueLen bytes.
var rowsValue = strings.Repeat("x", rowsValueLen)

// writeRows puts rows prefix-<from>..prefix-<to-1> on node n, as a
// program that writes many rows does: batch puts (putmany) of
// rowsPerPut rows, pipelined on a few connections, rowsPutsInFlight in
// flight in all, each answer taken by one subscription of the
// connection's own inbox prefix; it returns when it started, after every
// answer. A put refused fails the benchmark.
func writeRows(b *testing.B, n *appliance.Appliance, prefix string, from, to int) time.Time {
	b.Helper()
	const conns = 4
	var next atomic.Int64
	next.Store(int64(from))
	var failed atomic.Pointer[error]
	fail := func(err error) { failed.CompareAndSwap(nil, &err) }
	start := time.Now()
	var wg sync.WaitGroup
	for range conns {
		nc := benchConn(b, n.NATSURL(), meshtest.AdminOption(b, n.DataDir()))
		inbox := nc.NewInbox()
		window := make(chan struct{}, rowsPutsInFlight/conns)
		var answered sync.WaitGroup
		sub, err := nc.Subscribe(inbox+".*", func(m *nats.Msg) {
			if c := m.Header.Get("Nats-Service-Error-Code"); c != "" {
				fail(fmt.Errorf("put refused: %s %s", c, m.Header.Get("Nats-Service-Error")))
			}
			<-window
			answered.Done()
		})
		if err != nil {
			b.Fatal(err)
		}
		_ = sub.SetPendingLimits(-1, -1)
		wg.Go(func() {
			defer sub.Unsubscribe()
			for failed.Load() == nil {
				i := next.Add(rowsPerPut) - rowsPerPut
				if i >= int64(to) {
					break
				}
				var req rows.Request
				for r := i; r < min(i+rowsPerPut, int64(to)); r++ {
					req.Rows = append(req.Rows, rows.RowPut{Row: fmt.Sprintf("%s-%07d", prefix, r),
						Set: map[string]string{"status": "queued", "payload": rowsValue}})
				}
				body, _ := json.Marshal(req)
				select {
				case window <- struct{}{}:
				case <-time.After(30 * time.Second):
					fail(errors.New("no answer to a put within 30 s"))
					return
				}
				answered.Add(1)
				if err := nc.PublishRequest(rows.Subject(rowsTable, rows.OpPutMany), inbox+"."+strconv.FormatInt(i, 10), body); err != nil {
					fail(err)
					return
				}
			}
			done := make(chan struct{})
			go func() { answered.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				fail(errors.New("puts unanswered after 30 s"))
			}
		})
	}
	wg.Wait()
	if e := failed.Load(); e != nil {
		b.Fatalf("%s: %v", n.Status().Node, *e)
	}
	return start
}

// rowsDigest lists every row of the table on n, a page at a time, into
// one string of rows, fields, values, stamps and writers.
func rowsDigest(b *testing.B, n *appliance.Appliance) string {
	b.Helper()
	nc := benchConn(b, n.NATSURL(), meshtest.AdminOption(b, n.DataDir()))
	var sb strings.Builder
	after := ""
	for {
		body, _ := json.Marshal(rows.Request{After: after, Limit: 2000})
		resp, err := nc.Request(rows.Subject(rowsTable, rows.OpList), body, 30*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		var page rows.ListDoc
		if err := json.Unmarshal(resp.Data, &page); err != nil {
			b.Fatalf("list: %v: %.200q", err, resp.Data)
		}
		for _, r := range page.Rows {
			fmt.Fprintf(&sb, "%s", r.Row)
			for _, f := range slices.Sorted(maps.Keys(r.Versions)) {
				v := r.Versions[f]
				fmt.Fprintf(&sb, " %s=%q@%s/%s/%v", f, v.Value, v.Stamp, v.Node, v.Deleted)
			}
			sb.WriteByte('\n')
			after = r.Row
		}
		if !page.More {
			return sb.String()
		}
	}
}

// sealedWriteSize is the size of one row write sealed alone: its change
// as JSON in a log batch, with the seal's nonce and tag.
func sealedWriteSize() int { return sealedBatchSize(1) }

// sealedBatchSize is the size of a log message of n row writes, sealed.
func sealedBatchSize(n int) int {
	c := rows.Change{Table: rowsTable, Row: "w-0000000", Cells: rows.CellsOf(map[string]rows.WireCell{
		"status":  {Stamp: 1 << 50, Node: "rows-w", Value: []byte("queued")},
		"payload": {Stamp: 1 << 50, Node: "rows-w", Value: []byte(rowsValue)},
	})}
	j, _ := json.Marshal(struct {
		V       int           `json:"v"`
		Kind    string        `json:"kind"`
		Node    string        `json:"node"`
		Changes []rows.Change `json:"changes"`
	}{1, "changes", "rows-w", slices.Repeat([]rows.Change{c}, n)})
	return len(j) + 12 + 16 // AES-GCM nonce and tag
}

// rawStreamPublish publishes n persistent messages of size bytes with
// confirms, rawRowsWindow outstanding, to a new stream queue declared as
// a table's log is: messages per second.
func rawStreamPublish(b *testing.B, amqpURL string, n, size int) float64 {
	b.Helper()
	return rawStreamPublishWindow(b, amqpURL, n, size, rawRowsWindow)
}

// rawBatchedPublish publishes rowsWriteCount rows as raw messages of
// rowsPerMessage rows, at each of rawBatchWindows confirms outstanding:
// the best rate in rows a second, and its window.
func rawBatchedPublish(b *testing.B, amqpURL string) (rate float64, window int) {
	b.Helper()
	msgs := (rowsWriteCount + rowsPerMessage - 1) / rowsPerMessage
	for _, w := range rawBatchWindows {
		r := rawStreamPublishWindow(b, amqpURL, msgs, sealedBatchSize(rowsPerMessage), w) * rowsPerMessage
		fmt.Printf("SWEEP rows-raw-batched window=%d rows/s=%.0f\n", w, r)
		if r > rate {
			rate, window = r, w
		}
	}
	return rate, window
}

// rawStreamPublishWindow is rawStreamPublish with window confirms
// outstanding.
func rawStreamPublishWindow(b *testing.B, amqpURL string, n, size, window int) float64 {
	b.Helper()
	_, ch := rawChannel(b, amqpURL)
	rawRuns++
	q := fmt.Sprintf("rows.raw%d", rawRuns)
	if _, err := ch.QueueDeclare(q, true, false, false, false, rows.StreamArgs(rows.DefaultMaxAge, rows.DefaultMaxBytes)); err != nil {
		b.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, window))
	body := make([]byte, size)
	start := time.Now()
	outstanding, acked := 0, 0
	for sent := 0; sent < n; sent++ {
		for outstanding >= window {
			c := <-confirms
			if !c.Ack {
				b.Fatal("raw publish nacked")
			}
			outstanding--
			acked++
		}
		if err := ch.Publish("", q, false, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: body}); err != nil {
			b.Fatal(err)
		}
		outstanding++
	}
	for acked < n {
		c := <-confirms
		if !c.Ack {
			b.Fatal("raw publish nacked")
		}
		acked++
	}
	return float64(n) / time.Since(start).Seconds()
}

// rawStreamRead reads the table's log as a node new to it does, from the
// offset the newest message names (the newest snapshot's) to that
// message, with a prefetch of 2,048: how long it took, and the messages
// and body bytes read.
func rawStreamRead(b *testing.B, amqpURL string) (took time.Duration, msgs int, bytes int64) {
	b.Helper()
	start := time.Now()
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := ch.Qos(1, 0, false); err != nil {
		b.Fatal(err)
	}
	q := rows.QueueOf(rowsTable)
	last, err := ch.Consume(q, "last", false, false, false, false, amqp.Table{"x-stream-offset": "last"})
	if err != nil {
		b.Fatal(err)
	}
	d := <-last
	from, ok := d.Headers[wire.HeaderRowsSnap].(int64)
	end, ok2 := d.Headers["x-stream-offset"].(int64)
	if !ok || !ok2 {
		b.Fatalf("the log's newest message names no snapshot: %v", d.Headers)
	}
	if err := ch.Cancel("last", false); err != nil {
		b.Fatal(err)
	}
	rd, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := rd.Qos(2048, 0, false); err != nil {
		b.Fatal(err)
	}
	ds, err := rd.Consume(q, "", false, false, false, false, amqp.Table{"x-stream-offset": from})
	if err != nil {
		b.Fatal(err)
	}
	for d := range ds {
		msgs++
		bytes += int64(len(d.Body))
		off, _ := d.Headers["x-stream-offset"].(int64)
		if msgs%512 == 0 || off >= end {
			if err := d.Ack(true); err != nil {
				b.Fatal(err)
			}
		}
		if off >= end {
			break
		}
	}
	return time.Since(start), msgs, bytes
}

// finePoll calls cond every 2 ms until it holds; the benchmark fails when
// it does not within d.
func finePoll(b *testing.B, d time.Duration, what string, cond func() bool) {
	b.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("%s: not within %v", what, d)
		}
	}
}

// joinProfile writes a CPU profile of a joiner's start and join to the
// file MESHBOX_BENCH_JOIN_PROFILE names, and an execution trace to
// MESHBOX_BENCH_JOIN_TRACE's (none when unset), the first joiner's to
// the file itself and the next ones' to the name with ".2", ".3"
// added; the function it returns ends them.
func joinProfile(b *testing.B, round int) func() {
	var stops []func()
	for _, o := range []struct {
		env   string
		start func(io.Writer) error
		stop  func()
	}{
		{"MESHBOX_BENCH_JOIN_PROFILE", pprof.StartCPUProfile, pprof.StopCPUProfile},
		{"MESHBOX_BENCH_JOIN_TRACE", trace.Start, trace.Stop},
	} {
		path := os.Getenv(o.env)
		if path == "" {
			continue
		}
		if round > 0 {
			path += fmt.Sprintf(".%d", round+1)
		}
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		if err := o.start(f); err != nil {
			b.Fatal(err)
		}
		stops = append(stops, func() {
			o.stop()
			_ = f.Close()
		})
	}
	return func() {
		for _, stop := range stops {
			stop()
		}
	}
}
