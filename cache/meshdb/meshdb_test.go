package meshdb_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/testio"
)

func TestMain(m *testing.M) {
	code := meshtest.Main(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

const broker = "amqp://127.0.0.1:5672/"

// openDB opens url with short bounds and closes it in Cleanup.
func openDB(tb testing.TB, url string) *meshdb.DB {
	tb.Helper()
	// The default connect timeout: a second was too short for a new
	// backend on a busy 2-core machine (a test's init failed so once).
	db, err := meshdb.Open(context.Background(), url, meshdb.Options{
		ConnectTimeout: meshdb.DefaultConnectTimeout, StatementTimeout: 5 * time.Second,
		RetryInterval: 50 * time.Millisecond, MaxRetryInterval: 200 * time.Millisecond,
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	return db
}

// initMesh opens a fresh database with a mesh whose first node is n1.
func initMesh(tb testing.TB) (*meshdb.DB, string) {
	tb.Helper()
	url := meshtest.Postgres(tb).Database(tb)
	db := openDB(tb, url)
	if _, err := db.Init(context.Background(), meshdb.InitOptions{Node: "n1", BrokerURL: broker}); err != nil {
		tb.Fatal(err)
	}
	return db, url
}

func revision(tb testing.TB, db *meshdb.DB) int64 {
	tb.Helper()
	rev, err := db.Revision(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	return rev
}

// must returns a function failing tb on an operation's error.
func must(tb testing.TB) func(meshdb.Change, error) meshdb.Change {
	return func(c meshdb.Change, err error) meshdb.Change {
		tb.Helper()
		if err != nil {
			tb.Fatal(err)
		}
		return c
	}
}

func TestInitTwiceAndRefusesAnotherMesh(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, meshtest.Postgres(t).Database(t))

	if _, err := db.Load(ctx, "n1"); !errors.Is(err, meshdb.ErrNotInitialized) {
		t.Fatalf("load before init: got %v, want meshdb.ErrNotInitialized", err)
	}
	var out bytes.Buffer
	res, err := db.Init(ctx, meshdb.InitOptions{Node: "n1", BrokerURL: "amqp://u@b1:5672/", PublicName: "n1.example.org", Progress: &out})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Created || !res.Changed || res.SchemaFrom != 0 || res.SchemaTo != meshdb.SchemaVersion() || res.Revision != 1 {
		t.Fatalf("first init: got %+v, want created, changed, schema 0 -> %d, revision 1", res, meshdb.SchemaVersion())
	}
	for _, want := range []string{"connecting to", "applying migrations", "migration 1", `adding node "n1"`, "setting broker.url = amqp://u@b1:5672/", "mesh ready at revision 1"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("init output lacks %q:\n%s", want, out.String())
		}
	}
	// broker.url holds no password: init and set refuse one, and say why
	// without repeating it.
	for _, err := range []error{
		func() error {
			_, err := db.Init(ctx, meshdb.InitOptions{Node: "n1", BrokerURL: "amqp://u:topsecret@b1:5672/"})
			return err
		}(),
		func() error {
			_, err := db.SetSetting(ctx, meshdb.SettingBrokerURL, "amqp://u:topsecret@b1:5672/")
			return err
		}(),
	} {
		if err == nil || !strings.Contains(err.Error(), "holds a password") || strings.Contains(err.Error(), "topsecret") {
			t.Fatalf("broker URL with a password: got %v, want a refusal that does not repeat it", err)
		}
	}

	out.Reset()
	res, err = db.Init(ctx, meshdb.InitOptions{Node: "n1", BrokerURL: "amqp://u@b1:5672/", Progress: &out})
	if err != nil {
		t.Fatalf("second init: %v", err)
	}
	if res.Created || res.Changed || res.SchemaFrom != res.SchemaTo || res.Revision != 1 {
		t.Fatalf("second init: got %+v, want nothing changed at revision 1", res)
	}
	if !strings.Contains(out.String(), "nothing changed") {
		t.Fatalf("second init output: %s", out.String())
	}

	for _, o := range []meshdb.InitOptions{
		{Node: "n1", BrokerURL: "amqp://u@b2:5672/"},
		{Node: "other", BrokerURL: "amqp://u@b1:5672/"},
	} {
		_, err = db.Init(ctx, o)
		var me *meshdb.MeshExistsError
		if !errors.As(err, &me) || me.FirstNode != "n1" || strings.Contains(err.Error(), "topsecret") {
			t.Fatalf("init of another mesh %+v: got %v, want *meshdb.MeshExistsError naming n1 without the password", o, err)
		}
	}
	if rev := revision(t, db); rev != 1 {
		t.Fatalf("revision after refused inits: got %d, want 1", rev)
	}
	if v, _ := db.Setting(ctx, meshdb.SettingBrokerURL); v != "amqp://u@b1:5672/" {
		t.Fatalf("broker.url after refused init changed to %s", cache.RedactURL(v))
	}

	res, err = db.Init(ctx, meshdb.InitOptions{Node: "n1", BrokerURL: "amqp://u@b2:5672/", Force: true})
	if err != nil || !res.Changed || res.Revision != 2 {
		t.Fatalf("forced init: got %+v, %v; want changed at revision 2", res, err)
	}

	// Bad input is refused before anything happens.
	for _, o := range []meshdb.InitOptions{
		{Node: "bad.name", BrokerURL: broker},
		{Node: "n1", BrokerURL: "http://x/"},
		{Node: "", BrokerURL: broker},
	} {
		if _, err := db.Init(ctx, o); !errors.Is(err, cache.ErrInvalidName) {
			t.Fatalf("init %+v: got %v, want ErrInvalidName", o, err)
		}
	}
}

func TestAdminOperationsBumpRevisionOnce(t *testing.T) {
	ctx := context.Background()
	db, _ := initMesh(t)
	rev := revision(t, db)
	step := func(name string, c meshdb.Change, err error, wantChanged bool) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want := rev
		if wantChanged {
			want++
		}
		if c.Revision != want || c.Changed != wantChanged || revision(t, db) != want {
			t.Fatalf("%s: got %+v (db %d), want revision %d changed %t", name, c, revision(t, db), want, wantChanged)
		}
		rev = want
	}
	refused := func(name string, err error, target error) {
		t.Helper()
		if !errors.Is(err, target) {
			t.Fatalf("%s: got %v, want %v", name, err, target)
		}
		if got := revision(t, db); got != rev {
			t.Fatalf("%s changed the revision: got %d, want %d", name, got, rev)
		}
	}

	c, err := db.AddNode(ctx, cache.NodeRecord{Name: "n2", PublicName: "n2.example.org", Identity: "ed25519:abc"})
	step("add node", c, err, true)
	_, err = db.AddNode(ctx, cache.NodeRecord{Name: "n2"})
	refused("add existing node", err, meshdb.ErrExists)
	_, err = db.AddNode(ctx, cache.NodeRecord{Name: "n 3"})
	refused("add bad node name", err, cache.ErrInvalidName)

	c, err = db.Assign(ctx, "n2", cache.Assignment{Module: "photos", Selection: "main", Autostart: true})
	step("assign", c, err, true)
	c, err = db.Assign(ctx, "n2", cache.Assignment{Module: "photos", Selection: "main", Autostart: true})
	step("assign again, same", c, err, false)
	c, err = db.Assign(ctx, "n2", cache.Assignment{Module: "photos", Selection: "v2", Autostart: true})
	step("reassign", c, err, true)
	_, err = db.Assign(ctx, "ghost", cache.Assignment{Module: "photos"})
	refused("assign to missing node", err, meshdb.ErrNotFound)

	c, err = db.SetOverride(ctx, "n2", cache.Override{Module: "photos", Key: "threads", Value: "4"})
	step("set override", c, err, true)
	_, err = db.SetOverride(ctx, "n2", cache.Override{Module: "photos", Key: "bad key", Value: "4"})
	refused("bad override key", err, cache.ErrInvalidName)

	c, err = db.SetSetting(ctx, "forge.url", "https://forge.example.org")
	step("set setting", c, err, true)
	_, err = db.SetSetting(ctx, "forge.url", "not a url")
	refused("bad url setting", err, cache.ErrInvalidName)
	_, err = db.SetSetting(ctx, "Forge.URL", "https://x")
	refused("upper-case key", err, cache.ErrInvalidName)
	_, err = db.SetSetting(ctx, meshdb.SettingBrokerURL, "http://broker")
	refused("bad broker url", err, cache.ErrInvalidName)
	_, err = db.UnsetSetting(ctx, meshdb.SettingBrokerURL)
	refused("unset broker.url", err, meshdb.ErrRequired)
	_, err = db.UnsetSetting(ctx, "missing.key")
	refused("unset missing setting", err, meshdb.ErrNotFound)

	withKey(t, db, "n2") // bumps the revision: a node record changed
	rev = revision(t, db)
	c, err = db.Grant(ctx, cache.Grant{Consumer: "n2", Resource: "bucket", Provider: "n1", Credential: "s3cr3t"})
	step("grant", c, err, true)
	c, err = db.Grant(ctx, cache.Grant{Consumer: "n2", Resource: "bucket", Provider: "n1", Credential: "rotated"})
	step("rotate credential", c, err, true)
	_, err = db.Grant(ctx, cache.Grant{Consumer: "ghost", Resource: "bucket", Provider: "n1"})
	refused("grant to missing node", err, meshdb.ErrNotFound)

	_, err = db.RemoveNode(ctx, "n2", false)
	var inUse *meshdb.InUseError
	if !errors.As(err, &inUse) || inUse.Assignments != 1 || inUse.Overrides != 1 || inUse.Grants != 1 {
		t.Fatalf("remove node in use: got %v, want *meshdb.InUseError with 1/1/1", err)
	}
	refused("remove node in use", err, meshdb.ErrInUse)

	c, err = db.Revoke(ctx, "n2", "bucket", "n1")
	step("revoke", c, err, true)
	_, err = db.Revoke(ctx, "n2", "bucket", "n1")
	refused("revoke again", err, meshdb.ErrNotFound)
	c, err = db.UnsetOverride(ctx, "n2", "photos", "threads")
	step("unset override", c, err, true)
	c, err = db.Unassign(ctx, "n2", "photos")
	step("unassign", c, err, true)
	c, err = db.UnsetSetting(ctx, "forge.url")
	step("unset setting", c, err, true)
	c, err = db.SetOverride(ctx, "n2", cache.Override{Module: "m", Key: "k", Value: "v"})
	step("set override before forced remove", c, err, true)
	c, err = db.RemoveNode(ctx, "n2", true)
	step("forced remove (node and its override in one transaction)", c, err, true)
	if ov, _ := db.Overrides(ctx, "n2"); len(ov) != 0 {
		t.Fatalf("overrides of removed node: got %v, want none", ov)
	}
	_, err = db.RemoveNode(ctx, "n2", false)
	refused("remove missing node", err, meshdb.ErrNotFound)
}

func TestLoadReadsOnlyOwnRowsAndCacheHoldsNoOtherGrants(t *testing.T) {
	ctx := context.Background()
	db, url := initMesh(t)
	must(t)(db.AddNode(ctx, cache.NodeRecord{Name: "n2"}))
	must(t)(db.SetSetting(ctx, "forge.url", "https://forge"))
	keys := map[string]*seal.NodeKey{}
	for _, node := range []string{"n1", "n2"} {
		keys[node] = withKey(t, db, node)
		must(t)(db.Assign(ctx, node, cache.Assignment{Module: "mod-" + node}))
		must(t)(db.SetOverride(ctx, node, cache.Override{Module: "mod-" + node, Key: "k", Value: "value-of-" + node}))
		must(t)(db.Grant(ctx, cache.Grant{Consumer: node, Resource: "res-" + node, Provider: "p", Credential: cache.Credential("CRED-OF-" + node)}))
	}
	snap, err := db.Load(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	b := snap.Bindings
	if len(b.Nodes) != 2 || b.Settings["forge.url"] != "https://forge" || b.Settings[meshdb.SettingBrokerURL] != broker {
		t.Fatalf("load: nodes %v settings %d, want both nodes and all settings", b.Nodes, len(b.Settings))
	}
	if len(b.Assignments) != 1 || b.Assignments[0].Module != "mod-n1" ||
		len(b.Overrides) != 1 || b.Overrides[0].Value != "value-of-n1" ||
		len(b.Grants) != 1 || openGrant(t, keys["n1"], b.Grants[0]) != "CRED-OF-n1" {
		t.Fatalf("load: got assignments %v overrides %v grants %v, want only n1's", b.Assignments, b.Overrides, b.Grants)
	}
	if snap.Revision != revision(t, db) || snap.Hash != b.Hash() || strings.Contains(snap.Source, "guest") && strings.Contains(snap.Source, ":guest@") {
		t.Fatalf("snapshot: revision %d hash ok %t source %q", snap.Revision, snap.Hash == b.Hash(), snap.Source)
	}

	// Through the Manager into the cache file, then read the file itself.
	path := filepath.Join(t.TempDir(), "cache.db")
	store, err := cache.Open(path, cache.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := cache.NewManager(cache.ManagerConfig{Node: "n1", Store: store, Source: openDB(t, url)})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	m.Close()
	store.Close()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(raw, []byte("res-n1")) {
		t.Fatal("cache file lacks this node's grant")
	}
	if bytes.Contains(raw, []byte("CRED-OF-n1")) {
		t.Fatal("cache file holds this node's grant credential in the clear, not only sealed")
	}
	for _, other := range []string{"CRED-OF-n2", "res-n2", "value-of-n2", "mod-n2"} {
		if bytes.Contains(raw, []byte(other)) {
			t.Fatalf("cache file holds another node's row: %q", other)
		}
	}
	ro, err := cache.Open(path, cache.StoreOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	cached, err := ro.Latest()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range cached.Bindings.Grants {
		if g.Consumer != "n1" {
			t.Fatalf("cached grant of consumer %q, want only n1", g.Consumer)
		}
	}
}

// proxy forwards loopback TCP to a target and can cut the link, so a node
// stays disconnected while the database itself runs.
type proxy struct {
	target string
	addr   string

	mu    sync.Mutex
	ln    net.Listener
	conns []net.Conn
	wg    sync.WaitGroup
}

func newProxy(tb testing.TB, target string) *proxy {
	tb.Helper()
	p := &proxy{target: target}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	tb.Cleanup(func() { p.cut(); p.wg.Wait() })
	return p
}

func (p *proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Add(1)
	go func() { // exits when cut closes the listener
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); io.Copy(up, c); up.Close() }() // exits when either side closes
			go func() { defer p.wg.Done(); io.Copy(c, up); c.Close() }()  // exits when either side closes
		}
	}()
}

// cut refuses new connections and breaks the open ones.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// restore accepts connections again on the same address.
func (p *proxy) restore(tb testing.TB) {
	tb.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		tb.Fatal(err)
	}
	p.serve(ln)
}

// viaProxy rewrites a database URL to go through p.
func viaProxy(url string, pg *meshtest.PG, p *proxy) string {
	return strings.Replace(url, net.JoinHostPort("127.0.0.1", fmtInt(pg.Port())), p.addr, 1)
}

func fmtInt(n int) string { return strconv.Itoa(n) }

type managerUnderTest struct {
	m       *cache.Manager
	store   *cache.Store
	src     *observedSource
	changes chan cache.Divergence
	logs    *testio.Buffer
}

// observedSource is the mesh database as the manager sees it, with the
// states a test waits on: Watch's changed calls (the first one of each
// connection says LISTEN is in place) and the loads finished.
type observedSource struct {
	cache.Source
	changed chan struct{} // a value per changed call, dropped when full

	mu     sync.Mutex
	loads  int
	loaded chan struct{} // buffered(1): a load finished
}

func newObservedSource(src cache.Source) *observedSource {
	return &observedSource{Source: src, changed: make(chan struct{}, 64), loaded: make(chan struct{}, 1)}
}

func (o *observedSource) Load(ctx context.Context, node string) (cache.Snapshot, error) {
	snap, err := o.Source.Load(ctx, node)
	o.mu.Lock()
	o.loads++
	o.mu.Unlock()
	select {
	case o.loaded <- struct{}{}:
	default:
	}
	return snap, err
}

func (o *observedSource) Watch(ctx context.Context, changed func(), lost func(error)) error {
	return o.Source.Watch(ctx, func() {
		select {
		case o.changed <- struct{}{}:
		default:
		}
		changed()
	}, lost)
}

func (o *observedSource) loadCount() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.loads
}

