package cache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/meshbox/meshbox/testing/testio"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeSource is an in-memory mesh database that can go down and come back.
type fakeSource struct {
	mu      sync.Mutex
	rev     int64
	b       Bindings
	down    bool
	delay   time.Duration // each load takes this long (or until its context ends)
	loads   int
	changed func()
	lost    func(error)
}

var errDown = errors.New("connection refused")

func (f *fakeSource) Load(ctx context.Context, node string) (Snapshot, error) {
	f.mu.Lock()
	f.loads++
	delay := f.delay
	f.mu.Unlock()
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return Snapshot{}, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return Snapshot{}, errDown
	}
	b := f.b
	b.Node = node
	return NewSnapshot(f.rev, time.Now(), "postgres://db/mesh", b), nil
}

func (f *fakeSource) Watch(ctx context.Context, changed func(), lost func(error)) error {
	f.mu.Lock()
	f.changed, f.lost = changed, lost
	down := f.down
	f.mu.Unlock()
	if !down {
		changed()
	}
	<-ctx.Done()
	return nil
}

// set changes the database's content at a new revision and notifies
// (a notification is lost while the database is down).
func (f *fakeSource) set(rev int64, b Bindings) {
	f.mu.Lock()
	f.rev, f.b = rev, b
	changed, down := f.changed, f.down
	f.mu.Unlock()
	if changed != nil && !down {
		changed()
	}
}

func (f *fakeSource) setDown(down bool) {
	f.mu.Lock()
	f.down = down
	changed, lost := f.changed, f.lost
	f.mu.Unlock()
	switch {
	case down && lost != nil:
		lost(errDown)
	case !down && changed != nil:
		changed() // reconnect
	}
}

type managerEnv struct {
	src   *fakeSource
	store *Store
	reg   *prometheus.Registry
	logs  *testio.Buffer
	m     *Manager
}

// newManagerEnv builds a manager for node n1 on a fresh store; withDB
// false gives it no source. Call it inside a synctest bubble: the
// manager's timers (retries with the default 1s..30s backoff, refresh,
// max age) then run on the bubble's clock, and the test moves time with
// time.Sleep.
func newManagerEnv(tb testing.TB, withDB bool, maxAge time.Duration) *managerEnv {
	tb.Helper()
	e := &managerEnv{
		store: openStore(tb, StoreOptions{}),
		reg:   prometheus.NewRegistry(),
		logs:  &testio.Buffer{},
	}
	e.src = &fakeSource{rev: 1, b: testBindings(1)}
	cfg := ManagerConfig{
		Node: "n1", Store: e.store, MaxAge: maxAge,
		Logger: slog.New(slog.NewTextHandler(e.logs, nil)), Metrics: e.reg,
		// These tests are about what a reload does; the wait before it
		// has its own tests (spread_test.go).
		MaxNotifyDelay: -1,
		// The timings these tests count in (a node's defaults are slower:
		// DefaultRetryInterval, DefaultLoadTimeout).
		RetryInterval: time.Second,
		LoadTimeout:   2 * time.Second,
	}
	if withDB {
		cfg.Source = e.src
	}
	m, err := NewManager(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	e.m = m
	tb.Cleanup(func() { _ = m.Close() })
	return e
}

// start starts the manager and, with a source, waits until it watches.
func (e *managerEnv) start(tb testing.TB) {
	tb.Helper()
	if err := e.m.Start(context.Background()); err != nil {
		tb.Fatal(err)
	}
	synctest.Wait() // the watcher is in Watch, the run loop waits for work
	if e.m.cfg.Source != nil {
		e.src.mu.Lock()
		defer e.src.mu.Unlock()
		if e.src.changed == nil {
			tb.Fatal("the manager does not watch the source")
		}
	}
}

func TestChooseStart(t *testing.T) {
	live := NewSnapshot(5, time.Now(), "db", testBindings(5))
	cached := NewSnapshot(3, time.Now(), "db", testBindings(3))
	other := testBindings(3)
	other.Node = "n2"
	otherSnap := NewSnapshot(3, time.Now(), "db", other)
	corrupt := &CorruptError{Path: "x", Reason: "hash"}
	tests := []struct {
		name       string
		liveErr    error
		cached     Snapshot
		cachedErr  error
		wantSource string
		wantRev    int64
	}{
		{"database answers", nil, cached, nil, SourceDB, 5},
		{"database answers, empty cache", nil, Snapshot{}, ErrNoSnapshot, SourceDB, 5},
		{"database down, cache", errDown, cached, nil, SourceCache, 3},
		{"no database configured, cache", errNoSource, cached, nil, SourceCache, 3},
		{"database down, empty cache", errDown, Snapshot{}, ErrNoSnapshot, SourceNone, 0},
		{"database down, unreadable cache", errDown, Snapshot{}, corrupt, SourceNone, 0},
		{"database down, cache of another node", errDown, otherSnap, nil, SourceNone, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := live
			if tt.liveErr != nil {
				l = Snapshot{}
			}
			c := chooseStart("n1", l, tt.liveErr, tt.cached, tt.cachedErr)
			if c.source != tt.wantSource || c.snap.Revision != tt.wantRev {
				t.Fatalf("got source %s revision %d, want %s %d", c.source, c.snap.Revision, tt.wantSource, tt.wantRev)
			}
			if c.source == SourceNone && c.reason == "" {
				t.Fatal("no reason given for ignoring the cache")
			}
		})
	}
}

