package outbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// openTestOutbox opens an outbox of maxBytes at path (in a temporary
// directory when path is empty) and closes it in Cleanup.
func openTestOutbox(tb testing.TB, path string, maxBytes int64) *Outbox {
	tb.Helper()
	if path == "" {
		path = filepath.Join(tb.TempDir(), "outbox.db")
	}
	o, err := Open(path, Options{MaxBytes: maxBytes})
	if err != nil {
		tb.Fatalf("open outbox: %v", err)
	}
	tb.Cleanup(func() { _ = o.Close() })
	return o
}

func putWait(tb testing.TB, o *Outbox, r *Record) {
	tb.Helper()
	data := r.Encode()
	if err := o.Reserve(int64(len(data))); err != nil {
		tb.Fatalf("reserve: %v", err)
	}
	res := make(chan error, 1)
	o.Put(r, data, func(err error) { res <- err })
	if err := <-res; err != nil {
		tb.Fatalf("put: %v", err)
	}
}

func testRecord(seq uint64, kind Kind, body string) *Record {
	return &Record{Seq: seq, Kind: kind, Created: time.Now(), Name: "stage", MsgID: "id", Body: []byte(body)}
}

func TestOutboxPutReadDelete(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	o := openTestOutbox(t, path, 1<<20)
	for i := uint64(1); i <= 5; i++ {
		kind := Command
		if i == 3 {
			kind = Local
		}
		putWait(t, o, testRecord(i, kind, "b"))
	}
	if d, _ := o.Counts(); d != 5 {
		t.Fatalf("depth: got %d, want 5", d)
	}
	recs, err := o.ReadAfter(1, 10, KindsOf(Command))
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, r := range recs {
		seqs = append(seqs, r.Seq)
	}
	if len(seqs) != 3 || seqs[0] != 2 || seqs[1] != 4 || seqs[2] != 5 {
		t.Fatalf("readAfter(1, commands): got %v, want [2 4 5]", seqs)
	}
	o.Delete(recs[0].Seq, recs[0].Size, nil)
	if err := o.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	depth, bytes := o.Counts()
	if depth != 4 {
		t.Fatalf("depth after delete: got %d, want 4", depth)
	}
	if o.Oldest().IsZero() {
		t.Fatal("oldest: got zero, want the first record's time")
	}
	res := make(chan error, 1)
	o.MarkPublished(4, func(err error) { res <- err })
	if err := <-res; err != nil {
		t.Fatal(err)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}

	o2 := openTestOutbox(t, path, 1<<20)
	d2, b2 := o2.Counts()
	if d2 != depth || b2 != bytes {
		t.Errorf("after reopen: got depth %d bytes %d, want %d %d", d2, b2, depth, bytes)
	}
	if o2.MeshAtOpen() != 3 {
		t.Errorf("mesh records at open: got %d, want 3", o2.MeshAtOpen())
	}
	if got := o2.Published(); got != 4 {
		t.Errorf("published mark: got %d, want 4", got)
	}
	if got := o2.NextSeq(); got != 6 {
		t.Errorf("next seq: got %d, want 6", got)
	}
}

func TestOutboxReserveBound(t *testing.T) {
	o := openTestOutbox(t, "", 1<<16)
	r := testRecord(1, Event, strings.Repeat("x", 40000))
	putWait(t, o, r)
	data := testRecord(2, Event, strings.Repeat("x", 40000)).Encode()
	err := o.Reserve(int64(len(data)))
	if !errors.Is(err, ErrFull) {
		t.Fatalf("reserve over the bound: got %v, want ErrFull", err)
	}
	o.Delete(1, r.Size, nil)
	if err := o.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := o.Reserve(int64(len(data))); err != nil {
		t.Fatalf("reserve after delete: got %v, want nil", err)
	}
}

func TestOutboxLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	openTestOutbox(t, path, 1<<20)
	_, err := Open(path, Options{MaxBytes: 1 << 20})
	var le *LockedError
	if !errors.As(err, &le) || !errors.Is(err, ErrLocked) {
		t.Fatalf("second open: got %v, want *LockedError", err)
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
	if !strings.Contains(o.Warning(), "set aside") {
		t.Errorf("warning: got %q, want it to say the file was set aside", o.Warning())
	}
	matches, _ := filepath.Glob(path + ".corrupt-*")
	if len(matches) != 1 {
		t.Errorf("set-aside files: got %v, want one", matches)
	}
	putWait(t, o, testRecord(1, Event, "x")) // the new outbox works
}

func TestOutboxQuarantinesBadRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	o := openTestOutbox(t, path, 1<<20)
	putWait(t, o, testRecord(1, Event, "good"))
	if err := o.Close(); err != nil {
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
	if d, _ := o2.Counts(); d != 1 {
		t.Errorf("depth: got %d, want 1 (the bad record quarantined)", d)
	}
	if !strings.Contains(o2.Warning(), "quarantine") {
		t.Errorf("warning: got %q", o2.Warning())
	}
}

// TestOutboxGroupCommit checks that concurrent puts share commits.
func TestOutboxGroupCommit(t *testing.T) {
	o := openTestOutbox(t, "", 64<<20)
	const n = 2000
	done := make(chan error, n)
	start := time.Now()
	for i := 1; i <= n; i++ {
		r := testRecord(uint64(i), Command, "payload")
		data := r.Encode()
		if err := o.Reserve(int64(len(data))); err != nil {
			t.Fatal(err)
		}
		o.Put(r, data, func(err error) { done <- err })
	}
	for i := 0; i < n; i++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	o.c.mu.Lock()
	commits := o.c.commits
	o.c.mu.Unlock()
	t.Logf("%d puts in %v, %d commits", n, time.Since(start), commits)
	if d, _ := o.Counts(); d != n {
		t.Fatalf("depth: got %d, want %d", d, n)
	}
	if commits > n/4 {
		t.Errorf("commits: got %d for %d puts, want group commits (at most %d)", commits, n, n/4)
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
	if !strings.Contains(o.Warning(), "set aside") || !strings.Contains(o.Warning(), "bindings") {
		t.Fatalf("warning: got %q, want the foreign file set aside, naming its bucket", o.Warning())
	}
	if matches, _ := filepath.Glob(path + ".corrupt-*"); len(matches) != 1 {
		t.Fatalf("got %d set-aside files, want 1", len(matches))
	}
}

// A hung disk must not hang the node's stop: Close gives up on the writer
// after CloseWait and says so; the writer, once the disk returns, commits
// what it held and closes the file, which then opens again.
func TestCloseGivesUpOnAHungDisk(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	hung, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	o, err := Open(path, Options{MaxBytes: 1 << 20, CloseWait: 200 * time.Millisecond,
		BeforeCommit: func([]Change) error {
			once.Do(func() { close(hung) })
			<-release
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	committed := make(chan error, 1)
	o.MarkPublished(1, func(err error) { committed <- err })
	<-hung

	if err := o.Close(); !errors.Is(err, ErrStuck) {
		t.Fatalf("close on a hung disk: got %v, want an error wrapping ErrStuck", err)
	}
	close(release)
	if err := <-committed; err != nil {
		t.Fatalf("the released commit: got %v, want nil", err)
	}
	<-o.w.done // the writer exits after it closed the file
	if got := openTestOutbox(t, path, 1<<20).Published(); got != 1 {
		t.Fatalf("published mark after reopening: got %d, want 1 (the released commit)", got)
	}
}

// A change queued after Close is refused with ErrClosed and releases its
// reservation.
func TestChangesAfterCloseFail(t *testing.T) {
	o := openTestOutbox(t, "", 1<<20)
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	r := testRecord(1, Event, "late")
	data := r.Encode()
	if err := o.Reserve(int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if err := o.Wait(context.Background(), func(done func(error)) { o.Put(r, data, done) }); !errors.Is(err, ErrClosed) {
		t.Fatalf("put after close: got %v, want ErrClosed", err)
	}
	if err := o.Sync(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("sync after close: got %v, want ErrClosed", err)
	}
	o.c.mu.Lock()
	reserved := o.c.reserved
	o.c.mu.Unlock()
	if reserved != 0 {
		t.Fatalf("reserved after the refused put: got %d, want 0", reserved)
	}
}
