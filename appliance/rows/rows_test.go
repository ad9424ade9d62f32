package rows_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/meshbox/meshbox/testing/meshtest"
)

func TestMain(m *testing.M) { os.Exit(meshtest.MainLeakFree(m)) }

// node is an engine whose link to the broker can be cut. It dials the
// broker itself: it stands in for the node's bridge.
type node struct {
	e     *rows.Engine
	mu    sync.Mutex
	url   string
	cut   bool
	moved chan struct{} // closed by setCut
}

// Dial implements rows.Link.
func (n *node) Dial(ctx context.Context, role string) (*amqp.Connection, string, error) {
	n.mu.Lock()
	url, cut := n.url, n.cut
	n.mu.Unlock()
	if cut {
		return nil, "", rows.ErrLinkDown
	}
	uri, err := amqp.ParseURI(url)
	if err != nil {
		return nil, "", err
	}
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second),
		Properties: amqp.Table{"connection_name": "rows test (" + role + ")"}})
	return conn, uri.Username, err
}

// Moved implements rows.Link.
func (n *node) Moved() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.moved
}

func (n *node) setCut(cut bool) {
	n.mu.Lock()
	n.cut = cut
	close(n.moved)
	n.moved = make(chan struct{})
	n.mu.Unlock()
	if !cut {
		n.e.LinkUp()
	}
}

func keyring(t *testing.T, k seal.ContentKey) *seal.Keyring {
	t.Helper()
	r, err := seal.NewKeyring([]seal.ContentKey{k}, k.ID)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func startNode(t *testing.T, name, url string, ring *seal.Keyring, dir string, snapshotEvery int) *node {
	t.Helper()
	return startNodeParts(t, name, url, ring, dir, snapshotEvery, true)
}

// startNodeParts is startNode writing snapshot parts in binary or not
// (the nodes it knows of read them, or some may not).
func startNodeParts(t *testing.T, name, url string, ring *seal.Keyring, dir string, snapshotEvery int, binary bool) *node {
	t.Helper()
	n := &node{url: url, moved: make(chan struct{})}
	e, err := rows.Open(rows.Config{Node: name, Path: filepath.Join(dir, "rows.db"), Keys: ring,
		Link: n, Declare: func(string) bool { return true }, SnapshotEvery: snapshotEvery,
		BinaryParts: func() bool { return binary }})
	if err != nil {
		t.Fatal(err)
	}
	n.e = e
	e.SetTables(map[string]rows.TableSpec{"jobs": {}})
	return n
}

// putRows writes rows r<from>..r<to-1> of table jobs on n, a field n each.
func putRows(t *testing.T, n *node, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		if _, err := n.e.Put("jobs", fmt.Sprintf("r%04d", i), map[string][]byte{"n": []byte(fmt.Sprint(i))}, nil); err != nil {
			t.Fatal(err)
		}
	}
}

