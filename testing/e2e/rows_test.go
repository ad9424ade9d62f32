package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
)

// The tables of rows end to end: nodes as processes, the API on their
// NATS servers, the tables' logs on a real RabbitMQ.

// errIndeterminate is a rows request that got no answer: the write may or
// may not have been committed.
var errIndeterminate = errors.New("no answer")

// rowsCall sends a request of the rows API (op on table) through nc and
// decodes the answer into out. code is the service error's code when the
// node refused (err then says why); an error without a code is no answer
// (errIndeterminate wraps it).
func rowsCall(nc *nats.Conn, table, op string, req rows.Request, out any, timeout time.Duration) (code int, err error) {
	body, err := json.Marshal(req)
	if err != nil {
		return 0, err
	}
	resp, err := nc.Request(rows.Subject(table, op), body, timeout)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", errIndeterminate, err)
	}
	if c, text := natstest.ServiceError(resp); c != 0 || text != "" {
		return c, fmt.Errorf("%s %s: error %d: %s", table, op, c, text)
	}
	if out != nil {
		if err := json.Unmarshal(resp.Data, out); err != nil {
			return 0, fmt.Errorf("%s %s: answer not JSON: %v: %q", table, op, err, resp.Data)
		}
	}
	return 0, nil
}

// mustRows is rowsCall that fails the test on any error.
func mustRows(t *testing.T, nc *nats.Conn, table, op string, req rows.Request, out any) {
	t.Helper()
	if _, err := rowsCall(nc, table, op, req, out, 10*time.Second); err != nil {
		t.Fatalf("rows %s %s %+v: %v", table, op, req, err)
	}
}

// parseStamp reads a stamp as the API writes it, <RFC 3339 time with
// milliseconds>+<counter>, into a number ordered as the stamps are:
// milliseconds in the high 48 bits, the counter in the low 16.
func parseStamp(s string) (uint64, error) {
	wall, counter, ok := strings.Cut(s, "+")
	if !ok {
		return 0, fmt.Errorf("stamp %q: no +counter", s)
	}
	at, err := time.Parse("2006-01-02T15:04:05.000Z", wall)
	if err != nil {
		return 0, fmt.Errorf("stamp %q: %v", s, err)
	}
	n, err := strconv.ParseUint(counter, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("stamp %q: counter: %v", s, err)
	}
	return uint64(at.UnixMilli())<<16 | n, nil
}

// rowVersion is a field's version as the test orders them: the larger
// stamp wins, and of equal stamps the larger node name (rows.Cell.Wins).
type rowVersion struct {
	stamp   uint64
	node    string
	deleted bool
	value   string
}

func (v rowVersion) wins(o rowVersion) bool {
	if v.stamp != o.stamp {
		return v.stamp > o.stamp
	}
	return v.node > o.node
}

func (v rowVersion) String() string {
	what := fmt.Sprintf("%q", v.value)
	if v.deleted {
		what = "deleted"
	}
	return fmt.Sprintf("%s at %d by %s", what, v.stamp, v.node)
}

func rowVersionOf(t *testing.T, v rows.Version) rowVersion {
	t.Helper()
	s, err := parseStamp(v.Stamp)
	if err != nil {
		t.Fatal(err)
	}
	return rowVersion{stamp: s, node: v.Node, deleted: v.Deleted, value: v.Value}
}

// replica is a node's table as its list shows it: row -> field -> the
// version it holds (tombstones of rows with a live field included).
type replica map[string]map[string]rows.Version

// listTable lists every row of table whose key starts with prefix, page
// after page.
func listTable(nc *nats.Conn, table, prefix string) (replica, error) {
	out := replica{}
	after := ""
	for pages := 0; ; pages++ {
		var doc rows.ListDoc
		if _, err := rowsCall(nc, table, rows.OpList, rows.Request{Prefix: prefix, After: after, Limit: rows.MaxListLimit}, &doc, 10*time.Second); err != nil {
			return nil, fmt.Errorf("list %s from %q, page %d: %w", table, after, pages+1, err)
		}
		for _, r := range doc.Rows {
			if _, dup := out[r.Row]; dup || r.Row <= after {
				return nil, fmt.Errorf("list %s: row %s again, or out of order, on page %d", table, r.Row, pages+1)
			}
			out[r.Row] = r.Versions
		}
		if !doc.More {
			return out, nil
		}
		if len(doc.Rows) == 0 {
			return nil, fmt.Errorf("list %s: an empty page that says more", table)
		}
		after = doc.Rows[len(doc.Rows)-1].Row
	}
}