// waitListening waits until the watcher's LISTEN is in place (its first
// changed call).
func (mt *managerUnderTest) waitListening(tb testing.TB, d time.Duration) {
	tb.Helper()
	select {
	case <-mt.src.changed:
	case <-time.After(d):
		tb.Fatalf("LISTEN not in place within %v; status %+v", d, mt.m.Status())
	}
}

// waitLoads waits until n loads have finished in all.
func (mt *managerUnderTest) waitLoads(tb testing.TB, n int, d time.Duration) {
	tb.Helper()
	timeout := time.After(d)
	for mt.src.loadCount() < n {
		select {
		case <-mt.src.loaded:
		case <-timeout:
			tb.Fatalf("%d loads within %v, want %d", mt.src.loadCount(), d, n)
		}
	}
}

// startManager starts a manager for n1 on the cache at path, reading url.
func startManager(tb testing.TB, path, url string) *managerUnderTest {
	tb.Helper()
	store, err := cache.Open(path, cache.StoreOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	logs := &testio.Buffer{}
	src := newObservedSource(openDB(tb, url))
	m, err := cache.NewManager(cache.ManagerConfig{
		Node: "n1", Store: store, Source: src,
		RetryInterval: 50 * time.Millisecond, MaxRetryInterval: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
	})
	if err != nil {
		tb.Fatal(err)
	}
	mt := &managerUnderTest{m: m, store: store, src: src, changes: make(chan cache.Divergence, 16), logs: logs}
	m.OnChange(func(_ cache.Snapshot, d cache.Divergence) { mt.changes <- d })
	if err := m.Start(context.Background()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { m.Close(); store.Close() })
	return mt
}

func (mt *managerUnderTest) close() { mt.m.Close(); mt.store.Close() }

func (mt *managerUnderTest) waitChange(tb testing.TB, d time.Duration) cache.Divergence {
	tb.Helper()
	select {
	case c := <-mt.changes:
		return c
	case <-time.After(d):
		tb.Fatalf("no change applied within %v; status %+v\n%s", d, mt.m.Status(), mt.logs.String())
		return nil
	}
}

func TestNotifyAppliedWithinOneSecond(t *testing.T) {
	ctx := context.Background()
	db, url := initMesh(t)
	mt := startManager(t, filepath.Join(t.TempDir(), "cache.db"), url)
	if st := mt.m.Status(); st.Source != cache.SourceDB || st.DB != cache.DBConnected || st.Revision != 1 {
		t.Fatalf("status: got %+v, want db, connected, revision 1", st)
	}
	mt.waitListening(t, 5*time.Second)
	for i, newBroker := range []string{"amqp://127.0.0.1:5673/", "amqp://127.0.0.1:5674/"} {
		start := time.Now()
		c := must(t)(db.SetSetting(ctx, meshdb.SettingBrokerURL, newBroker))
		d := mt.waitChange(t, time.Second)
		t.Logf("change %d applied in %v", i, time.Since(start))
		if len(d) != 1 || d[0].Kind != cache.KindSetting || d[0].Key != meshdb.SettingBrokerURL {
			t.Fatalf("divergence: got %v, want broker.url changed", d.Strings())
		}
		cur, _ := mt.m.Current()
		if cur.Revision != c.Revision || cur.Bindings.Settings[meshdb.SettingBrokerURL] != newBroker {
			t.Fatalf("current: revision %d broker %s, want %d %s", cur.Revision, cur.Bindings.Settings[meshdb.SettingBrokerURL], c.Revision, newBroker)
		}
	}
	// A change to another node's rows moves the revision but not our content.
	c := must(t)(db.AddNode(ctx, cache.NodeRecord{Name: "n2"}))
	mt.waitChange(t, time.Second) // the node list is ours too
	c = must(t)(db.Assign(ctx, "n2", cache.Assignment{Module: "x"}))
	timeout := time.After(time.Second)
	for cur, _ := mt.m.Current(); cur.Revision != c.Revision; cur, _ = mt.m.Current() {
		select {
		case <-mt.src.loaded: // the notification's load; the revision is recorded just after it
		case <-time.After(10 * time.Millisecond):
		case <-timeout:
			t.Fatal("revision of another node's change not followed within 1s")
		}
	}
	select {
	case d := <-mt.changes:
		t.Fatalf("OnChange for another node's assignment: %v", d.Strings())
	default:
	}
}

func TestOutageStartFromCacheDivergenceAndMissedNotify(t *testing.T) {
	ctx := context.Background()
	pg := meshtest.NewPostgres(t)
	url := pg.Database(t)
	db := openDB(t, url)
	if _, err := db.Init(ctx, meshdb.InitOptions{Node: "n1", BrokerURL: broker}); err != nil {
		t.Fatal(err)
	}
	must(t)(db.SetOverride(ctx, "n1", cache.Override{Module: "photos", Key: "threads", Value: "4"}))
	withKey(t, db, "n1")
	must(t)(db.Grant(ctx, cache.Grant{Consumer: "n1", Resource: "bucket", Provider: "n2", Credential: "c1"}))
	path := filepath.Join(t.TempDir(), "cache.db")
	px := newProxy(t, net.JoinHostPort("127.0.0.1", fmtInt(pg.Port())))
	purl := viaProxy(url, pg, px)

	// A node runs, caches revision r1, stops.
	mt := startManager(t, path, purl)
	r1 := mt.m.Status().Revision
	mt.close()

	// The database stops; the node restarts from cache within 2s.
	pg.Stop(t)
	start := time.Now()
	mt = startManager(t, path, purl)
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("start with the database down took %v, want < 2s", took)
	}
	st := mt.m.Status()
	if st.Source != cache.SourceCache || st.DB != cache.DBDisconnected || st.Revision != r1 || st.AgeSeconds <= 0 {
		t.Fatalf("status on cache: got %+v, want cache, disconnected, revision %d, age > 0", st, r1)
	}
	time.Sleep(10 * time.Millisecond) // real time passing is the thing under test: the age grows with it
	if st2 := mt.m.Status(); st2.AgeSeconds <= st.AgeSeconds {
		t.Fatalf("age not growing: %v then %v", st.AgeSeconds, st2.AgeSeconds)
	}

	// The database returns, but the node's link stays cut; bindings change
	// meanwhile (their NOTIFY is lost to the node).
	px.cut()
	pg.Start(t)
	db = openDB(t, url) // the old pool's connections died with the server
	must(t)(db.SetSetting(ctx, "forge.url", "https://forge.example.org"))
	must(t)(db.SetOverride(ctx, "n1", cache.Override{Module: "photos", Key: "threads", Value: "8"}))
	must(t)(db.Revoke(ctx, "n1", "bucket", "n2"))
	c := must(t)(db.AddNode(ctx, cache.NodeRecord{Name: "n3"}))
	// Two more retries: at least one started after the changes, and all
	// failed on the cut link.
	mt.waitLoads(t, mt.src.loadCount()+2, 5*time.Second)
	if st := mt.m.Status(); st.Source != cache.SourceCache || st.Revision != r1 {
		t.Fatalf("status while the link is cut: got %+v, want still cache at %d", st, r1)
	}

	px.restore(t)
	d := mt.waitChange(t, 3*time.Second)
	want := []string{
		`node n3 added: public_name="" identity=""`,
		`setting forge.url added: "https://forge.example.org"`,
		`override photos/threads changed: "4" -> "8"`,
		`grant n1:bucket@n2 removed (was credential sealed)`,
	}
	if strings.Join(d.Strings(), "\n") != strings.Join(want, "\n") {
		t.Fatalf("divergence:\ngot  %q\nwant %q", d.Strings(), want)
	}
	st = mt.m.Status()
	if st.Source != cache.SourceDB || st.DB != cache.DBConnected || st.AgeSeconds != 0 || st.Revision != c.Revision {
		t.Fatalf("status after reconnect: got %+v, want db, connected, age 0, revision %d", st, c.Revision)
	}
	if st.Divergence == nil || !st.Divergence.OnReconnect || st.Divergence.FromRevision != r1 || st.Divergence.ToRevision != c.Revision {
		t.Fatalf("status divergence: got %+v", st.Divergence)
	}
	logs := mt.logs.String()
	if n := strings.Count(logs, "ahead of the bindings in use"); n != 1 || !strings.Contains(logs, "photos/threads") || strings.Contains(logs, "c1") && strings.Contains(logs, "credential=c1") {
		t.Fatalf("want one divergence log line naming the changes:\n%s", logs)
	}

	// Live again: the next change arrives by NOTIFY.
	must(t)(db.SetSetting(ctx, "forge.url", "https://forge2.example.org"))
	if d := mt.waitChange(t, time.Second); len(d) != 1 || d[0].Key != "forge.url" {
		t.Fatalf("live change after reconnect: got %v", d.Strings())
	}
}