func TestChooseReload(t *testing.T) {
	cur := NewSnapshot(3, time.Now(), "db", testBindings(3))
	tests := []struct {
		name   string
		have   bool
		loaded Snapshot
		want   reloadAction
	}{
		{"nothing in use", false, cur, reloadApply},
		{"same revision and content", true, cur, reloadUnchanged},
		{"newer revision, same content (another node's rows changed)", true, NewSnapshot(4, time.Now(), "db", testBindings(3)), reloadRefresh},
		{"newer revision, new content", true, NewSnapshot(4, time.Now(), "db", testBindings(4)), reloadApply},
		{"older revision, other content (database rebuilt)", true, NewSnapshot(1, time.Now(), "db", testBindings(1)), reloadApply},
		{"same revision, other content", true, NewSnapshot(3, time.Now(), "db", testBindings(9)), reloadApply},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := chooseReload(cur, tt.have, tt.loaded); got != tt.want {
				t.Fatalf("got %d, want %d", got, tt.want)
			}
		})
	}
}

func TestManagerStartsFromDatabase(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newManagerEnv(t, true, 0)
		e.start(t)
		st := e.m.Status()
		if st.Source != SourceDB || st.DB != DBConnected || st.Revision != 1 || st.AgeSeconds != 0 || st.Warning != "" {
			t.Fatalf("status: got %+v, want source db, connected, revision 1, age 0, no warning", st)
		}
		snap, err := e.store.Latest()
		if err != nil || snap.Revision != 1 {
			t.Fatalf("cache after start: got revision %d, %v; want 1", snap.Revision, err)
		}
		if got := metricValue(t, e.m.metrics.source.WithLabelValues("db")); got != 1 {
			t.Fatalf("meshbox_bindings_source{source=db}: got %v, want 1", got)
		}
		if got := metricValue(t, e.m.metrics.dbUp); got != 1 {
			t.Fatalf("meshbox_bindings_db_up: got %v, want 1", got)
		}
	})
}

func TestManagerLiveChangeAppliedAndReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newManagerEnv(t, true, 0)
		e.start(t)
		changes := make(chan Divergence, 4)
		e.m.OnChange(func(s Snapshot, d Divergence) { changes <- d })

		b := testBindings(1)
		b.Settings["broker.url"] = "amqp://u:secret@broker2:5672/"
		e.src.set(2, b)
		select {
		case d := <-changes:
			want := `[setting broker.url changed: "amqp://u:xxxxx@broker:5672/" -> "amqp://u:xxxxx@broker2:5672/"]`
			if fmt.Sprint(d.Strings()) != want {
				t.Fatalf("divergence: got %q, want %s", d.Strings(), want)
			}
		case <-time.After(time.Second):
			t.Fatal("change not applied within 1s")
		}
		cur, _ := e.m.Current()
		if cur.Revision != 2 || cur.Bindings.Settings["broker.url"] != "amqp://u:secret@broker2:5672/" {
			t.Fatalf("current: got revision %d broker %s, want 2 and broker2", cur.Revision, RedactURL(cur.Bindings.Settings["broker.url"]))
		}
		st := e.m.Status()
		if st.Divergence == nil || st.Divergence.OnReconnect || st.Divergence.FromRevision != 1 || st.Divergence.ToRevision != 2 {
			t.Fatalf("status divergence: got %+v, want a live change 1 -> 2", st.Divergence)
		}
		if got := metricValue(t, e.m.metrics.divergences); got != 0 {
			t.Fatalf("divergences_total after a live change: got %v, want 0", got)
		}
		if strings.Contains(e.logs.String(), "secret") {
			t.Fatalf("log leaks a password: %s", e.logs.String())
		}

		// Another node's rows changed: new revision, same content for us.
		e.src.set(3, b)
		synctest.Wait()
		if c, _ := e.m.Current(); c.Revision != 3 {
			t.Fatalf("revision after the notification: got %d, want 3", c.Revision)
		}
		select {
		case d := <-changes:
			t.Fatalf("OnChange called for a revision without content change: %v", d)
		default:
		}
		if latest, _ := e.store.Latest(); latest.Revision != 3 {
			t.Fatalf("cache after refresh: got revision %d, want 3", latest.Revision)
		}
	})
}

func TestManagerFallsBackToCacheThenReportsDivergence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newManagerEnv(t, true, 10*time.Minute)
		// An earlier run cached revision 3, fetched 30s ago.
		if err := e.store.Put(NewSnapshot(3, time.Now().Add(-30*time.Second), "db", testBindings(3))); err != nil {
			t.Fatal(err)
		}
		e.src.down = true
		changes := make(chan Divergence, 4)
		e.m.OnChange(func(s Snapshot, d Divergence) { changes <- d })
		e.start(t)

		st := e.m.Status()
		if st.Source != SourceCache || st.DB != DBDisconnected || st.Revision != 3 || st.AgeSeconds != 30 {
			t.Fatalf("status: got %+v, want source cache, disconnected, revision 3, age 30", st)
		}
		if st.LastError == "" {
			t.Fatal("status last_error empty while the database is down")
		}
		time.Sleep(20 * time.Second)
		if st := e.m.Status(); st.AgeSeconds != 50 {
			t.Fatalf("age after 20s: got %v, want 50", st.AgeSeconds)
		}
		if got := metricValue(t, e.m.metrics.age); got != 50 {
			t.Fatalf("meshbox_bindings_age_seconds: got %v, want 50", got)
		}
		if !strings.Contains(e.logs.String(), "cannot load the bindings from the mesh database at start; using cached bindings") {
			t.Fatalf("no start-from-cache log line: %s", e.logs.String())
		}

		// Max age exceeded: warning in status, metric, one log line.
		time.Sleep(10 * time.Minute)
		st = e.m.Status()
		if !strings.Contains(st.Warning, "more than the maximum age") {
			t.Fatalf("warning: got %q, want max age exceeded", st.Warning)
		}
		e.m.Status()
		if n := strings.Count(e.logs.String(), "older than the configured maximum age"); n != 1 {
			t.Fatalf("max-age log lines: got %d, want 1", n)
		}
		if got := metricValue(t, e.m.metrics.stale); got != 1 {
			t.Fatalf("meshbox_bindings_stale: got %v, want 1", got)
		}

		// The database changed while we were away: a setting, an override, a
		// grant revoked, a node added.
		b := testBindings(3)
		b.Settings["forge.url"] = "https://forge/new"
		b.Overrides[0].Value = "16"
		b.Grants = nil
		b.Nodes = append(b.Nodes, NodeRecord{Name: "n9"})
		e.src.mu.Lock()
		e.src.rev, e.src.b = 7, b
		e.src.mu.Unlock()
		e.src.setDown(false)

		var d Divergence
		select {
		case d = <-changes:
		case <-time.After(2 * time.Second):
			t.Fatal("divergence not applied after reconnect")
		}
		want := []string{
			`node n9 added: public_name="" identity=""`,
			`setting forge.url changed: "https://forge/3" -> "https://forge/new"`,
			`override photos/threads changed: "4" -> "16"`,
			`grant n1:s3@n2 removed (was credential [redacted])`,
		}
		if fmt.Sprint(d.Strings()) != fmt.Sprint(want) {
			t.Fatalf("divergence:\ngot  %q\nwant %q", d.Strings(), want)
		}
		st = e.m.Status()
		if st.Source != SourceDB || st.DB != DBConnected || st.AgeSeconds != 0 || st.Revision != 7 || st.Warning != "" {
			t.Fatalf("status after reconnect: got %+v, want db, connected, age 0, revision 7, no warning", st)
		}
		if st.Divergence == nil || !st.Divergence.OnReconnect || st.Divergence.FromSource != SourceCache ||
			st.Divergence.FromRevision != 3 || st.Divergence.ToRevision != 7 || len(st.Divergence.Changes) != 4 {
			t.Fatalf("status divergence: got %+v, want from cache 3 -> 7 with 4 changes", st.Divergence)
		}
		if got := metricValue(t, e.m.metrics.divergences); got != 1 {
			t.Fatalf("divergences_total: got %v, want 1", got)
		}
		logs := e.logs.String()
		if n := strings.Count(logs, "ahead of the bindings in use"); n != 1 {
			t.Fatalf("divergence log lines: got %d, want 1\n%s", n, logs)
		}
		if !strings.Contains(logs, "forge.url") || strings.Contains(logs, "hunter2") {
			t.Fatalf("divergence log line should name the setting and no credential:\n%s", logs)
		}
		if latest, _ := e.store.Latest(); latest.Revision != 7 {
			t.Fatalf("cache after reconnect: got revision %d, want 7", latest.Revision)
		}
	})
}