// diffReplicas describes how b differs from a (at most a few rows), ""
// when they are the same.
func diffReplicas(a, b replica) string {
	var d []string
	for _, row := range slices.Sorted(maps.Keys(a)) {
		if !maps.Equal(a[row], b[row]) {
			d = append(d, fmt.Sprintf("row %s: %v vs %v", row, a[row], b[row]))
		}
	}
	for row := range b {
		if _, ok := a[row]; !ok {
			d = append(d, fmt.Sprintf("row %s only in the second: %v", row, b[row]))
		}
	}
	if len(d) > 3 {
		d = append(d[:3], fmt.Sprintf("(%d more)", len(d)-3))
	}
	return strings.Join(d, "; ")
}

// tableStatus is table's part of the status of the node at httpURL (ok:
// the node lists it).
func tableStatus(t *testing.T, httpURL, table string) (rows.TableStatus, bool) {
	t.Helper()
	for _, ts := range meshtest.Status(t, httpURL).Rows {
		if ts.Table == table {
			return ts, true
		}
	}
	return rows.TableStatus{}, false
}

// waitTable waits until p's status shows table in a state ok accepts,
// and returns that state.
func waitTable(t *testing.T, p *meshtest.Process, table string, d time.Duration, what string, ok func(rows.TableStatus) bool) rows.TableStatus {
	t.Helper()
	var ts rows.TableStatus
	meshtest.WaitStatus(t, p.HTTPURL(), d, p.Node()+": table "+table+" "+what, func(s appliance.Status) bool {
		for _, r := range s.Rows {
			if r.Table == table {
				ts = r
				return ok(r)
			}
		}
		return false
	})
	return ts
}

// rowsMesh makes a mesh on the broker at amqpURL (init as names[0], the
// others recorded), with the settings given (table definitions, say).
func rowsMesh(t *testing.T, amqpURL string, names []string, settings map[string]string) (db string) {
	t.Helper()
	meshtest.Binary(t) // built before cli's timeout starts
	db = meshtest.Postgres(t).Database(t)
	if code, _, errOut := cli(t, "init", "--db", db, "--node", names[0], "--broker", meshtest.NoCredential(amqpURL)); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	for _, n := range names[1:] {
		mesh(t, db, "node", "add", n, "--record-only")
	}
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		mesh(t, db, "setting", "set", k, settings[k])
	}
	return db
}

// rowWrite is one put of the converge test and what became of it.
type rowWrite struct {
	node, row, field string
	v                rowVersion // stamp and node from the answer when acknowledged
	acked            bool
	refused          bool // the node answered with an error: not written
	sent             time.Time
}

// rowWriteLog is every write the converge test made.
type rowWriteLog struct {
	mu     sync.Mutex
	writes []rowWrite
}

func (l *rowWriteLog) add(w rowWrite) {
	l.mu.Lock()
	l.writes = append(l.writes, w)
	l.mu.Unlock()
}

func (l *rowWriteLog) all() []rowWrite {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.writes)
}

// count returns how many writes of node sent after since were acknowledged.
func (l *rowWriteLog) count(node string, since time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, w := range l.writes {
		if w.node == node && w.acked && !w.sent.Before(since) {
			n++
		}
	}
	return n
}

