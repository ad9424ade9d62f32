package bridge

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// openTestOutbox opens an outbox in a temporary directory, starts its
// writer, and closes it in Cleanup.
func openTestOutbox(tb testing.TB, path string, maxBytes int64) *outbox {
	tb.Helper()
	if path == "" {
		path = filepath.Join(tb.TempDir(), "outbox.db")
	}
	o, err := openOutbox(path, maxBytes, slog.New(slog.DiscardHandler))
	if err != nil {
		tb.Fatalf("open outbox: %v", err)
	}
	o.start(func(uint8) {})
	tb.Cleanup(func() { _ = o.close() })
	return o
}

func putWait(tb testing.TB, o *outbox, r *record) {
	tb.Helper()
	data := r.encode()
	if err := o.reserve(int64(len(data))); err != nil {
		tb.Fatalf("reserve: %v", err)
	}
	res := make(chan error, 1)
	o.put(r, data, func(err error) { res <- err })
	if err := <-res; err != nil {
		tb.Fatalf("put: %v", err)
	}
}

func testRecord(seq uint64, kind recordKind, body string) *record {
	return &record{seq: seq, kind: kind, created: time.Now(), name: "stage", msgID: "id", body: []byte(body)}
}

func TestOutboxPutReadDelete(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	o := openTestOutbox(t, path, 1<<20)
	for i := uint64(1); i <= 5; i++ {
		kind := kindCommand
		if i == 3 {
			kind = kindLocal
		}
		putWait(t, o, testRecord(i, kind, "b"))
	}
	if d, _ := o.counts(); d != 5 {
		t.Fatalf("depth: got %d, want 5", d)
	}
	recs, err := o.readAfter(1, 10, 1<<kindCommand)
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, r := range recs {
		seqs = append(seqs, r.seq)
	}
	if len(seqs) != 3 || seqs[0] != 2 || seqs[1] != 4 || seqs[2] != 5 {
		t.Fatalf("readAfter(1, commands): got %v, want [2 4 5]", seqs)
	}
	o.del(recs[0].seq, recs[0].size, nil)
	if err := o.sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	depth, bytes := o.counts()
	if depth != 4 {
		t.Fatalf("depth after delete: got %d, want 4", depth)
	}
	if o.oldest().IsZero() {
		t.Fatal("oldest: got zero, want the first record's time")
	}
	res := make(chan error, 1)
	o.markPublished(4, func(err error) { res <- err })
	if err := <-res; err != nil {
		t.Fatal(err)
	}
	if err := o.close(); err != nil {
		t.Fatal(err)
	}

	o2 := openTestOutbox(t, path, 1<<20)
	d2, b2 := o2.counts()
	if d2 != depth || b2 != bytes {
		t.Errorf("after reopen: got depth %d bytes %d, want %d %d", d2, b2, depth, bytes)
	}
	if o2.meshAtOpen != 3 {
		t.Errorf("mesh records at open: got %d, want 3", o2.meshAtOpen)
	}
	if got := o2.publishedUpTo(); got != 4 {
		t.Errorf("published mark: got %d, want 4", got)
	}
	if got := o2.nextSeq(); got != 6 {
		t.Errorf("next seq: got %d, want 6", got)
	}
}

func TestOutboxReserveBound(t *testing.T) {
	o := openTestOutbox(t, "", 1<<16)
	r := testRecord(1, kindEvent, strings.Repeat("x", 40000))
	putWait(t, o, r)
	data := testRecord(2, kindEvent, strings.Repeat("x", 40000)).encode()
	err := o.reserve(int64(len(data)))
	if !errors.Is(err, ErrOutboxFull) {
		t.Fatalf("reserve over the bound: got %v, want ErrOutboxFull", err)
	}
	o.del(1, r.size, nil)
	if err := o.sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := o.reserve(int64(len(data))); err != nil {
		t.Fatalf("reserve after delete: got %v, want nil", err)
	}
}

func TestOutboxLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	openTestOutbox(t, path, 1<<20)
	_, err := openOutbox(path, 1<<20, slog.New(slog.DiscardHandler))
	var le *OutboxLockedError
	if !errors.As(err, &le) || !errors.Is(err, ErrOutboxLocked) {
		t.Fatalf("second open: got %v, want *OutboxLockedError", err)
	}
	if !strings.Contains(err.Error(), "data directory "+filepath.Dir(path)+" is in use by another meshbox process") {
		t.Errorf("message: got %q", err)
	}
}

func TestOutboxDamagedFileSetAside(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "outbox.db")
	if err := os.WriteFile(path, []byte(strings.Repeat("not a bbolt file ", 1000)), 0o600); err != nil {
		t.Fatal(err)
	}
	o := openTestOutbox(t, path, 1<<20)
	if !strings.Contains(o.warning, "set aside") {
		t.Errorf("warning: got %q, want it to say the file was set aside", o.warning)
	}
	matches, _ := filepath.Glob(path + ".corrupt-*")
	if len(matches) != 1 {
		t.Errorf("set-aside files: got %v, want one", matches)
	}
	putWait(t, o, testRecord(1, kindEvent, "x")) // the new outbox works
}

func TestOutboxQuarantinesBadRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	o := openTestOutbox(t, path, 1<<20)
	putWait(t, o, testRecord(1, kindEvent, "good"))
	if err := o.close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRecords).Put(seqKey(2), []byte{1, 2, 0, 0xff})
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()

	o2 := openTestOutbox(t, path, 1<<20)
	if d, _ := o2.counts(); d != 1 {
		t.Errorf("depth: got %d, want 1 (the bad record quarantined)", d)
	}
	if !strings.Contains(o2.warning, "quarantine") {
		t.Errorf("warning: got %q", o2.warning)
	}
}

// TestOutboxGroupCommit checks that concurrent puts share commits.
func TestOutboxGroupCommit(t *testing.T) {
	o := openTestOutbox(t, "", 64<<20)
	const n = 2000
	done := make(chan error, n)
	start := time.Now()
	for i := 1; i <= n; i++ {
		r := testRecord(uint64(i), kindCommand, "payload")
		data := r.encode()
		if err := o.reserve(int64(len(data))); err != nil {
			t.Fatal(err)
		}
		o.put(r, data, func(err error) { done <- err })
	}
	for i := 0; i < n; i++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	o.mu.Lock()
	commits := o.commits
	o.mu.Unlock()
	t.Logf("%d puts in %v, %d commits", n, time.Since(start), commits)
	if d, _ := o.counts(); d != n {
		t.Fatalf("depth: got %d, want %d", d, n)
	}
	if commits > n/4 {
		t.Errorf("commits: got %d for %d puts, want group commits (at most %d)", commits, n, n/4)
	}
}

// A hung disk must not hang the node's stop: Close gives up on the outbox's
// writer after its bound and says so; the writer closes the file if it
// ever returns.
func TestCloseReturnsWhenTheOutboxDiskHangs(t *testing.T) {
	b := localBridge(t)
	b.ob.closeWait = 200 * time.Millisecond
	hung, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b.ob.testCommit = func([]obOp) error {
		once.Do(func() { close(hung) })
		<-release
		return nil
	}
	t.Cleanup(func() {
		close(release)
		<-b.ob.done // the writer, released, exits and closes the file
	})
	b.ob.markPublished(1, nil)
	<-hung

	closed := make(chan error, 1)
	go func() { closed <- b.Close() }() // exits when Close returns
	select {
	case err := <-closed:
		if !errors.Is(err, ErrOutboxStuck) {
			t.Fatalf("got %v, want an error wrapping ErrOutboxStuck", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return within 10s while the outbox's disk hangs")
	}
}

// A bbolt file that is not an outbox (another layout) fails the layout
// check of the opener and is set aside like a damaged one.
func TestOutboxForeignFileSetAside(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucket([]byte("bindings"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	o := openTestOutbox(t, path, 1<<20)
	if !strings.Contains(o.warning, "set aside") || !strings.Contains(o.warning, "bindings") {
		t.Fatalf("warning: got %q, want the foreign file set aside, naming its bucket", o.warning)
	}
	if matches, _ := filepath.Glob(path + ".corrupt-*"); len(matches) != 1 {
		t.Fatalf("got %d set-aside files, want 1", len(matches))
	}
}