func TestManagerLosesDatabaseAndAges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newManagerEnv(t, true, 0)
		e.start(t)
		e.src.setDown(true)
		st := e.m.Status()
		if st.DB != DBDisconnected || st.Source != SourceDB {
			t.Fatalf("status after loss: got %+v, want db disconnected, source db", st)
		}
		time.Sleep(5 * time.Second)
		if st := e.m.Status(); st.AgeSeconds != 5 {
			t.Fatalf("age 5s after loss: got %v, want 5", st.AgeSeconds)
		}
		// A change made while down: its notification is lost, the reconnect finds it.
		b := testBindings(1)
		b.Assignments = append(b.Assignments, Assignment{Module: "backup", Selection: "v1"})
		e.src.set(2, b)
		synctest.Wait()
		if c, _ := e.m.Current(); c.Revision != 1 {
			t.Fatalf("revision while down: got %d, want 1", c.Revision)
		}
		e.src.setDown(false)
		synctest.Wait()
		if c, _ := e.m.Current(); c.Revision != 2 {
			t.Fatalf("revision after reconnect: got %d, want 2", c.Revision)
		}
		if st := e.m.Status(); st.Divergence == nil || !st.Divergence.OnReconnect ||
			fmt.Sprint(st.Divergence.Changes.Strings()) != `[assignment backup added: selection="v1" autostart=false]` {
			t.Fatalf("divergence: got %+v", st.Divergence)
		}
		if n := strings.Count(e.logs.String(), "lost the mesh database"); n != 1 {
			t.Fatalf("loss log lines: got %d, want 1", n)
		}
	})
}

func TestManagerRetriesWhenDatabaseDownAtStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newManagerEnv(t, true, 0)
		e.src.down = true
		start := time.Now()
		e.start(t)
		if st := e.m.Status(); st.Source != SourceNone || !strings.Contains(st.Warning, "no bindings") {
			t.Fatalf("status: got %+v, want source none with a warning", st)
		}
		// Retries back off, jittered, from RetryInterval (1s): the start
		// load; one 1s after it; the next 0.5–1s later (backoff.Delay(1));
		// the one after that 1–2s later again.
		loadsAt := func(total time.Duration) int {
			t.Helper()
			time.Sleep(total - time.Since(start))
			synctest.Wait()
			e.src.mu.Lock()
			defer e.src.mu.Unlock()
			return e.src.loads
		}
		if n := loadsAt(1100 * time.Millisecond); n != 2 {
			t.Fatalf("loads after 1.1s: got %d, want 2 (start, 1s)", n)
		}
		if n := loadsAt(2100 * time.Millisecond); n != 3 {
			t.Fatalf("loads after 2.1s: got %d, want 3 (start, 1s, 1.5–2s)", n)
		}
		if n := loadsAt(2450 * time.Millisecond); n != 3 {
			t.Fatalf("loads after 2.45s: got %d, want still 3 (the next waits at least 1s)", n)
		}
		e.src.mu.Lock()
		e.src.down = false // back, without the watcher noticing: the retries find it
		e.src.mu.Unlock()
		loadsAt(4100 * time.Millisecond) // the next retry, at 4s at the latest
		if st := e.m.Status(); st.Source != SourceDB {
			t.Fatalf("source after the next retry: got %q, want db", st.Source)
		}
		if n := strings.Count(e.logs.String(), "from the mesh database at start"); n != 1 {
			t.Fatalf("start log lines: got %d, want 1", n)
		}
	})
}