// TestRowsConverge runs three nodes, each reaching a real RabbitMQ
// through a proxy of its own, and writers on every node putting (and now
// and then deleting) fields of 20 shared rows of table jobs, recording
// every write and its answer. Meanwhile: two nodes cut from the broker
// and restored (each side writes on), a node cut, SIGKILLed and started
// again on its data directory (its writes since the cut were on its disk
// only), and the broker stopped and started. Once healed, every replica
// must be the same, field by field (value, stamp, node), and each field
// must hold the last-writer-wins winner over the acknowledged writes:
// none lost, none changed, and a version newer than the winner only if
// it is a write that got no answer.
func TestRowsConverge(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel() // a broker of its own: it is stopped
	const (
		table   = "jobs"
		nRows   = 20
		nFields = 4
		writers = 2 // per node
	)
	rmq := meshtest.NewRabbitMQ(t)
	amqpURL := rmq.URL()
	names := []string{"alpha", "beta", "gamma"}
	db := rowsMesh(t, amqpURL, names, map[string]string{"table." + table: "{}"})
	upstream := hostOf(t, amqpURL)

	type node struct {
		name string
		args []string
		px   *meshtest.Proxy
		p    *meshtest.Process
		nc   *nats.Conn
	}
	nodes := map[string]*node{}
	for _, n := range names {
		px := meshtest.NewProxy(t, upstream)
		nd := &node{name: n, px: px, args: []string{"--node", n, "--db", db, "--broker", px.Rewrite(amqpURL, upstream),
			"--data", t.TempDir(), "--nats", fmt.Sprintf("127.0.0.1:%d", meshtest.FreePort(t))}}
		nd.p = meshtest.StartProcess(t, nd.args...)
		nodes[n] = nd
	}
	for _, n := range names {
		nd := nodes[n]
		meshtest.WaitStatus(t, nd.p.HTTPURL(), 30*time.Second, n+" connected to the broker", func(s appliance.Status) bool { return s.Broker.State == "connected" })
		waitKeysInStep(t, nd.p)
		waitTable(t, nd.p, table, 30*time.Second, "reading its log", func(ts rows.TableStatus) bool { return ts.Synced })
		// The NATS port stays across the restart: the writers' connection
		// follows the node.
		nd.nc = natsConn(t, nd.p)
	}

	// The writers: each put sets or deletes one field to a value no other
	// write has.
	record := &rowWriteLog{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, n := range names {
		for w := range writers {
			wg.Add(1)
			go func() { // writer: exits when stop is closed
				defer wg.Done()
				nc := nodes[n].nc
				rng := rand.New(rand.NewPCG(uint64(i), uint64(w)))
				for seq := 0; ; seq++ {
					select {
					case <-stop:
						return
					case <-time.After(time.Duration(10+rng.IntN(20)) * time.Millisecond):
					}
					wr := rowWrite{node: n, row: fmt.Sprintf("job-%02d", rng.IntN(nRows)), field: fmt.Sprintf("f%d", rng.IntN(nFields)), sent: time.Now()}
					req := rows.Request{Row: wr.row}
					if rng.IntN(10) == 0 {
						req.Delete = []string{wr.field}
						wr.v.deleted = true
					} else {
						wr.v.value = fmt.Sprintf("%s.%d.%d", n, w, seq)
						req.Set = map[string]string{wr.field: wr.v.value}
					}
					var ans rows.Written
					code, err := rowsCall(nc, table, rows.OpPut, req, &ans, 3*time.Second)
					switch {
					case err == nil:
						s, perr := parseStamp(ans.Stamp)
						if perr != nil || ans.Node != n || ans.Row != wr.row || ans.Table != table {
							t.Errorf("put on %s: answer %+v (%v), want a stamp, node %s, row %s", n, ans, perr, n, wr.row)
						}
						wr.acked, wr.v.stamp, wr.v.node = true, s, ans.Node
					case code != 0:
						wr.refused = true
					}
					record.add(wr)
				}
			}()
		}
	}
	stopWriters := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopWriters)
	acked := func() int {
		n := 0
		for _, w := range record.all() {
			if w.acked {
				n++
			}
		}
		return n
	}
	start := time.Now()
	meshtest.WaitFor(t, 30*time.Second, "the first 200 writes acknowledged", func() bool { return acked() >= 200 })

	// A partition: alpha and gamma cut from the broker, beta alone on it;
	// every node goes on writing.
	for _, n := range []string{"alpha", "gamma"} {
		nodes[n].px.Cut(t)
	}
	for _, n := range []string{"alpha", "gamma"} {
		waitTable(t, nodes[n].p, table, 30*time.Second, "cut off, writes pending", func(ts rows.TableStatus) bool { return !ts.Synced && ts.Pending > 0 })
	}
	time.Sleep(2 * time.Second)
	for _, n := range []string{"alpha", "gamma"} {
		nodes[n].px.Restore(t)
	}
	t.Logf("partition healed at %s: %d writes acknowledged", time.Since(start).Round(100*time.Millisecond), acked())

	// beta cut, then SIGKILLed: what it acknowledged since the cut is on
	// its disk alone. Started again on the same data directory (still cut),
	// it still holds every one of them as pending.
	beta := nodes["beta"]
	beta.px.Cut(t)
	waitTable(t, beta.p, table, 30*time.Second, "cut off", func(ts rows.TableStatus) bool { return !ts.Synced })
	cutAt := time.Now()
	meshtest.WaitFor(t, 30*time.Second, "beta acknowledging writes while cut off", func() bool { return record.count("beta", cutAt) >= 20 })
	beta.p.Kill()
	onDiskOnly := record.count("beta", cutAt)
	beta.p = meshtest.StartProcess(t, beta.args...)
	ts := waitTable(t, beta.p, table, 30*time.Second, "listed after the restart", func(rows.TableStatus) bool { return true })
	if ts.Pending < onDiskOnly {
		t.Errorf("beta after SIGKILL and restart: %d writes pending, want at least the %d it acknowledged while cut off", ts.Pending, onDiskOnly)
	}
	beta.px.Restore(t)
	t.Logf("beta killed with %d acknowledged writes on its disk only, restarted with %d pending, at %s",
		onDiskOnly, ts.Pending, time.Since(start).Round(100*time.Millisecond))

	// The broker stopped and started while every node writes.
	rmq.Stop(t)
	for _, n := range names {
		waitTable(t, nodes[n].p, table, 30*time.Second, "writing with the broker down", func(ts rows.TableStatus) bool { return !ts.Synced && ts.Pending > 0 })
	}
	rmq.Start(t)
	back := time.Now()
	var relinked []string
	for _, n := range names {
		waitTable(t, nodes[n].p, table, 90*time.Second, "reading its log again", func(ts rows.TableStatus) bool { return ts.Synced })
		relinked = append(relinked, fmt.Sprintf("%s %s", n, time.Since(back).Round(100*time.Millisecond)))
	}
	t.Logf("after the broker's restart, the tables' logs read again by: %s", strings.Join(relinked, ", "))

	// The broker closes the connections while alpha's confirms are in
	// flight: alpha's link frozen (its writes go on, their confirms wait
	// in the proxy), then every connection of the nodes' user closed on
	// the broker, then the link thawed. Every node reads its log again
	// and alpha's writes since reach the others.
	alpha := nodes["alpha"]
	waitTable(t, alpha.p, table, 30*time.Second, "writing through the broker", func(ts rows.TableStatus) bool { return ts.Synced })
	alpha.px.Stall(t)
	frozenAt := time.Now()
	meshtest.WaitFor(t, 30*time.Second, "alpha acknowledging writes on a frozen link", func() bool { return record.count("alpha", frozenAt) >= 20 })
	user := "guest"
	if u, err := url.Parse(amqpURL); err == nil && u.User != nil {
		user = u.User.Username()
	}
	rmq.CloseUserConnections(t, user, "test: connections closed while confirms are in flight")
	time.Sleep(time.Second)
	alpha.px.Restore(t)
	thawed := time.Now()
	for _, n := range names {
		waitTable(t, nodes[n].p, table, 60*time.Second, "reading its log after the broker closed its connections", func(ts rows.TableStatus) bool { return ts.Synced })
	}
	t.Logf("after the broker closed the connections of a frozen link, every node reads its log again %s after the thaw", time.Since(thawed).Round(100*time.Millisecond))
	time.Sleep(time.Second)
	stopWriters()
	t.Logf("writers stopped at %s", time.Since(start).Round(100*time.Millisecond))

	// Healed: every node's writes reach the broker, and every replica
	// becomes the same.
	healStart := time.Now()
	var lists map[string]replica
	var last string
	if !meshtest.Poll(60*time.Second, func() bool {
		for _, n := range names {
			ts, ok := tableStatus(t, nodes[n].p.HTTPURL(), table)
			if !ok || ts.Pending != 0 || !ts.Synced || ts.Behind != 0 {
				last = fmt.Sprintf("%s: %+v", n, ts)
				return false
			}
		}
		lists = map[string]replica{}
		for _, n := range names {
			l, err := listTable(nodes[n].nc, table, "")
			if err != nil {
				last = err.Error()
				return false
			}
			lists[n] = l
		}
		for _, n := range names[1:] {
			if d := diffReplicas(lists[names[0]], lists[n]); d != "" {
				last = fmt.Sprintf("%s and %s differ: %s", names[0], n, d)
				return false
			}
		}
		return true
	}) {
		t.Errorf("replicas not converged 60s after the writers stopped: %s", last)
	} else {
		t.Logf("converged %s after the writers stopped", time.Since(healStart).Round(100*time.Millisecond))
	}

	// The checker. Each field's version on every node (its history's
	// newest: a row whose fields are all deleted is not listed) against
	// the writes made.
	writes := record.all()
	byField := map[string][]rowWrite{}
	nAcked, nRefused, nUnknown := 0, 0, 0
	stamps := map[string]rowWrite{} // node/stamp -> the acknowledged write
	for _, w := range writes {
		switch {
		case w.acked:
			nAcked++
			k := fmt.Sprintf("%s/%d", w.v.node, w.v.stamp)
			if o, dup := stamps[k]; dup {
				t.Errorf("two writes acknowledged by %s with stamp %d: %s.%s and %s.%s", w.v.node, w.v.stamp, o.row, o.field, w.row, w.field)
			}
			stamps[k] = w
		case w.refused:
			nRefused++
		default:
			nUnknown++
		}
		byField[w.row+"."+w.field] = append(byField[w.row+"."+w.field], w)
	}
	lost, converged, diverged, newerUnanswered := 0, 0, 0, 0
	for r := range nRows {
		for f := range nFields {
			row, field := fmt.Sprintf("job-%02d", r), fmt.Sprintf("f%d", f)
			var held []rowVersion
			for _, n := range names {
				var h rows.HistoryDoc
				mustRows(t, nodes[n].nc, table, rows.OpHistory, rows.Request{Row: row, Field: field}, &h)
				if len(h.Versions) == 0 {
					held = append(held, rowVersion{})
					continue
				}
				held = append(held, rowVersionOf(t, h.Versions[0]))
			}
			// An acknowledged write is lost when a replica holds an older
			// version than it.
			var winner *rowWrite
			fieldLost := 0
			for i, w := range byField[row+"."+field] {
				if !w.acked {
					continue
				}
				if winner == nil || w.v.wins(winner.v) {
					winner = &byField[row+"."+field][i]
				}
				for _, v := range held {
					if w.v.wins(v) {
						fieldLost++
						break
					}
				}
			}
			lost += fieldLost
			same := true
			for _, v := range held[1:] {
				same = same && v == held[0]
			}
			if !same {
				diverged++
				t.Errorf("%s.%s differs between the nodes (%s): %v; %d acknowledged writes newer than a replica's version", row, field, strings.Join(names, ", "), held, fieldLost)
				continue
			}
			converged++
			got := held[0]
			switch {
			case winner == nil && got.node == "":
			case winner != nil && got.stamp == winner.v.stamp && got.node == winner.v.node:
				if got != winner.v {
					t.Errorf("%s.%s holds %v, but the write acknowledged with that stamp was %v", row, field, got, winner.v)
				}
			case winner != nil && fieldLost > 0:
				t.Errorf("%s.%s holds %v: %d acknowledged writes newer than it lost, the winner was %v", row, field, got, fieldLost, winner.v)
			default:
				// Newer than every acknowledged write: only a write that got
				// no answer (committed, then its answer lost) may be it.
				ok := false
				for _, w := range byField[row+"."+field] {
					if !w.acked && !w.refused && w.node == got.node && w.v.deleted == got.deleted && w.v.value == got.value {
						ok = true
					}
				}
				if !ok {
					t.Errorf("%s.%s holds %v, which no write made (winner of the acknowledged: %v)", row, field, got, winner)
				} else {
					newerUnanswered++
				}
			}
		}
	}
	t.Logf("writes: %d acknowledged, %d refused, %d unanswered; fields: %d converged, %d diverged, %d hold a write that got no answer; lost acknowledged writes: %d",
		nAcked, nRefused, nUnknown, converged, diverged, newerUnanswered, lost)
	if nAcked < 1000 {
		t.Errorf("only %d writes acknowledged: the run means little", nAcked)
	}
	if lost != 0 || diverged != 0 {
		t.Errorf("%d acknowledged writes lost, %d fields diverged; want none", lost, diverged)
	}
	// Every replica holds the same count of rows, and nothing is left.
	for _, n := range names {
		ts, _ := tableStatus(t, nodes[n].p.HTTPURL(), table)
		if len(ts.Refused) != 0 || ts.Gap {
			t.Errorf("%s: table status %+v, want no refusals and no gap", n, ts)
		}
	}
}

