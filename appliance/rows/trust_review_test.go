package rows_test

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/meshbox/meshbox/testing/meshtest"
)

func startNodeCfg(t *testing.T, name, url string, ring *seal.Keyring, dir string, edit func(*rows.Config)) *node {
	t.Helper()
	n := &node{url: url, moved: make(chan struct{})}
	cfg := rows.Config{Node: name, Path: filepath.Join(dir, "rows.db"), Keys: ring,
		Link: n, Declare: func(string) bool { return true }, SnapshotEvery: 1000}
	if edit != nil {
		edit(&cfg)
	}
	e, err := rows.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n.e = e
	e.SetTables(map[string]rows.TableSpec{"jobs": {}})
	return n
}

func allChanges(t *testing.T, e *rows.Engine) []rows.Change {
	var out []rows.Change
	if err := e.Store().Rows("jobs", "", func(row string, cells map[string]rows.Cell) bool {
		c := cells["n"]
		out = append(out, rows.Change{Table: "jobs", Row: row, Cells: rows.CellsOf(map[string]rows.WireCell{"n": {Stamp: c.Stamp, Node: c.Node, Value: c.Value, Deleted: c.Deleted}})})
		return true
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// a member (own broker user) writes a one-part snapshot whose cells
// name alpha as writer (a delete and an overwrite, stamped now). A joiner
// applies them as alpha's, its verifier finds nothing lacking: no alarm.
func TestASnapshotCannotWriteAsAnother(t *testing.T) {
	if testing.Short() {
		t.Skip("uses RabbitMQ")
	}
	rmq := meshtest.RabbitMQ(t)
	vhost := rmq.Vhost(t)
	urls := nodeUsers(t, rmq, vhost, "alpha", "mallory", "gamma")
	key := seal.NewContentKey()
	a := startNode(t, "alpha", urls["alpha"], keyring(t, key), t.TempDir(), 1000)
	defer a.e.Close()
	putRows(t, a, 0, 4)
	waitSynced(t, a, "jobs", "alpha's writes in the log")
	want := stateOf(t, a.e, "jobs")
	from := tableStatus(t, a.e, "jobs").Offset
	snap := allChanges(t, a.e)
	now := rows.StampAt(time.Now())
	snap[0].Cells = snap[0].Cells.With("n", rows.WireCell{Stamp: now, Node: "alpha", Deleted: true})
	snap[1].Cells = snap[1].Cells.With("n", rows.WireCell{Stamp: now, Node: "alpha", Value: []byte("forged")})
	s, _ := keyring(t, key).Sealer()
	publishLog(t, urls["mallory"], "jobs", s.ID(), wire.BrokerUser("mallory", 1),
		rows.SealedBatch(s, "jobs", "mallory", "forged-1", from, from, snap))
	meshtest.WaitFor(t, 30*time.Second, "alpha reading the snapshot", func() bool { return tableStatus(t, a.e, "jobs").Offset > from })
	if !same(stateOf(t, a.e, "jobs"), want) {
		t.Fatal("alpha changed")
	}
	g := startNode(t, "gamma", urls["gamma"], keyring(t, key), t.TempDir(), 1000)
	defer g.e.Close()
	meshtest.WaitFor(t, 30*time.Second, "gamma joined and verified", func() bool {
		s := tableStatus(t, g.e, "jobs")
		return s.Synced && !s.Verifying && len(stateOf(t, g.e, "jobs")) == len(want)
	})
	st := tableStatus(t, g.e, "jobs")
	c0, c1 := cellOf(t, g.e, "jobs", "r0000"), cellOf(t, g.e, "jobs", "r0001")
	t.Logf("gamma r0000=%+v r0001=%q by %s; alarm=%q refused=%v", c0, c1.Value, c1.Node, st.Alarm, st.Refused)
	t.Logf("alpha r0000=%q by %s", cellOf(t, a.e, "jobs", "r0000").Value, cellOf(t, a.e, "jobs", "r0000").Node)
	if !same(stateOf(t, g.e, "jobs"), want) {
		t.Errorf("gamma holds %v, want alpha's rows %v: mallory's snapshot's delete and overwrite in alpha's name undone", stateOf(t, g.e, "jobs"), want)
	}
	if st.Refused["snapshot_disagrees"] != 2 || !strings.Contains(st.Alarm, "mallory") {
		t.Errorf("gamma's status %+v, want the 2 forged versions counted as snapshot_disagrees naming mallory", st)
	}
}

// a member's snapshot part 1 of 2 that never completes: a joiner
// starting at it applies part 1, waits for part 2 forever, and its
// verifier never starts: it holds 2 rows of 9 with no alarm.
func TestAnUnfinishedSnapshotDoesNotStallAJoiner(t *testing.T) {
	if testing.Short() {
		t.Skip("uses RabbitMQ")
	}
	undo := rows.SetSnapshotWait(time.Second)
	defer undo()
	amqpURL := meshtest.RabbitMQ(t).Vhost(t)
	key := seal.NewContentKey()
	a := startNode(t, "alpha", amqpURL, keyring(t, key), t.TempDir(), 1000)
	defer a.e.Close()
	putRows(t, a, 0, 9)
	waitSynced(t, a, "jobs", "alpha's writes in the log")
	from := tableStatus(t, a.e, "jobs").Offset
	two := allChanges(t, a.e)[:2]
	s, _ := keyring(t, key).Sealer()
	publishLog(t, amqpURL, "jobs", s.ID(), "", rows.SnapshotPart(s, "jobs", "mallory", "never-done", 1, 2, from, from, two))
	g := startNode(t, "gamma", amqpURL, keyring(t, key), t.TempDir(), 1000)
	defer g.e.Close()
	meshtest.WaitFor(t, 30*time.Second, "gamma synced", func() bool { return tableStatus(t, g.e, "jobs").Synced })
	// Later writes still flow to gamma, and the log before the
	// unfinished snapshot gives it every row.
	putRows(t, a, 9, 10)
	meshtest.Poll(30*time.Second, func() bool {
		return len(stateOf(t, g.e, "jobs")) == 10 && !tableStatus(t, g.e, "jobs").Verifying
	})
	st := tableStatus(t, g.e, "jobs")
	n := len(stateOf(t, g.e, "jobs"))
	t.Logf("gamma after 22 s: %d rows of 10; status %+v", n, st)
	if n < 10 || st.Verifying {
		t.Errorf("gamma holds %d rows of 10, verifying=%v, 30 s after joining", n, st.Verifying)
	}
}

// the broker operator deletes a table's log; the nodes make it again.
// A node that was offline resumes at its saved offset in the new log,
// skipping the changes at lower offsets, and shows no gap.
func TestADeletedLogIsSeen(t *testing.T) {
	if testing.Short() {
		t.Skip("uses RabbitMQ")
	}
	t.Parallel()
	amqpURL := meshtest.RabbitMQ(t).Vhost(t)
	key := seal.NewContentKey()
	a := startNode(t, "alpha", amqpURL, keyring(t, key), t.TempDir(), 1000)
	defer a.e.Close()
	bdir := t.TempDir()
	b := startNode(t, "beta", amqpURL, keyring(t, key), bdir, 1000)
	for i := range 8 {
		putRows(t, a, i, i+1) // one message each
		time.Sleep(50 * time.Millisecond)
	}
	meshtest.WaitFor(t, 30*time.Second, "beta holding alpha's rows", func() bool {
		return same(stateOf(t, b.e, "jobs"), stateOf(t, a.e, "jobs"))
	})
	t.Logf("beta's offset before: %d", tableStatus(t, b.e, "jobs").Offset)
	if err := b.e.Close(); err != nil {
		t.Fatal(err)
	}
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	ch, _ := conn.Channel()
	if _, err := ch.QueueDelete(rows.QueueOf("jobs"), false, false, false); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	meshtest.WaitFor(t, 60*time.Second, "alpha reconnected", func() bool {
		s := tableStatus(t, a.e, "jobs")
		return s.Synced
	})
	time.Sleep(2 * time.Second)
	for i := 100; i < 103; i++ {
		putRows(t, a, i, i+1)
		time.Sleep(50 * time.Millisecond)
	}
	meshtest.WaitFor(t, 30*time.Second, "alpha's writes in the new log", func() bool {
		s := tableStatus(t, a.e, "jobs")
		return s.Pending == 0
	})
	b = startNode(t, "beta", amqpURL, keyring(t, key), bdir, 1000)
	defer b.e.Close()
	putRows(t, a, 103, 104)
	meshtest.Poll(30*time.Second, func() bool {
		cells, _ := b.e.Store().Row("jobs", "r0103")
		first, _ := b.e.Store().Row("jobs", "r0100")
		return cells != nil && first != nil && tableStatus(t, b.e, "jobs").Synced
	})
	st := tableStatus(t, b.e, "jobs")
	var missing []string
	for i := 100; i < 104; i++ {
		if cells, _ := b.e.Store().Row("jobs", fmt.Sprintf("r%04d", i)); cells == nil {
			missing = append(missing, fmt.Sprintf("r%04d", i))
		}
	}
	t.Logf("beta: missing %v; status %+v", missing, st)
	if len(missing) > 0 || st.Refused["log_replaced"] == 0 || !st.Gap {
		t.Errorf("beta lacks %v after the log was deleted and made again (status %+v); want every row, log_replaced counted and the gap shown", missing, st)
	}
}

// a member fills the table's held bucket (10,000 tiny changes 23 h
// ahead); an honest node's change a few seconds past the drift is then
// dropped for good (over_bound) on every node.
func TestOneWriterCannotFillTheHeldBound(t *testing.T) {
	if testing.Short() {
		t.Skip("uses RabbitMQ")
	}
	t.Parallel()
	amqpURL := meshtest.RabbitMQ(t).Vhost(t)
	key := seal.NewContentKey()
	a := startNodeCfg(t, "alpha", amqpURL, keyring(t, key), t.TempDir(), func(c *rows.Config) { c.MaxDrift = 2 * time.Second })
	defer a.e.Close()
	putRows(t, a, 0, 1)
	waitSynced(t, a, "jobs", "alpha synced")
	s, _ := keyring(t, key).Sealer()
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	ch, _ := conn.Channel()
	_ = ch.Confirm(false)
	for i := range 20 {
		var cs []rows.Change
		for j := range 500 {
			cs = append(cs, change("jobs", fmt.Sprintf("m%d-%d", i, j), "mallory", "x", 23*time.Hour))
		}
		dc, err := ch.PublishWithDeferredConfirm("mesh", rows.QueueOf("jobs"), false, false, amqp.Publishing{
			Headers: amqp.Table{wire.HeaderKey: s.ID()}, Body: rows.SealedBatch(s, "jobs", "mallory", "", 0, 0, cs), DeliveryMode: amqp.Persistent})
		if err != nil || !dc.Wait() {
			t.Fatal("publish", err)
		}
	}
	conn.Close()
	meshtest.WaitFor(t, 60*time.Second, "mallory's share of the held changes full", func() bool {
		s := tableStatus(t, a.e, "jobs")
		return s.Held == rows.MaxHeldChanges/4 && s.Refused["over_bound"] == 20*500-rows.MaxHeldChanges/4
	})
	// beta, honest, its clock 5 s ahead (past alpha's 2 s drift)
	publishLog(t, amqpURL, "jobs", s.ID(), "", rows.SealedBatch(s, "jobs", "beta", "", 0, 0, []rows.Change{change("jobs", "honest", "beta", "hello", 5*time.Second)}))
	meshtest.Poll(20*time.Second, func() bool {
		cells, _ := a.e.Store().Row("jobs", "honest")
		return cells != nil
	})
	st := tableStatus(t, a.e, "jobs")
	cells, _ := a.e.Store().Row("jobs", "honest")
	t.Logf("alpha: honest row %v; held %d refused %v", cells, st.Held, st.Refused)
	if cells == nil {
		t.Errorf("beta's change 5 s ahead not applied (status %+v): mallory's flood of held changes crowded it out", st)
	}
}

// the sender named by a refused batch (b.Node, unbounded) is kept in
// the once-per-sender map: 64 batches naming 1 MiB senders keep 64 MiB.
func TestSenderNamesAreBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("uses RabbitMQ")
	}
	amqpURL := meshtest.RabbitMQ(t).Vhost(t)
	key := seal.NewContentKey()
	a := startNode(t, "alpha", amqpURL, keyring(t, key), t.TempDir(), 1000)
	defer a.e.Close()
	putRows(t, a, 0, 1)
	waitSynced(t, a, "jobs", "alpha synced")
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	s, _ := keyring(t, key).Sealer()
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	ch, _ := conn.Channel()
	_ = ch.Confirm(false)
	const n = 64
	for i := range n {
		name := fmt.Sprintf("%d", i) + strings.Repeat("m", 1<<20)
		body := rows.SealedBatch(s, "jobs", name, "", 0, 0, []rows.Change{change("jobs", "r0000", "x", "v", 0)})
		dc, err := ch.PublishWithDeferredConfirm("mesh", rows.QueueOf("jobs"), false, false, amqp.Publishing{
			Headers: amqp.Table{wire.HeaderKey: s.ID()}, Body: body, DeliveryMode: amqp.Persistent})
		if err != nil || !dc.Wait() {
			t.Fatal("publish", err)
		}
	}
	conn.Close()
	meshtest.WaitFor(t, 60*time.Second, "alpha refusing them", func() bool { return tableStatus(t, a.e, "jobs").Refused["unopened"] == n })
	grew := int64(heap()) - int64(before)
	t.Logf("heap grew %.1f MiB after %d refused batches naming 1 MiB senders", float64(grew)/(1<<20), n)
	if grew > 32<<20 {
		t.Errorf("heap grew %.1f MiB and stays (once-per-sender map keyed by the batch's unbounded node name)", float64(grew)/(1<<20))
	}
}

// a node away past the log's retention (gap) never applies a
// snapshot: rows only in the snapshots are missing for good.
func TestANodeBackAfterAGapTakesASnapshot(t *testing.T) {
	if testing.Short() {
		t.Skip("uses RabbitMQ")
	}
	undo := rows.SetSnapshotGap(0)
	defer undo()
	amqpURL := meshtest.RabbitMQ(t).Vhost(t)
	key := seal.NewContentKey()
	// A small log (8 MiB, a minute): a snapshot is due a quarter of the
	// age after the last one, the writes or not.
	small := func(c *rows.Config) { c.MaxBytes = 8 << 20; c.MaxAge = time.Minute; c.SnapshotEvery = 2000 }
	a := startNodeCfg(t, "alpha", amqpURL, keyring(t, key), t.TempDir(), small)
	defer a.e.Close()
	bdir := t.TempDir()
	b := startNodeCfg(t, "beta", amqpURL, keyring(t, key), bdir, small)
	putRows(t, a, 0, 3)
	meshtest.WaitFor(t, 30*time.Second, "beta in step", func() bool {
		return same(stateOf(t, b.e, "jobs"), stateOf(t, a.e, "jobs"))
	})
	boff := tableStatus(t, b.e, "jobs").Offset
	if err := b.e.Close(); err != nil {
		t.Fatal(err)
	}
	// Enough bytes for the log to drop its first segments (8 MiB kept in
	// segments of 2 MiB), written in batches.
	v := strings.Repeat("x", 1024)
	var batch []rows.RowWrite
	flush := func() {
		if _, err := a.e.PutMany("jobs", batch); err != nil {
			t.Fatal(err)
		}
		batch = batch[:0]
	}
	for i := 10; i < 3010; i++ {
		batch = append(batch, rows.RowWrite{Row: fmt.Sprintf("r%04d", i), Set: map[string][]byte{"n": []byte(v)}})
		if len(batch) == 100 {
			flush()
		}
	}
	for i := range 8000 {
		batch = append(batch, rows.RowWrite{Row: fmt.Sprintf("hot%d", i%50), Set: map[string][]byte{"n": []byte(fmt.Sprint(i) + v)}})
		if len(batch) == 100 {
			flush()
		}
	}
	// A snapshot's time is its message's timestamp, in whole seconds: one
	// written in the second the writes ended reads as before them, and
	// with no change after it none follows.
	written := time.Now().Truncate(time.Second)
	meshtest.WaitFor(t, 120*time.Second, "alpha published, a snapshot after", func() bool {
		s := tableStatus(t, a.e, "jobs")
		return s.Pending == 0 && s.Behind == 0 && s.LastSnapshot != nil && !s.LastSnapshot.Before(written)
	})
	time.Sleep(8 * time.Second)
	// The log's first offset now.
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	ch, _ := conn.Channel()
	_ = ch.Qos(1, 0, false)
	ds, err := ch.Consume(rows.QueueOf("jobs"), "", false, false, false, false, amqp.Table{"x-stream-offset": "first"})
	if err != nil {
		t.Fatal(err)
	}
	d := <-ds
	first := d.Headers["x-stream-offset"]
	conn.Close()
	t.Logf("beta saved offset %d; the log now starts at %v", boff, first)

	b = startNodeCfg(t, "beta", amqpURL, keyring(t, key), bdir, small)
	defer b.e.Close()
	meshtest.WaitFor(t, 60*time.Second, "beta read the log", func() bool {
		s := tableStatus(t, b.e, "jobs")
		return s.Synced && s.Behind == 0 && s.Offset >= tableStatus(t, a.e, "jobs").Offset
	})
	time.Sleep(3 * time.Second)
	ra, rb := len(stateOf(t, a.e, "jobs")), len(stateOf(t, b.e, "jobs"))
	st := tableStatus(t, b.e, "jobs")
	hot, _ := b.e.Store().Row("jobs", "hot0")
	t.Logf("beta's hot row: %.8q", hot["n"].Value)
	t.Logf("alpha %d rows, beta %d; beta status gap=%v alarm=%q last snapshot read %v", ra, rb, st.Gap, st.Alarm, st.LastSnapshot)
	if rb < ra {
		t.Errorf("beta, back after a gap, holds %d of %d rows although the log's snapshots hold them all", rb, ra)
	}
}

// an honest two-part snapshot H with a foreign part 1 (F) between its
// parts: no node records H as whole, and a joiner that took H waits
// forever (verifier never runs, the node never writes a snapshot).
func TestAnInterleavedPartDoesNotStallAJoiner(t *testing.T) {
	if testing.Short() {
		t.Skip("uses RabbitMQ")
	}
	undo := rows.SetSnapshotWait(time.Second)
	defer undo()
	amqpURL := meshtest.RabbitMQ(t).Vhost(t)
	key := seal.NewContentKey()
	a := startNode(t, "alpha", amqpURL, keyring(t, key), t.TempDir(), 1000)
	defer a.e.Close()
	putRows(t, a, 0, 6)
	waitSynced(t, a, "jobs", "alpha's writes in the log")
	from := tableStatus(t, a.e, "jobs").Offset
	all := allChanges(t, a.e)
	s, _ := keyring(t, key).Sealer()
	// "honest" H written as node beta (shared credential), all rows.
	publishLog(t, amqpURL, "jobs", s.ID(), "", rows.SnapshotPart(s, "jobs", "beta", "H", 1, 2, 0, from, all[:3]))
	publishLog(t, amqpURL, "jobs", s.ID(), "", rows.SnapshotPart(s, "jobs", "mallory", "F", 1, 1, 0, from, nil))
	publishLog(t, amqpURL, "jobs", s.ID(), "", rows.SnapshotPart(s, "jobs", "beta", "H", 2, 2, from, from, all[3:]))
	meshtest.WaitFor(t, 30*time.Second, "alpha read them", func() bool { return tableStatus(t, a.e, "jobs").Offset >= from+3 })
	g := startNode(t, "gamma", amqpURL, keyring(t, key), t.TempDir(), 1000)
	defer g.e.Close()
	meshtest.Poll(20*time.Second, func() bool {
		s := tableStatus(t, g.e, "jobs")
		return s.Synced && !s.Verifying && len(stateOf(t, g.e, "jobs")) == 6
	})
	st := tableStatus(t, g.e, "jobs")
	t.Logf("gamma: rows %d of 6, verifying=%v, alarm=%q; alpha last snapshot %v (F was one empty part from mallory)", len(stateOf(t, g.e, "jobs")), st.Verifying, st.Alarm, tableStatus(t, a.e, "jobs").LastSnapshot)
	if st.Verifying || len(stateOf(t, g.e, "jobs")) != 6 {
		t.Errorf("gamma still verifying, or lacking rows, 20 s after joining (status %+v): it never sees H whole", st)
	}
}

// mallory was removed from scope vault (members alpha, beta; key
// rotated from k1 to k2). It still holds k1: its change sealed with k1,
// naming itself, is applied by alpha: no check that the writer is in the
// table's scope, nor that k1 is retired.
func TestAnExMemberCannotWriteWithAnOldKey(t *testing.T) {
	if testing.Short() {
		t.Skip("uses RabbitMQ")
	}
	amqpURL := meshtest.RabbitMQ(t).Vhost(t)
	mesh, k1, k2 := seal.NewContentKey(), seal.NewContentKey(), seal.NewContentKey()
	k1.Scope, k2.Scope = "vault", "vault"
	r, err := seal.NewKeyring(nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetScoped([]seal.ContentKey{mesh, k1, k2}, mesh.ID, seal.Scopes{Current: map[string]string{"vault": k2.ID},
		Member: map[string]bool{"vault": true}, Members: map[string][]string{"vault": {"alpha", "beta"}}}); err != nil {
		t.Fatal(err)
	}
	a := startNode(t, "alpha", amqpURL, r, t.TempDir(), 1000)
	defer a.e.Close()
	a.e.SetTables(map[string]rows.TableSpec{"vault": {Scope: "vault"}})
	meshtest.WaitFor(t, 30*time.Second, "alpha synced", func() bool { return tableStatus(t, a.e, "vault").Synced })
	or, err := seal.NewKeyring(nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := or.SetScoped([]seal.ContentKey{mesh, k1}, mesh.ID, seal.Scopes{Current: map[string]string{"vault": k1.ID},
		Member: map[string]bool{"vault": true}, Members: map[string][]string{"vault": {"alpha", "beta", "mallory"}}}); err != nil {
		t.Fatal(err)
	}
	old, err := or.SealerFor("vault")
	if err != nil {
		t.Fatal(err)
	}
	publishLog(t, amqpURL, "vault", k1.ID, "", rows.SealedBatch(old, "vault", "mallory", "", 0, 0, []rows.Change{change("vault", "r0", "mallory", "by ex-member", 0)}))
	meshtest.WaitFor(t, 30*time.Second, "alpha refusing mallory's change", func() bool { return tableStatus(t, a.e, "vault").Refused["wrong_scope"] == 1 })
	c := cellOf(t, a.e, "vault", "r0")
	t.Logf("alpha r0 = %q by %s; refused %v", c.Value, c.Node, tableStatus(t, a.e, "vault").Refused)
	if c.Node == "mallory" {
		t.Errorf("a change by mallory, not a member of vault, sealed with vault's retired key, applied")
	}
	// Control: beta, a member, with the current key.
	cur, err := r.SealerFor("vault")
	if err != nil {
		t.Fatal(err)
	}
	publishLog(t, amqpURL, "vault", k2.ID, "", rows.SealedBatch(cur, "vault", "beta", "", 0, 0, []rows.Change{change("vault", "r1", "beta", "by a member", 0)}))
	meshtest.WaitFor(t, 30*time.Second, "alpha applying beta's change", func() bool { return cellOf(t, a.e, "vault", "r1").Node == "beta" })
}