// A database slow to answer (a loaded machine, a far link) misses the
// start's wait, not the bindings: the first load goes on and its bindings
// apply the moment it ends, with no second load started beside it.
func TestManagerSlowFirstLoadAppliesWhenItEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newManagerEnv(t, true, 0)
		e.src.delay = 5 * time.Second // LoadTimeout is 2s
		start := time.Now()
		e.start(t)
		if d := time.Since(start); d != 2*time.Second {
			t.Fatalf("start took %s, want LoadTimeout (2s)", d)
		}
		st := e.m.Status()
		if st.Source != SourceNone || !strings.Contains(st.LastError, "still loading") {
			t.Fatalf("status at start: got %+v, want source none, last error saying the load goes on", st)
		}
		e.src.set(2, testBindings(2)) // notified while the first load runs
		time.Sleep(2900 * time.Millisecond)
		synctest.Wait()
		if st := e.m.Status(); st.Source != SourceNone {
			t.Fatalf("source 4.9s in: got %q, want none (the load ends at 5s)", st.Source)
		}
		time.Sleep(200 * time.Millisecond)
		synctest.Wait()
		st = e.m.Status()
		if st.Source != SourceDB || st.DB != DBConnected || st.LastError != "" {
			t.Fatalf("status after the first load ended: got %+v, want source db, connected, no error", st)
		}
		e.src.mu.Lock()
		loads := e.src.loads
		e.src.mu.Unlock()
		if loads != 2 {
			t.Fatalf("loads 5.1s in: got %d, want 2 (the first, then one for the change notified while it ran)", loads)
		}
		time.Sleep(100 * time.Millisecond) // the reload of the notified change runs right after
		synctest.Wait()
		if st := e.m.Status(); st.Revision != 2 {
			t.Fatalf("revision after the notified change: got %d, want 2", st.Revision)
		}
	})
}

// A first load that fails after the start stopped waiting is retried.
func TestManagerSlowFirstLoadThatFailsIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newManagerEnv(t, true, 0)
		e.src.delay, e.src.down = 3*time.Second, true
		e.start(t)
		time.Sleep(1100 * time.Millisecond) // the load fails at 3s
		synctest.Wait()
		st := e.m.Status()
		if st.Source != SourceNone || st.LastError != errDown.Error() {
			t.Fatalf("status after the first load failed: got %+v, want source none, last error %q", st, errDown)
		}
		e.src.mu.Lock()
		e.src.down, e.src.delay = false, 0
		e.src.mu.Unlock()
		time.Sleep(1100 * time.Millisecond) // RetryInterval (1s) after the failure
		synctest.Wait()
		if st := e.m.Status(); st.Source != SourceDB {
			t.Fatalf("source after the retry: got %q, want db", st.Source)
		}
	})
}

func TestManagerWithoutDatabase(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newManagerEnv(t, false, 0)
		e.start(t)
		// Standalone by design: no warning (a configured database that
		// cannot be reached is one, TestManagerRetriesWhenDatabaseDownAtStart).
		if st := e.m.Status(); st.Source != SourceNone || st.DB != DBNone || st.Warning != "" {
			t.Fatalf("status: got %+v, want none/none without a warning", st)
		}
		e.m.Close()

		e = newManagerEnv(t, false, 0)
		if err := e.store.Put(NewSnapshot(4, time.Now(), "db", testBindings(4))); err != nil {
			t.Fatal(err)
		}
		e.start(t)
		if st := e.m.Status(); st.Source != SourceCache || st.DB != DBNone || st.Revision != 4 {
			t.Fatalf("status: got %+v, want cache/none revision 4", st)
		}
	})
}

