package rows_test

import (
	"fmt"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// The trust rules of a table's log (trust.go, verify.go, held.go), each
// attack beside its control: the legitimate party doing the same thing
// succeeds.

// scopedRing is a keyring holding the mesh's key and, for a member, the
// key of scope vault (alpha and beta are its members).
func scopedRing(t *testing.T, mesh, vault seal.ContentKey, member bool) *seal.Keyring {
	t.Helper()
	keys := []seal.ContentKey{mesh}
	sc := seal.Scopes{Current: map[string]string{}, Member: map[string]bool{}, Members: map[string][]string{"vault": {"alpha", "beta"}}}
	if member {
		keys = append(keys, vault)
		sc.Current["vault"], sc.Member["vault"] = vault.ID, true
	}
	r, err := seal.NewKeyring(nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetScoped(keys, mesh.ID, sc); err != nil {
		t.Fatal(err)
	}
	return r
}

// publishLog publishes body into table's log as the broker user of
// amqpURL, with user_id userID ("" none), sealed with keyID.
func publishLog(t *testing.T, amqpURL, table, keyID, userID string, body []byte) {
	t.Helper()
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirm("mesh", rows.QueueOf(table), false, false, amqp.Publishing{
		Headers: amqp.Table{wire.HeaderKey: keyID}, Body: body, UserId: userID, DeliveryMode: amqp.Persistent, Type: "rows"})
	if err != nil {
		t.Fatal(err)
	}
	if !dc.Wait() {
		t.Fatal("a forged log message not confirmed")
	}
}

// change is a change of row's field n to value by node, stamped now (plus ahead).
func change(table, row, node, value string, ahead time.Duration) rows.Change {
	return rows.Change{Table: table, Row: row, Cells: rows.CellsOf(map[string]rows.WireCell{
		"n": {Stamp: rows.StampAt(time.Now().Add(ahead)), Node: node, Value: []byte(value)}})}
}

func tableStatus(t *testing.T, e *rows.Engine, table string) rows.TableStatus {
	t.Helper()
	for _, s := range e.Status() {
		if s.Table == table {
			return s
		}
	}
	return rows.TableStatus{}
}

// waitSynced waits until n reads table's log, has read some of it, and
// has nothing pending or left to read (what: the wait's name).
func waitSynced(t *testing.T, n *node, table, what string) {
	t.Helper()
	meshtest.WaitFor(t, 30*time.Second, what, func() bool {
		s := tableStatus(t, n.e, table)
		return s.Synced && s.Pending == 0 && s.Behind == 0 && s.Offset >= 1
	})
}

func cellOf(t *testing.T, e *rows.Engine, table, row string) rows.Cell {
	t.Helper()
	cells, err := e.Store().Row(table, row)
	if err != nil {
		t.Fatal(err)
	}
	return cells["n"]
}

// A node outside a table's scope holds the mesh's key: a change it seals
// with it into the scoped table's log (an overwrite, a delete, a new row)
// and an empty batch naming a join offset past the rows are refused as
// wrong_scope, and a member joining after them holds every row. The
// control: a member's change, sealed with the scope's key, is applied.
func TestAnOutsiderCannotWriteAScopedTable(t *testing.T) {
	if testing.Short() {
		t.Skip("uses RabbitMQ")
	}
	amqpURL := meshtest.RabbitMQ(t).Vhost(t)
	meshKey, vault := seal.NewContentKey(), seal.NewContentKey()
	vault.Scope = "vault"
	a := startNode(t, "alpha", amqpURL, scopedRing(t, meshKey, vault, true), t.TempDir(), 1000)
	defer a.e.Close()
	vaultOnly := map[string]rows.TableSpec{"vault": {Scope: "vault"}}
	a.e.SetTables(vaultOnly)
	for i := range 3 {
		if _, err := a.e.Put("vault", fmt.Sprintf("r%d", i), map[string][]byte{"n": []byte("alpha")}, nil); err != nil {
			t.Fatal(err)
		}
	}
	waitSynced(t, a, "vault", "alpha's writes in the log")

	// The outsider: the mesh's key, its own name as writer.
	outsider := scopedRing(t, meshKey, vault, false)
	ms, err := outsider.SealerFor("")
	if err != nil {
		t.Fatal(err)
	}
	del := change("vault", "r1", "mallory", "", time.Second)
	was, _ := del.Cells.Get("n")
	del.Cells = del.Cells.With("n", rows.WireCell{Stamp: was.Stamp, Node: "mallory", Deleted: true})
	forged := []rows.Change{change("vault", "r0", "mallory", "forged", time.Second), del, change("vault", "new", "mallory", "forged", time.Second)}
	publishLog(t, amqpURL, "vault", ms.ID(), "", rows.SealedBatch(ms, "vault", "mallory", "", 0, 0, forged))
	publishLog(t, amqpURL, "vault", ms.ID(), "", rows.SealedBatch(ms, "vault", "mallory", "", 1<<20, 0, nil))
	meshtest.WaitFor(t, 30*time.Second, "alpha refusing the outsider's two batches", func() bool {
		return tableStatus(t, a.e, "vault").Refused["wrong_scope"] == 2
	})
	if c := cellOf(t, a.e, "vault", "r0"); string(c.Value) != "alpha" || c.Node != "alpha" {
		t.Errorf("r0 after the outsider's overwrite: %q by %s, want alpha's", c.Value, c.Node)
	}
	if c := cellOf(t, a.e, "vault", "r1"); c.Deleted || c.Node != "alpha" {
		t.Errorf("r1 after the outsider's delete: %+v, want alpha's value", c)
	}
	if cells, _ := a.e.Store().Row("vault", "new"); cells != nil {
		t.Errorf("the outsider's new row is on alpha: %v", cells)
	}
	if st := tableStatus(t, a.e, "vault"); !strings.Contains(st.Alarm, "wrong_scope") {
		t.Errorf("alpha's alarm %q, want it to name wrong_scope", st.Alarm)
	}

	// Control: a member's change, sealed with the scope's key.
	vs, err := scopedRing(t, meshKey, vault, true).SealerFor("vault")
	if err != nil {
		t.Fatal(err)
	}
	publishLog(t, amqpURL, "vault", vs.ID(), "", rows.SealedBatch(vs, "vault", "beta", "", 0, 0, []rows.Change{change("vault", "r2", "beta", "beta", time.Second)}))
	meshtest.WaitFor(t, 30*time.Second, "alpha applying beta's change", func() bool {
		c := cellOf(t, a.e, "vault", "r2")
		return string(c.Value) == "beta" && c.Node == "beta"
	})

	// A member joining after the outsider's offset holds every row.
	b := startNode(t, "beta", amqpURL, scopedRing(t, meshKey, vault, true), t.TempDir(), 1000)
	defer b.e.Close()
	b.e.SetTables(vaultOnly)
	meshtest.WaitFor(t, 30*time.Second, "beta, joining, holds alpha's rows", func() bool {
		return same(stateOf(t, b.e, "vault"), stateOf(t, a.e, "vault"))
	})
}

func stateOf(t *testing.T, e *rows.Engine, table string) map[string]string {
	t.Helper()
	out := map[string]string{}
	if err := e.Store().Rows(table, "", func(row string, cells map[string]rows.Cell) bool {
		for f, c := range cells {
			out[row+"."+f] = fmt.Sprintf("%q@%d/%s/%v", c.Value, c.Stamp, c.Node, c.Deleted)
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// nodeUsers makes broker users node.<n>.g1 for names, each allowed
// everything on amqpURL's vhost, and returns each one's URL.
func nodeUsers(t *testing.T, rmq *meshtest.Rabbit, amqpURL string, names ...string) map[string]string {
	t.Helper()
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	vhost, _ := url.PathUnescape(strings.TrimPrefix(u.Path, "/"))
	rh, err := rabbithole.NewClient(rmq.ManagementURL(), "guest", "guest")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, n := range names {
		user := wire.BrokerUser(n, 1)
		if _, err := rh.PutUser(user, rabbithole.UserSettings{Password: "pw-" + n, Tags: rabbithole.UserTags{}}); err != nil {
			t.Fatal(err)
		}
		if _, err := rh.UpdatePermissionsIn(vhost, user, rabbithole.Permissions{Configure: ".*", Write: ".*", Read: ".*"}); err != nil {
			t.Fatal(err)
		}
		nu := *u
		nu.User = url.UserPassword(user, "pw-"+n)
		out[n] = nu.String()
	}
	return out
}

// In a mesh of per-node broker users, a change's writer is the node whose
// validated user_id published it: beta, with its own valid credential,
// cannot publish cells that name gamma, nor a batch that says it is
// gamma's, nor a batch without its user_id; the control is beta's own
// change, applied and attributed to beta.
func TestAPeerCannotWriteAsAnother(t *testing.T) {
	if testing.Short() {
		t.Skip("uses RabbitMQ")
	}
	rmq := meshtest.LeaseRabbitMQ(t)
	vhost := rmq.Vhost(t)
	urls := nodeUsers(t, rmq, vhost, "alpha", "beta")
	key := seal.NewContentKey()
	a := startNode(t, "alpha", urls["alpha"], keyring(t, key), t.TempDir(), 1000)
	defer a.e.Close()
	putRows(t, a, 0, 2)
	waitSynced(t, a, "jobs", "alpha's writes in the log")
	s, err := keyring(t, key).Sealer()
	if err != nil {
		t.Fatal(err)
	}
	beta := wire.BrokerUser("beta", 1)
	for _, f := range []struct {
		batchNode, cellNode, userID string
	}{
		{"beta", "gamma", beta},  // a cell naming another writer
		{"gamma", "gamma", beta}, // a batch claiming another sender
		{"gamma", "gamma", ""},   // no validated user at all
	} {
		body := rows.SealedBatch(s, "jobs", f.batchNode, "", 0, 0, []rows.Change{change("jobs", "r0000", f.cellNode, "forged", time.Second)})
		publishLog(t, urls["beta"], "jobs", s.ID(), f.userID, body)
	}
	meshtest.WaitFor(t, 30*time.Second, "alpha refusing beta's three forgeries", func() bool {
		return tableStatus(t, a.e, "jobs").Refused["forged_writer"] == 3
	})
	if c := cellOf(t, a.e, "jobs", "r0000"); string(c.Value) != "0" || c.Node != "alpha" {
		t.Errorf("r0000 after the forgeries: %q by %s, want alpha's", c.Value, c.Node)
	}
	// Control: beta's own change.
	publishLog(t, urls["beta"], "jobs", s.ID(), beta, rows.SealedBatch(s, "jobs", "beta", "", 0, 0, []rows.Change{change("jobs", "r0001", "beta", "by beta", time.Second)}))
	meshtest.WaitFor(t, 30*time.Second, "alpha applying beta's own change", func() bool {
		c := cellOf(t, a.e, "jobs", "r0001")
		return string(c.Value) == "by beta" && c.Node == "beta"
	})
	if n := tableStatus(t, a.e, "jobs").Refused["forged_writer"]; n != 3 {
		t.Errorf("forged_writer refusals %d after the control, want 3", n)
	}
}

// A member's forged snapshot, the newest message of the log, claims the
// table holds 2 rows from where it starts: a node joining from it ends
// with all 9 rows, and its status shows snapshot_disagrees naming the
// writer. The control: a node joining from an honest snapshot holds every
// row and raises nothing.
func TestAJoinerChecksTheSnapshot(t *testing.T) {
	if testing.Short() {
		t.Skip("uses RabbitMQ")
	}
	undo := rows.SetSnapshotGap(0)
	defer undo()
	amqpURL := meshtest.RabbitMQ(t).Vhost(t)
	key := seal.NewContentKey()
	a := startNode(t, "alpha", amqpURL, keyring(t, key), t.TempDir(), 5)
	defer a.e.Close()
	putRows(t, a, 0, 9) // past 5 changes: a snapshot
	meshtest.WaitFor(t, 30*time.Second, "alpha's writes and a snapshot in the log", func() bool {
		s := tableStatus(t, a.e, "jobs")
		return s.Pending == 0 && s.Behind == 0 && s.LastSnapshot != nil
	})
	want := stateOf(t, a.e, "jobs")

	// Control: beta joins from alpha's snapshot.
	b := startNode(t, "beta", amqpURL, keyring(t, key), t.TempDir(), 1000)
	defer b.e.Close()
	meshtest.WaitFor(t, 30*time.Second, "beta holding every row, its snapshot checked", func() bool {
		s := tableStatus(t, b.e, "jobs")
		return same(stateOf(t, b.e, "jobs"), want) && !s.Verifying && s.Synced
	})
	if s := tableStatus(t, b.e, "jobs"); s.Alarm != "" || len(s.Refused) != 0 {
		t.Errorf("beta, joined from an honest snapshot: %+v, want no alarm", s)
	}

	// The forgery: mallory, a member, writes a one-part snapshot of two
	// of the rows, starting at its own offset.
	from := tableStatus(t, a.e, "jobs").Offset
	s, err := keyring(t, key).Sealer()
	if err != nil {
		t.Fatal(err)
	}
	var two []rows.Change
	err = a.e.Store().Rows("jobs", "", func(row string, cells map[string]rows.Cell) bool {
		if len(two) < 2 {
			c := cells["n"]
			two = append(two, rows.Change{Table: "jobs", Row: row, Cells: rows.CellsOf(map[string]rows.WireCell{"n": {Stamp: c.Stamp, Node: c.Node, Value: c.Value}})})
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	publishLog(t, amqpURL, "jobs", s.ID(), "", rows.SealedBatch(s, "jobs", "mallory", "forged-1", from, from, two))
	meshtest.WaitFor(t, 30*time.Second, "alpha reading the forged snapshot", func() bool { return tableStatus(t, a.e, "jobs").Offset > from })
	if !same(stateOf(t, a.e, "jobs"), want) {
		t.Error("alpha, reading a snapshot it does not need, changed its rows")
	}

	g := startNode(t, "gamma", amqpURL, keyring(t, key), t.TempDir(), 1000)
	defer g.e.Close()
	meshtest.WaitFor(t, 30*time.Second, "gamma holding every row, the snapshot checked", func() bool {
		s := tableStatus(t, g.e, "jobs")
		return same(stateOf(t, g.e, "jobs"), want) && !s.Verifying
	})
	st := tableStatus(t, g.e, "jobs")
	if st.Refused["snapshot_disagrees"] == 0 || !strings.Contains(st.Alarm, "mallory") {
		t.Errorf("gamma's status %+v: want snapshot_disagrees, the alarm naming mallory", st)
	}
	t.Logf("gamma's alarm: %s", st.Alarm)

	// A member's empty batch naming its own offset, past every row, as
	// where joiners start: a node joining there finds no snapshot, reads
	// the log before it, holds every row and says so.
	undoWait := rows.SetSnapshotWait(time.Second)
	defer undoWait()
	past := tableStatus(t, a.e, "jobs").Offset
	publishLog(t, amqpURL, "jobs", s.ID(), "", rows.SealedBatch(s, "jobs", "mallory", "", past, 0, nil))
	meshtest.WaitFor(t, 30*time.Second, "alpha reading the forged offset", func() bool { return tableStatus(t, a.e, "jobs").Offset > past })
	d := startNode(t, "delta", amqpURL, keyring(t, key), t.TempDir(), 1000)
	defer d.e.Close()
	meshtest.WaitFor(t, 30*time.Second, "delta holding every row, the log before its start read", func() bool {
		s := tableStatus(t, d.e, "jobs")
		return same(stateOf(t, d.e, "jobs"), want) && !s.Verifying
	})
	if st := tableStatus(t, d.e, "jobs"); st.Refused["snapshot_disagrees"] == 0 || !strings.Contains(st.Alarm, "named no snapshot") {
		t.Errorf("delta's status %+v: want snapshot_disagrees, the alarm saying its offset named no snapshot", st)
	}
}

// A member floods a table's log with about 48 MB of changes stamped ahead
// of the clocks: within a day ahead they wait on disk up to their bound,
// the rest are dropped and counted, and further ahead they are refused;
// the node's heap stays within its bound, and after a restart it does not
// read the flood again. The control: a change stamped now, after the
// flood, is applied.
func TestAFutureFloodStaysBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("uses RabbitMQ")
	}
	amqpURL := meshtest.RabbitMQ(t).Vhost(t)
	key := seal.NewContentKey()
	dir := t.TempDir()
	a := startNode(t, "alpha", amqpURL, keyring(t, key), dir, 100000)
	putRows(t, a, 0, 1)
	waitSynced(t, a, "jobs", "alpha reading the log")
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()

	s, err := keyring(t, key).Sealer()
	if err != nil {
		t.Fatal(err)
	}
	value := strings.Repeat("x", rows.MaxValueLen)
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	const perBatch, batches = 24, 125 // 3,000 changes of 16 KiB
	sent := 0
	for i := range batches {
		ahead := 10 * time.Minute
		if i%25 == 0 {
			ahead = 3 * rows.MaxHoldAhead // refused at once
		}
		var cs []rows.Change
		for j := range perBatch {
			cs = append(cs, change("jobs", fmt.Sprintf("f%d-%d", i, j), "mallory", value, ahead))
		}
		body := rows.SealedBatch(s, "jobs", "mallory", "", 0, 0, cs)
		sent += len(body)
		dc, err := ch.PublishWithDeferredConfirm("mesh", rows.QueueOf("jobs"), false, false, amqp.Publishing{
			Headers: amqp.Table{wire.HeaderKey: s.ID()}, Body: body, DeliveryMode: amqp.Persistent})
		if err != nil {
			t.Fatal(err)
		}
		if !dc.Wait() {
			t.Fatal("not confirmed")
		}
	}
	conn.Close()
	meshtest.WaitFor(t, 2*time.Minute, "alpha reading the flood", func() bool {
		s := tableStatus(t, a.e, "jobs")
		// Offsets are not contiguous (a new segment skips one): the
		// flood is read when every change of it is counted.
		return s.Refused["far_future"] == 5*perBatch && s.Held+s.Refused["over_bound"] == 120*perBatch
	})
	grew := int64(heap()) - int64(before)
	st := tableStatus(t, a.e, "jobs")
	t.Logf("flood of %.1f MB: heap grew %.1f MiB; status held %d, refused %v", float64(sent)/1e6, float64(grew)/(1<<20), st.Held, st.Refused)
	if grew > 24<<20 {
		t.Errorf("heap grew %.1f MiB reading a flood of %.1f MB, want at most 24 MiB", float64(grew)/(1<<20), float64(sent)/1e6)
	}
	if st.Held == 0 || st.Held > rows.MaxHeldChanges || st.Held*rows.MaxValueLen > rows.MaxHeldBytes {
		t.Errorf("held %d changes of 16 KiB, want some, within %d changes and %d MiB", st.Held, rows.MaxHeldChanges, rows.MaxHeldBytes>>20)
	}
	if n := st.Refused["future"]; n != 120*perBatch {
		t.Errorf("future refusals %d, want %d", n, 120*perBatch)
	}
	offset, held := st.Offset, st.Held

	// A restart reads on from after the flood.
	if err := a.e.Close(); err != nil {
		t.Fatal(err)
	}
	a = startNode(t, "alpha", amqpURL, keyring(t, key), dir, 100000)
	defer a.e.Close()
	publishLog(t, amqpURL, "jobs", s.ID(), "", rows.SealedBatch(s, "jobs", "beta", "", 0, 0, []rows.Change{change("jobs", "r0000", "beta", "now", 0)}))
	meshtest.WaitFor(t, 30*time.Second, "alpha, restarted, applying a change of now", func() bool {
		return string(cellOf(t, a.e, "jobs", "r0000").Value) == "now" && tableStatus(t, a.e, "jobs").Offset > offset
	})
	st = tableStatus(t, a.e, "jobs")
	if st.Offset <= offset || len(st.Refused) != 0 || st.Held != held {
		t.Errorf("alpha after a restart: offset %d (before %d), refused %v, held %d (before %d); want it to read only the new change, its held changes kept", st.Offset, offset, st.Refused, st.Held, held)
	}
}
