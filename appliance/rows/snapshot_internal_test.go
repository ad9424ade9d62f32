package rows

import (
	"path/filepath"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// snapshotBound is how long after its due moment a snapshot may wait to
// be scheduled: the snapshot clock's tick and snapshotSoon's wait (a
// second and the node's own share of five).
const snapshotBound = 10 * time.Second

// openQuiet opens an engine without a broker whose table jobs reads as
// if connected, a snapshot of it read just now, and its snapshots taken
// from e.snapshots by the test instead of the publisher.
func openQuiet(t *testing.T, cfg Config) *Engine {
	t.Helper()
	// eta: snapshotSoon waits 1.13 s (its share of five is 127 ms).
	cfg.Node, cfg.Path = "eta", filepath.Join(t.TempDir(), "rows.db")
	e, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	e.mu.Lock()
	st := e.state("jobs")
	st.connected, st.snapshotTime = true, time.Now()
	e.mu.Unlock()
	return e
}

// readBack has e's reader read back a log message of its own writes
// carrying n changes at offset o, and commit it.
func readBack(t *testing.T, e *Engine, o int64, n int) {
	t.Helper()
	body := []byte{byte(o), byte(o >> 8), byte(n)}
	e.noteOwn(body, n)
	run := e.openRun("jobs", []amqp.Delivery{{Body: body, Headers: amqp.Table{headerOffset: o}}}, false)
	if err := e.commitRun("jobs", run); err != nil {
		t.Fatal(err)
	}
}

// waitSnapshot waits up to d for a snapshot of jobs to be scheduled.
func waitSnapshot(e *Engine, d time.Duration) bool {
	select {
	case table := <-e.snapshots:
		return table == "jobs"
	case <-time.After(d):
		return false
	}
}

// The last run of a stream of writes commits before the newest snapshot
// is a quarter of the log's retention old, with fewer changes after it
// than SnapshotEvery: the snapshot is due at that age, no run follows to
// find it due, and it must come all the same (the log would otherwise
// keep the changes after the snapshot only until retention drops them;
// TestANodeBackAfterAGapTakesASnapshot waited for it in vain).
func TestSnapshotDueByAgeWithoutARun(t *testing.T) {
	e := openQuiet(t, Config{MaxAge: 2 * time.Second, SnapshotEvery: 100})
	readBack(t, e, 1, 10) // not due: 10 changes, the snapshot 0 s old
	if waitSnapshot(e, 0) {
		t.Fatal("a snapshot scheduled with 10 changes after one just read")
	}
	due := time.Now().Add(e.cfg.MaxAge / 4)
	if !waitSnapshot(e, time.Until(due)+snapshotBound) {
		t.Fatalf("no snapshot within %s of its due moment (the newest a quarter of the log's retention old, 10 changes after it)", snapshotBound)
	}
}

// A snapshot due by its count while the node verifies the one it joined
// from is held back; once the check ends, it must come without a run.
func TestSnapshotHeldBackComesAfterTheCheck(t *testing.T) {
	e := openQuiet(t, Config{MaxAge: time.Hour, SnapshotEvery: 100})
	e.setVerifying("jobs", true)
	readBack(t, e, 1, 100) // due, held back
	if !pollState(e, snapshotBound, func(st *tableState) bool { return !st.snapshotQueued }) {
		t.Fatal("the snapshot scheduled by the run was never weighed")
	}
	if waitSnapshot(e, 0) {
		t.Fatal("a snapshot written while the node verifies")
	}
	e.setVerifying("jobs", false)
	if !waitSnapshot(e, snapshotBound) {
		t.Fatalf("no snapshot within %s of the check's end (due by its count since before)", snapshotBound)
	}
}

// pollState reports whether cond holds of jobs' state within d.
func pollState(e *Engine, d time.Duration, cond func(*tableState) bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		e.mu.Lock()
		ok := cond(e.state("jobs"))
		e.mu.Unlock()
		if ok {
			return true
		}
	}
	return false
}