// TestRowsJoinWhileOthersOffline: alpha and beta write more than a
// snapshot's worth of rows (each row written once), some while a snapshot
// is being written; then both stop, and gamma, which never read the
// table, starts alone and gets every row from the broker: from the
// newest snapshot and the log after it.
func TestRowsJoinWhileOthersOffline(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	const (
		table         = "jobs"
		snapshotEvery = 500                 // rows.snapshot_every of the nodes
		minRows       = snapshotEvery + 400 // a snapshot is written past this many
		parallel      = 16                  // writes in flight per node
	)
	config := filepath.Join(t.TempDir(), "meshbox.json")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`{"rows": {"snapshot_every": %d}}`, snapshotEvery)), 0o600); err != nil {
		t.Fatal(err)
	}
	vhost := meshtest.RabbitMQ(t).Vhost(t)
	names := []string{"alpha", "beta", "gamma"}
	db := rowsMesh(t, vhost, names, nil)
	procs := map[string]*meshtest.Process{}
	gammaArgs := []string{"--node", "gamma", "--db", db, "--data", t.TempDir(), "--config", config}
	for _, n := range names {
		args := []string{"--node", n, "--db", db, "--config", config}
		if n == "gamma" {
			args = gammaArgs
		}
		procs[n] = meshtest.StartProcess(t, args...)
	}
	// gamma's first start publishes its public key, and the others seal
	// the mesh's key for it: a node gets the key from a node that holds it,
	// so it must have met one before it can read anything alone.
	for _, n := range names {
		waitKeysInStep(t, procs[n])
	}
	procs["gamma"].Signal(syscall.SIGTERM)
	procs["gamma"].Wait()
	mesh(t, db, "setting", "set", "table."+table, "{}")
	alpha, beta := procs["alpha"], procs["beta"]
	for _, p := range []*meshtest.Process{alpha, beta} {
		waitTable(t, p, table, 30*time.Second, "reading its log", func(ts rows.TableStatus) bool { return ts.Synced })
	}

	// Writers: each row once, a-NNNNN on alpha, b-NNNNN on beta, until past
	// the threshold and both nodes have seen a snapshot, and a second more.
	type acked struct{ stamp, node string }
	var mu sync.Mutex
	want := map[string]acked{} // row -> its write's answer
	var next atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var failed atomic.Int64
	for _, p := range []*meshtest.Process{alpha, beta} {
		nc := natsConn(t, p)
		prefix := p.Node()[:1]
		for range parallel {
			wg.Add(1)
			go func() { // writer: exits when stop is closed
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					row := fmt.Sprintf("%s-%05d", prefix, next.Add(1))
					var ans rows.Written
					if _, err := rowsCall(nc, table, rows.OpPut, rows.Request{Row: row, Set: map[string]string{"v": "value of " + row}}, &ans, 10*time.Second); err != nil {
						failed.Add(1)
						t.Errorf("put %s: %v", row, err)
						continue
					}
					mu.Lock()
					want[row] = acked{ans.Stamp, ans.Node}
					mu.Unlock()
				}
			}()
		}
	}
	stopWriters := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopWriters)
	start := time.Now()
	written := func() int { mu.Lock(); defer mu.Unlock(); return len(want) }
	meshtest.WaitFor(t, 90*time.Second, fmt.Sprintf("%d rows written", minRows), func() bool { return written() >= minRows })
	t.Logf("%d rows written in %s", written(), time.Since(start).Round(100*time.Millisecond))
	for _, p := range []*meshtest.Process{alpha, beta} {
		waitTable(t, p, table, 30*time.Second, "having read a whole snapshot", func(ts rows.TableStatus) bool { return ts.LastSnapshot != nil })
	}
	time.Sleep(time.Second)
	stopWriters()
	total := written()
	t.Logf("%d rows written in %s (%d failed)", total, time.Since(start).Round(100*time.Millisecond), failed.Load())
	// Both have every row, nothing pending, and read the log to the same
	// offset: its end.
	var logEnd uint64
	meshtest.Eventually(t, 30*time.Second, "alpha and beta with every write on the broker, every change read", func() error {
		a, _ := tableStatus(t, alpha.HTTPURL(), table)
		b, _ := tableStatus(t, beta.HTTPURL(), table)
		if a.Pending != 0 || b.Pending != 0 || a.Rows != total || b.Rows != total || a.Offset != b.Offset {
			return fmt.Errorf("alpha %+v, beta %+v, want %d rows each and no pending, at one offset", a, b, total)
		}
		logEnd = a.Offset
		return nil
	})
	for _, p := range []*meshtest.Process{alpha, beta} {
		p.Signal(syscall.SIGTERM)
		p.Wait()
	}

	// gamma alone, with the broker.
	gamma := meshtest.StartProcess(t, gammaArgs...)
	ts := waitTable(t, gamma, table, 60*time.Second, fmt.Sprintf("read to the log's end (offset %d)", logEnd), func(ts rows.TableStatus) bool { return ts.Offset >= logEnd })
	nc := natsConn(t, gamma)
	got, err := listTable(nc, table, "")
	if err != nil {
		t.Fatal(err)
	}
	missing, wrong := 0, 0
	for row, a := range want {
		v, ok := got[row]["v"]
		switch {
		case !ok:
			missing++
			if missing <= 5 {
				t.Errorf("gamma lacks row %s (written by %s at %s)", row, a.node, a.stamp)
			}
		case v.Value != "value of "+row || v.Stamp != a.stamp || v.Node != a.node:
			wrong++
			if wrong <= 5 {
				t.Errorf("gamma's row %s: %+v, want %q at %s by %s", row, v, "value of "+row, a.stamp, a.node)
			}
		}
	}
	fromSnapshot := strings.Contains(gamma.Output(), "joining a table from its newest snapshot")
	t.Logf("gamma: %d rows of %d written, %d missing, %d wrong, %d extra; joined from a snapshot: %v; status %+v",
		len(got), total, missing, wrong, len(got)-(total-missing), fromSnapshot, ts)
	if len(got) != total || missing != 0 || wrong != 0 {
		t.Errorf("gamma holds %d rows, %d missing, %d wrong, want the %d written", len(got), missing, wrong, total)
	}
	if !fromSnapshot {
		t.Errorf("gamma did not start from a snapshot, the path under test:\n%s", gamma.Output())
	}
	if len(ts.Refused) != 0 || ts.Gap {
		t.Errorf("gamma's table status %+v, want no refusals and no gap", ts)
	}
}

