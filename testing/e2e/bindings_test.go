package e2e

import (
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// mesh runs `meshbox mesh ARGS` against the database at dbURL.
func mesh(t *testing.T, dbURL string, args ...string) string {
	t.Helper()
	code, out, errOut := cliEnv(t, []string{"MESHBOX_DB=" + dbURL}, append([]string{"mesh"}, args...)...)
	if code != 0 {
		t.Fatalf("meshbox mesh %v: exit %d: %s", args, code, errOut)
	}
	return out
}

func TestBindingsFromDatabaseFollowChanges(t *testing.T) {
	pg := meshtest.Postgres(t)
	db := pg.Database(t)
	code, out, errOut := cli(t, "init", "--db", db, "--node", "alpha", "--broker", "amqp://127.0.0.1:5672/")
	if code != 0 {
		t.Fatalf("init: exit %d\n%s%s", code, out, errOut)
	}
	// Safe to run twice.
	if code, _, errOut := cli(t, "init", "--db", db, "--node", "alpha", "--broker", "amqp://127.0.0.1:5672/"); code != 0 {
		t.Fatalf("second init: exit %d: %s", code, errOut)
	}

	p := meshtest.StartProcess(t, "--node", "alpha", "--db", db)
	waitKeysInStep(t, p) // its first start's own changes (public key, content key) are in
	st := meshtest.Status(t, p.HTTPURL())
	if st.Bindings.Source != "db" || st.Bindings.Revision == 0 || st.Bindings.AgeSeconds != 0 || st.Bindings.DB != "connected" {
		t.Fatalf("bindings: got %+v, want source db, a revision, age 0, db connected", st.Bindings)
	}

	// A setting changed with the admin command reaches the running node
	// within a second.
	before := st.Bindings.Revision
	start := time.Now()
	mesh(t, db, "setting", "set", "forge.url", "https://forge.example.org")
	st = meshtest.WaitStatus(t, p.HTTPURL(), 2*time.Second, "the new revision", func(s appliance.Status) bool { return s.Bindings.Revision > before })
	if d := time.Since(start); d > time.Second+300*time.Millisecond { // the CLI's own start-up included
		t.Errorf("change applied after %s, want within about 1s", d)
	}
	if st.Bindings.Divergence == nil || !hasChange(st, "setting", "added", "forge.url") {
		t.Errorf("divergence: got %+v, want setting forge.url added", st.Bindings.Divergence)
	}
}

func hasChange(st appliance.Status, kind, op, key string) bool {
	if st.Bindings.Divergence == nil {
		return false
	}
	for _, c := range st.Bindings.Divergence.Changes {
		if c.Kind == kind && c.Op == op && strings.Contains(c.Key, key) {
			return true
		}
	}
	return false
}

func TestBindingsFromCacheWhileDatabaseIsAway(t *testing.T) {
	pg := meshtest.NewPostgres(t) // private: this test stops it
	db := pg.Database(t)
	if code, _, errOut := cli(t, "init", "--db", db, "--node", "alpha", "--broker", "amqp://127.0.0.1:5672/"); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	mesh(t, db, "node", "add", "beta", "--record-only")
	mesh(t, db, "assign", "alpha", "lights", "--selection", "v1")

	// The node reaches the database through a proxy, so the test can keep it
	// disconnected while the database itself is up.
	upstream := "127.0.0.1:" + strconv.Itoa(pg.Port())
	px := meshtest.NewProxy(t, upstream)
	viaProxy := px.Rewrite(db, upstream)
	data := t.TempDir()

	p := meshtest.StartProcess(t, "--node", "alpha", "--db", viaProxy, "--data", data)
	// Its first start publishes its public key and makes the mesh's content
	// key: settled before the bindings are cached for good.
	waitKeysInStep(t, p)
	// Its keys bump the mesh's revision more than once: the node runs the
	// database's last one before it stops.
	var st appliance.Status
	meshtest.WaitFor(t, 10*time.Second, "the node on the database's last revision", func() bool {
		st = meshtest.Status(t, p.HTTPURL())
		return strconv.FormatInt(st.Bindings.Revision, 10) == strings.TrimSpace(mesh(t, db, "revision"))
	})
	if st.Bindings.Source != "db" {
		t.Fatalf("first start: source %q, want db", st.Bindings.Source)
	}
	rev := st.Bindings.Revision
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}

	// Database gone: the node starts from its cache, quickly, and says so.
	pg.Stop(t)
	start := time.Now()
	p = meshtest.StartProcess(t, "--node", "alpha", "--db", viaProxy, "--data", data)
	if d := time.Since(start); d > 2*time.Second+500*time.Millisecond {
		t.Errorf("ready from cache after %s, want within about 2s", d)
	}
	st = meshtest.Status(t, p.HTTPURL())
	if st.Bindings.Source != "cache" || st.Bindings.Revision != rev || st.Bindings.DB != "disconnected" {
		t.Fatalf("on cache: got %+v, want source cache, revision %d, db disconnected", st.Bindings, rev)
	}
	age1 := st.Bindings.AgeSeconds
	if age1 <= 0 {
		t.Errorf("age_seconds on cache: got %v, want > 0", age1)
	}
	time.Sleep(10 * time.Millisecond) // real time passing is the thing under test: the age grows with it
	if age2 := meshtest.Status(t, p.HTTPURL()).Bindings.AgeSeconds; age2 <= age1 {
		t.Errorf("age_seconds: got %v then %v, want it growing", age1, age2)
	}

	// The database comes back but the node cannot reach it yet; bindings
	// change meanwhile (and their NOTIFY goes to nobody).
	px.Cut(t)
	pg.Start(t)
	mesh(t, db, "setting", "set", "forge.url", "https://forge.example.org")
	mesh(t, db, "unassign", "alpha", "lights")
	mesh(t, db, "node", "remove", "beta")
	time.Sleep(300 * time.Millisecond) // room for a wrong apply: its absence cannot be signalled
	if st := meshtest.Status(t, p.HTTPURL()); st.Bindings.Source != "cache" {
		t.Fatalf("before the link returns: source %q, want cache", st.Bindings.Source)
	}

	// The link returns: the node reports exactly what changed and applies it.
	px.Restore(t)
	st = meshtest.WaitStatus(t, p.HTTPURL(), 20*time.Second, "reconnect to the database", func(s appliance.Status) bool {
		return s.Bindings.Source == "db" && s.Bindings.Revision > rev
	})
	want := []struct{ kind, op, key string }{
		{"setting", "added", "forge.url"},
		{"assignment", "removed", "lights"},
		{"node", "removed", "beta"},
	}
	for _, w := range want {
		if !hasChange(st, w.kind, w.op, w.key) {
			t.Errorf("divergence: missing %s %s %s in %+v", w.kind, w.op, w.key, st.Bindings.Divergence)
		}
	}
	if n := len(st.Bindings.Divergence.Changes); n != len(want) {
		t.Errorf("divergence: got %d changes, want exactly %d: %+v", n, len(want), st.Bindings.Divergence.Changes)
	}
	if st.Bindings.AgeSeconds != 0 {
		t.Errorf("age_seconds after reconnect: got %v, want 0", st.Bindings.AgeSeconds)
	}
	// The status shows the change as it is applied; its log line reaches
	// the test through the process's output pipe a moment later.
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(p.Output(), "forge.url") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(p.Output(), "forge.url") {
		t.Errorf("log: want the divergence (forge.url) logged, got\n%s", p.Output())
	}
}