func TestDamagedCacheRebuiltFromDatabase(t *testing.T) {
	_, url := initMesh(t)
	shapes := map[string][]byte{
		"random": bytes.Repeat([]byte{0x5a, 0xa5, 0x13, 0x77}, 4096),
		"empty":  {},
		"text":   []byte("not a database"),
	}
	for name, content := range shapes {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "cache.db")
			if err := os.WriteFile(path, content, 0o600); err != nil {
				t.Fatal(err)
			}
			mt := startManager(t, path, url)
			// On a busy machine the database may answer after the load
			// timeout (1.5 s); the load goes on in the background.
			meshtest.Poll(10*time.Second, func() bool { return mt.m.Status().Source == cache.SourceDB })
			st := mt.m.Status()
			if st.Quarantined == "" || st.Source != cache.SourceDB || st.Revision != 1 {
				t.Fatalf("status: got %+v, want quarantined, rebuilt from db at revision 1", st)
			}
			if snap, err := mt.store.Latest(); err != nil || snap.Revision != 1 {
				t.Fatalf("rebuilt cache: got %d, %v; want revision 1", snap.Revision, err)
			}
		})
	}
	t.Run("database also unreachable", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "cache.db")
		if err := os.WriteFile(path, []byte("garbage"), 0o600); err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dead := "postgres://postgres@" + ln.Addr().String() + "/x?sslmode=disable"
		ln.Close()
		mt := startManager(t, path, dead)
		st := mt.m.Status()
		if st.Quarantined == "" || st.Source != cache.SourceNone || !strings.Contains(st.Warning, "no bindings") {
			t.Fatalf("status: got %+v, want quarantined, none, warning", st)
		}
	})
}