// state is a replica's content: row.field -> value@stamp/node, tombstones included.
func state(t *testing.T, e *rows.Engine) map[string]string {
	t.Helper()
	out := map[string]string{}
	if err := e.Store().Rows("jobs", "", func(row string, cells map[string]rows.Cell) bool {
		for f, c := range cells {
			out[row+"."+f] = fmt.Sprintf("%q@%d/%s/%v", c.Value, c.Stamp, c.Node, c.Deleted)
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func same(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// Two nodes change different fields of one row while cut off from the
// broker, and the same field: after the cut both keep both fields and
// agree on the same field's last writer; a third node joining later,
// while both others are gone, gets the whole state from the broker, from
// the newest snapshot.
func TestRowsConvergeAndJoin(t *testing.T) {
	if testing.Short() {
		t.Skip("uses RabbitMQ")
	}
	url := meshtest.RabbitMQ(t).Vhost(t)
	key := seal.NewContentKey()
	a := startNode(t, "alpha", url, keyring(t, key), t.TempDir(), 50)
	b := startNode(t, "beta", url, keyring(t, key), t.TempDir(), 50)
	defer a.e.Close()
	defer b.e.Close()

	if _, err := a.e.Put("jobs", "42", map[string][]byte{"status": []byte("queued")}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := a.e.Put("jobs", "gone", map[string][]byte{"n": []byte("1")}, nil); err != nil {
		t.Fatal(err)
	}
	meshtest.WaitFor(t, 20*time.Second, "beta has job 42 and row gone", func() bool {
		c, err := b.e.Get("jobs", "42")
		_, gerr := b.e.Get("jobs", "gone")
		return err == nil && string(c["status"].Value) == "queued" && gerr == nil
	})

	a.setCut(true)
	b.setCut(true)
	time.Sleep(200 * time.Millisecond)
	if _, err := a.e.Put("jobs", "42", map[string][]byte{"claim": []byte("alpha"), "owner": []byte("a")}, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	if _, err := b.e.Put("jobs", "42", map[string][]byte{"result": []byte("done"), "owner": []byte("b")}, nil); err != nil {
		t.Fatal(err)
	}
	for i := range 120 { // enough for a snapshot (every 50 changes)
		if _, err := a.e.Put("jobs", fmt.Sprintf("r%03d", i), map[string][]byte{"n": []byte(fmt.Sprint(i))}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.e.DeleteRow("jobs", "gone"); err != nil {
		t.Fatal(err)
	}
	a.setCut(false)
	b.setCut(false)
	meshtest.WaitFor(t, 30*time.Second, "alpha and beta agree", func() bool { return same(state(t, a.e), state(t, b.e)) })
	got, err := a.e.Get("jobs", "42")
	if err != nil {
		t.Fatal(err)
	}
	if string(got["claim"].Value) != "alpha" || string(got["result"].Value) != "done" || string(got["owner"].Value) != "b" || string(got["status"].Value) != "queued" {
		t.Fatalf("job 42: %v; want both offline changes (claim alpha, result done), owner b (the later write) and status queued", got)
	}
	if _, err := a.e.Get("jobs", "gone"); err == nil {
		t.Fatal("row gone, deleted on beta, is still there on alpha")
	}
	want := state(t, a.e)
	meshtest.WaitFor(t, 30*time.Second, "a snapshot in the log", func() bool {
		for _, s := range append(a.e.Status(), b.e.Status()...) {
			if s.LastSnapshot != nil {
				return true
			}
		}
		return false
	})
	a.setCut(true)
	b.setCut(true)
	c := startNode(t, "gamma", url, keyring(t, key), t.TempDir(), 50)
	defer c.e.Close()
	meshtest.WaitFor(t, 30*time.Second, "gamma has the whole state", func() bool { return same(state(t, c.e), want) })

	// A node without the table's key reads the log and opens nothing.
	d := startNode(t, "delta", url, keyring(t, seal.NewContentKey()), t.TempDir(), 50)
	defer d.e.Close()
	meshtest.WaitFor(t, 30*time.Second, "delta refuses what it cannot open", func() bool {
		st := d.e.Status()
		return len(st) == 1 && st[0].Refused["unopened"] > 0
	})
	if s := state(t, d.e); len(s) != 0 {
		t.Fatalf("delta, without the key, holds %d cells", len(s))
	}
}

// A burst of writes past the snapshot threshold, within the least time
// between two snapshots of a node, is compacted once that time has
// passed, with no write after it: the log does not keep the burst
// uncompacted until the next write.
func TestBurstCompactedAfterTheGap(t *testing.T) {
	if testing.Short() {
		t.Skip("uses RabbitMQ")
	}
	defer rows.SetSnapshotGap(4 * time.Second)()
	url := meshtest.RabbitMQ(t).Vhost(t)
	a := startNode(t, "alpha", url, keyring(t, seal.NewContentKey()), t.TempDir(), 50)
	defer a.e.Close()
	lastSnapshot := func() time.Time {
		if st := a.e.Status(); len(st) == 1 && st[0].LastSnapshot != nil {
			return *st[0].LastSnapshot
		}
		return time.Time{}
	}
	putRows(t, a, 0, 60) // past 50 changes: the first snapshot
	meshtest.WaitFor(t, 30*time.Second, "the first snapshot", func() bool { return !lastSnapshot().IsZero() })
	first := lastSnapshot()
	putRows(t, a, 60, 200) // due again at once, within the gap
	burstEnd := time.Now()
	meshtest.WaitFor(t, 30*time.Second, "a snapshot after the burst, with no write since", func() bool { return lastSnapshot().After(burstEnd) })
	if second := lastSnapshot(); second.Sub(first) < 4*time.Second {
		t.Fatalf("two snapshots %v apart, less than the gap of 4s", second.Sub(first))
	}
}

// Where a node new to a table starts reading its log is the word of the
// newest message that opens, sealed, never of a header: a node outside
// the table's key (any node may publish into the log) that names an
// offset past the rows in a header makes a joining node skip nothing; a
// control joins while the newest message is a member's.
func TestJoinIgnoresAForgedStart(t *testing.T) {
	if testing.Short() {
		t.Skip("uses RabbitMQ")
	}
	t.Parallel()
	url := meshtest.RabbitMQ(t).Vhost(t)
	key := seal.NewContentKey()
	a := startNode(t, "alpha", url, keyring(t, key), t.TempDir(), 50)
	defer a.e.Close()
	putRows(t, a, 0, 120) // past 50 changes: a snapshot
	meshtest.WaitFor(t, 30*time.Second, "alpha's writes and a snapshot in the log", func() bool {
		st := a.e.Status()
		return len(st) == 1 && st[0].Pending == 0 && st[0].LastSnapshot != nil && st[0].Behind == 0
	})
	want := state(t, a.e)

	// Control: the newest message is alpha's.
	b := startNode(t, "beta", url, keyring(t, key), t.TempDir(), 50)
	defer b.e.Close()
	meshtest.WaitFor(t, 30*time.Second, "beta, joining, has the whole state", func() bool { return same(state(t, b.e), want) })

	// An outsider's messages: a header naming an offset far past the log,
	// and one naming its own offset; neither opens.
	conn, err := amqp.Dial(url)
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
	for _, off := range []int64{1 << 40, 200} {
		dc, err := ch.PublishWithDeferredConfirm("mesh", rows.QueueOf("jobs"), false, false, amqp.Publishing{
			Headers: amqp.Table{wire.HeaderRowsSnap: off, wire.HeaderKey: "k-forged"}, Body: []byte("not sealed"), DeliveryMode: amqp.Persistent})
		if err != nil {
			t.Fatal(err)
		}
		if !dc.Wait() {
			t.Fatal("forged message not confirmed")
		}
	}
	c := startNode(t, "gamma", url, keyring(t, key), t.TempDir(), 50)
	defer c.e.Close()
	meshtest.WaitFor(t, 30*time.Second, "gamma, joining after the forged messages, has the whole state", func() bool { return same(state(t, c.e), want) })
	st := c.e.Status()
	if len(st) != 1 || st[0].Refused["unopened"] != 2 {
		t.Fatalf("gamma's status %+v; want the 2 forged messages refused as unopened", st)
	}
}

// A node of the mesh that holds no key yet (a peer seals it for the node
// a moment after it starts) waits for it before it reads a table's log,
// and says so: it does not refuse the log as unopened and move past it.
// The control is the same node once the key arrives: it holds every row.
func TestReaderWaitsForItsKey(t *testing.T) {
	if testing.Short() {
		t.Skip("uses RabbitMQ")
	}
	url := meshtest.RabbitMQ(t).Vhost(t)
	key := seal.NewContentKey()
	a := startNode(t, "alpha", url, keyring(t, key), t.TempDir(), 1000)
	defer a.e.Close()
	putRows(t, a, 0, 30)
	meshtest.WaitFor(t, 30*time.Second, "alpha's writes in the log", func() bool {
		st := a.e.Status()
		return len(st) == 1 && st[0].Pending == 0
	})
	ring, err := seal.NewKeyring(nil, "")
	if err != nil {
		t.Fatal(err)
	}
	b := startNode(t, "beta", url, ring, t.TempDir(), 1000)
	defer b.e.Close()
	meshtest.WaitFor(t, 30*time.Second, "beta says it waits for the key", func() bool {
		st := b.e.Status()
		return len(st) == 1 && strings.Contains(st[0].Waiting, "key of the mesh")
	})
	time.Sleep(time.Second) // a reader that did not wait would refuse the log now
	if st := b.e.Status(); len(st[0].Refused) != 0 || st[0].Offset != 0 || st[0].Synced {
		t.Fatalf("beta, without the key, read the log: %+v", st[0])
	}
	if err := ring.Set([]seal.ContentKey{key}, key.ID); err != nil {
		t.Fatal(err)
	}
	want := state(t, a.e)
	meshtest.WaitFor(t, 30*time.Second, "beta, with the key, has every row", func() bool { return same(state(t, b.e), want) })
	if st := b.e.Status(); len(st[0].Refused) != 0 || st[0].Waiting != "" {
		t.Fatalf("beta's status %+v; want nothing refused, nothing waited for", st[0])
	}
}

// A node writes its snapshot's parts in binary only when every node it
// knows of reads them, in JSON otherwise (version 1, as nodes of before
// wrote them); a node new to the table joins from either and holds the
// whole table. The log's snapshot messages, opened with the key, say
// which was written.
func TestJoinFromPartsOfEitherVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("uses RabbitMQ")
	}
	t.Parallel()
	for _, binary := range []bool{false, true} {
		t.Run(fmt.Sprintf("binary=%v", binary), func(t *testing.T) {
			url := meshtest.RabbitMQ(t).Vhost(t)
			key := seal.NewContentKey()
			ring := keyring(t, key)
			a := startNodeParts(t, "alpha", url, ring, t.TempDir(), 50, binary)
			defer a.e.Close()
			putRows(t, a, 0, 120)
			meshtest.WaitFor(t, 30*time.Second, "alpha's snapshot in the log", func() bool {
				s := tableStatus(t, a.e, "jobs")
				return s.Pending == 0 && s.LastSnapshot != nil
			})
			want := state(t, a.e)
			c := startNode(t, "gamma", url, ring, t.TempDir(), 50)
			defer c.e.Close()
			meshtest.WaitFor(t, 30*time.Second, "gamma has the whole table", func() bool { return same(state(t, c.e), want) })

			parts := map[int]int{}
			for _, d := range readLog(t, url, "jobs") {
				keyID, _ := d.Headers[wire.HeaderKey].(string)
				kind, v, err := rows.PartVersion(ring, "jobs", keyID, d.Body)
				if err != nil {
					t.Fatalf("a message of the log does not open: %v", err)
				}
				if kind == "snapshot" {
					parts[v]++
				}
			}
			wantV := 1
			if binary {
				wantV = 2
			}
			if parts[wantV] == 0 || len(parts) != 1 {
				t.Fatalf("snapshot parts in the log by version: %v, want version %d only", parts, wantV)
			}
		})
	}
}

// readLog reads table's log from its first message, as an operator
// with the broker's credential may, until none follows for half a
// second.
func readLog(t *testing.T, amqpURL, table string) []amqp.Delivery {
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
	if err := ch.Qos(64, 0, false); err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume(rows.QueueOf(table), "", false, false, false, false, amqp.Table{"x-stream-offset": "first"})
	if err != nil {
		t.Fatal(err)
	}
	var out []amqp.Delivery
	for quiet := time.NewTimer(2 * time.Second); ; quiet.Reset(500 * time.Millisecond) {
		select {
		case d, ok := <-ds:
			if !ok {
				t.Fatalf("the log of %s: the consumer ended after %d messages", table, len(out))
			}
			if err := d.Ack(false); err != nil {
				t.Fatal(err)
			}
			out = append(out, d)
			continue
		case <-quiet.C:
		}
		return out
	}
}