func TestManagerIgnoresCacheOfAnotherNode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newManagerEnv(t, true, 0)
		b := testBindings(2)
		b.Node = "n2"
		if err := e.store.Put(NewSnapshot(2, time.Now(), "db", b)); err != nil {
			t.Fatal(err)
		}
		e.src.down = true
		e.start(t)
		if st := e.m.Status(); st.Source != SourceNone {
			t.Fatalf("status: got %+v, want none (cache belongs to n2)", st)
		}
	})
}

func TestManagerNodeNotRegisteredWarns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newManagerEnv(t, true, 0)
		b := testBindings(1)
		b.Nodes = b.Nodes[1:]
		e.src.b = b
		e.start(t)
		if st := e.m.Status(); !strings.Contains(st.Warning, `node "n1" has no record`) {
			t.Fatalf("warning: got %q, want node not registered", st.Warning)
		}
	})
}

func TestManagerQuarantineVisible(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := t.TempDir() + "/cache.db"
		if err := writeFile(path, []byte("garbage garbage garbage")); err != nil {
			t.Fatal(err)
		}
		store, err := Open(path, StoreOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		reg := prometheus.NewRegistry()
		m, err := NewManager(ManagerConfig{Node: "n1", Store: store, Metrics: reg})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if err := m.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		if st := m.Status(); st.Quarantined == "" {
			t.Fatalf("status quarantined empty, want the moved file")
		}
		if got := metricValue(t, m.metrics.quarantined); got != 1 {
			t.Fatalf("meshbox_cache_quarantined_total: got %v, want 1", got)
		}
	})
}

func TestManagerLifecycle(t *testing.T) {
	store := openStore(t, StoreOptions{})
	if _, err := NewManager(ManagerConfig{Node: "bad node", Store: store}); !errors.Is(err, ErrConfig) {
		t.Fatalf("bad node name: got %v, want ErrConfig", err)
	}
	if _, err := NewManager(ManagerConfig{Node: "n1"}); !errors.Is(err, ErrConfig) {
		t.Fatalf("no store: got %v, want ErrConfig", err)
	}
	m, err := NewManager(ManagerConfig{Node: "n1", Store: store})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("close before start: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if err := m.Start(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("start after close: got %v, want ErrClosed", err)
	}
}

// metricValue reads the single value of a gauge or counter collector.
func metricValue(tb testing.TB, c prometheus.Collector) float64 {
	tb.Helper()
	ch := make(chan prometheus.Metric, 1)
	go func() { c.Collect(ch); close(ch) }()
	var out dto.Metric
	n := 0
	for m := range ch {
		n++
		if err := m.Write(&out); err != nil {
			tb.Fatal(err)
		}
	}
	if n != 1 {
		tb.Fatalf("collector yielded %d metrics, want 1", n)
	}
	switch {
	case out.Gauge != nil:
		return out.Gauge.GetValue()
	case out.Counter != nil:
		return out.Counter.GetValue()
	}
	tb.Fatal("not a gauge or counter")
	return 0
}

// The max-age warning is logged when the bindings pass MaxAge, not when
// somebody next reads the status: the manager sleeps until that moment.
func TestManagerWarnsAtMaxAgeUnread(t *testing.T) {
	for _, withDB := range []bool{false, true} {
		t.Run(fmt.Sprintf("db=%v", withDB), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newManagerEnv(t, withDB, time.Minute)
				if err := e.store.Put(NewSnapshot(3, time.Now(), "db", testBindings(3))); err != nil {
					t.Fatal(err)
				}
				e.src.down = true
				e.start(t)
				warned := func() bool { return strings.Contains(e.logs.String(), "older than the configured maximum age") }
				time.Sleep(time.Minute) // exactly MaxAge: not older yet
				synctest.Wait()
				if warned() {
					t.Fatal("max-age warning logged at exactly the maximum age")
				}
				time.Sleep(time.Millisecond)
				synctest.Wait()
				if !warned() {
					t.Fatalf("no max-age warning just past the maximum age:\n%s", e.logs.String())
				}
				if got := metricValue(t, e.m.metrics.stale); got != 1 {
					t.Fatalf("meshbox_bindings_stale: got %v, want 1", got)
				}
			})
		})
	}
}