// The marker of TestRowsScopeAndOperator, in row keys and values.
const rowsMarker = "front-door-code-1234"

// TestRowsScopeAndOperator: table jobs is the mesh's, table vault is
// bound to scope vault, held by alpha and beta. gamma, outside the
// scope, cannot write vault (503), holds none of its rows and counts each
// of its log's messages as refused, with an alarm, while alpha and beta
// converge on it and every node on jobs. A broker operator with the
// admin credential reads both tables' streams from the start and finds
// no row key, value or field name in any body, header or property.
func TestRowsScopeAndOperator(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	const perNode = 20
	vhost := meshtest.RabbitMQ(t).Vhost(t)
	names := []string{"alpha", "beta", "gamma"}
	db := rowsMesh(t, vhost, names, nil)
	mesh(t, db, "scope", "add", "vault", "--nodes", "alpha,beta")
	mesh(t, db, "setting", "set", "table.jobs", "{}")
	mesh(t, db, "setting", "set", "table.vault", `{"scope":"vault"}`)
	procs := map[string]*meshtest.Process{}
	ncs := map[string]*nats.Conn{}
	for _, n := range names {
		procs[n] = meshtest.StartProcess(t, "--node", n, "--db", db)
	}
	for _, n := range names {
		waitKeysInStep(t, procs[n])
		for _, table := range []string{"jobs", "vault"} {
			waitTable(t, procs[n], table, 30*time.Second, "reading its log", func(ts rows.TableStatus) bool { return ts.Synced })
		}
		ncs[n] = natsConn(t, procs[n])
	}
	// The members seal vault with one key of the scope.
	if !meshtest.Poll(30*time.Second, func() bool {
		_, sa := nodeScopes(t, procs["alpha"])
		_, sb := nodeScopes(t, procs["beta"])
		return sa["vault"] != "" && sa["vault"] == sb["vault"]
	}) {
		t.Fatal("alpha and beta do not seal with one key of scope vault")
	}

	// Writes: jobs on every node, vault on the members; the marker in row
	// keys, field names and values.
	wantJobs, wantVault := map[string]string{}, map[string]string{}
	for _, n := range names {
		for i := range perNode {
			row := fmt.Sprintf("%s-%s-%d", rowsMarker, n, i)
			val := fmt.Sprintf("%s %s %d", rowsMarker, n, i)
			mustRows(t, ncs[n], "jobs", rows.OpPut, rows.Request{Row: row, Set: map[string]string{"code_" + strings.ReplaceAll(rowsMarker, "-", "_"): val}}, nil)
			wantJobs[row] = val
			if n == "gamma" {
				continue
			}
			mustRows(t, ncs[n], "vault", rows.OpPut, rows.Request{Row: row, Set: map[string]string{"code": val}}, nil)
			wantVault[row] = val
		}
	}
	// gamma may not write vault: it holds no key of the scope.
	code, err := rowsCall(ncs["gamma"], "vault", rows.OpPut, rows.Request{Row: rowsMarker + "-gamma", Set: map[string]string{"code": rowsMarker}}, nil, 10*time.Second)
	if code != 503 || !strings.Contains(err.Error(), "scope vault") {
		t.Errorf("gamma's put on vault: code %d, %v; want 503 naming scope vault", code, err)
	}

	// Convergence: jobs everywhere, vault on the members.
	converged := func(n, table string, want map[string]string) error {
		l, err := listTable(ncs[n], table, "")
		if err != nil {
			return err
		}
		if len(l) != len(want) {
			return fmt.Errorf("%s holds %d rows of %s, want %d", n, len(l), table, len(want))
		}
		for row, val := range want {
			var got string
			for _, v := range l[row] {
				got = v.Value
			}
			if got != val {
				return fmt.Errorf("%s: %s row %s holds %q, want %q", n, table, row, got, val)
			}
		}
		return nil
	}
	for _, n := range names {
		meshtest.Eventually(t, 30*time.Second, n+" holding every row of jobs", func() error { return converged(n, "jobs", wantJobs) })
	}
	for _, n := range []string{"alpha", "beta"} {
		meshtest.Eventually(t, 30*time.Second, n+" holding every row of vault", func() error { return converged(n, "vault", wantVault) })
		waitTable(t, procs[n], "vault", 30*time.Second, "every write on the broker", func(ts rows.TableStatus) bool { return ts.Pending == 0 && ts.Behind == 0 })
		waitTable(t, procs[n], "jobs", 30*time.Second, "every write on the broker", func(ts rows.TableStatus) bool { return ts.Pending == 0 && ts.Behind == 0 })
	}
	waitTable(t, procs["gamma"], "jobs", 30*time.Second, "every write on the broker", func(ts rows.TableStatus) bool { return ts.Pending == 0 && ts.Behind == 0 })

	// The operator: the admin credential, each table's stream from its
	// first message to its last. Each node read the others' last messages
	// (it holds their rows): the log ends before the largest next offset.
	logEnd := map[string]uint64{}
	for _, table := range []string{"jobs", "vault"} {
		for _, n := range names {
			ts, _ := tableStatus(t, procs[n].HTTPURL(), table)
			logEnd[table] = max(logEnd[table], ts.Offset)
		}
	}
	conn := meshtest.Dial(t, vhost)
	read := map[string]int{}
	for _, table := range []string{"jobs", "vault"} {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Qos(100, 0, false); err != nil {
			t.Fatal(err)
		}
		ds, err := ch.Consume(rows.QueueOf(table), "", false, false, false, false, amqp.Table{"x-stream-offset": "first"})
		if err != nil {
			t.Fatalf("operator: consume %s: %v", rows.QueueOf(table), err)
		}
		timeout := time.After(15 * time.Second)
		for done := false; !done; {
			select {
			case d := <-ds:
				read[table]++
				all := fmt.Sprintf("%v|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s", d.Headers, d.ContentType, d.ContentEncoding, d.MessageId,
					d.CorrelationId, d.ReplyTo, d.RoutingKey, d.Type, d.AppId, d.UserId, d.Exchange)
				for _, leak := range []string{rowsMarker, strings.ReplaceAll(rowsMarker, "-", "_")} {
					if strings.Contains(all, leak) || bytes.Contains(d.Body, []byte(leak)) {
						t.Errorf("the operator reads %q in a message of %s: %s", leak, rows.QueueOf(table), all)
					}
				}
				if err := d.Ack(false); err != nil {
					t.Fatal(err)
				}
				if off, _ := d.Headers["x-stream-offset"].(int64); uint64(off)+1 >= logEnd[table] {
					done = true
				}
			case <-timeout:
				t.Fatalf("operator: %d messages of %s read in 15s, want up to offset %d", read[table], rows.QueueOf(table), logEnd[table]-1)
			}
		}
		_ = ch.Close()
	}
	t.Logf("the operator read %d messages of rows.jobs and %d of rows.vault", read["jobs"], read["vault"])
	if read["jobs"] == 0 || read["vault"] == 0 {
		t.Errorf("the operator read %v: the test proves nothing", read)
	}

	// gamma: none of vault's rows, every message of its log refused.
	var l rows.ListDoc
	mustRows(t, ncs["gamma"], "vault", rows.OpList, rows.Request{}, &l)
	if len(l.Rows) != 0 {
		t.Errorf("gamma lists %d rows of vault, want none", len(l.Rows))
	}
	ts := waitTable(t, procs["gamma"], "vault", 30*time.Second, "every message of the log refused", func(ts rows.TableStatus) bool {
		return ts.Refused["unopened"] >= read["vault"]
	})
	if ts.Rows != 0 || ts.Refused["unopened"] != read["vault"] || ts.Alarm == "" {
		t.Errorf("gamma's vault status %+v: want no rows, %d refused as unopened, an alarm", ts, read["vault"])
	}
	t.Logf("gamma refused %d messages of vault: %q", ts.Refused["unopened"], ts.Alarm)
	for _, n := range []string{"alpha", "beta"} {
		for _, table := range []string{"jobs", "vault"} {
			if ts, _ := tableStatus(t, procs[n].HTTPURL(), table); len(ts.Refused) != 0 || ts.Alarm != "" {
				t.Errorf("%s refused changes of %s: %+v", n, table, ts)
			}
		}
	}
}
