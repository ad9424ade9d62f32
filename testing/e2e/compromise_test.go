package e2e

import (
	"context"
	"encoding/json"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// TestCompromisedNodeRemoved: alpha, beta and gamma write and read a table
// sealed with the mesh's key (jobs) and one sealed with scope vault's
// (secrets, vault held by all three); a scope other is held by alpha and
// beta only. gamma is stopped and its data directory taken (the attacker's
// copy). beta is stopped too; `mesh node remove gamma --compromised`
// revokes gamma's credentials, rotates the mesh's key and vault's (not
// other's) and names beta as lacking the new keys. alpha then seals
// nothing: its writes are refused until beta runs again and holds the new
// keys. Rows written afterwards: the attacker, with gamma's node key and
// every key sealed to it in its bindings cache, opens the rows of both
// logs written before, and none written after; beta reads both (the
// control), and so does the same reader with beta's files. The key history shows the rotation and the revocation;
// bad input is refused.
func TestCompromisedNodeRemoved(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, RabbitMQ and three nodes")
	}
	t.Parallel()
	m := newIdentityMesh(t, "alpha", "beta", "gamma")
	kitFile := filepath.Join(t.TempDir(), "mesh.kit")
	if code, out, errOut := cliEnv(t, m.admin, "mesh", "kit", "--out", kitFile); code != 0 {
		t.Fatalf("mesh kit: exit %d: %s%s", code, out, errOut)
	}
	for _, args := range [][]string{
		{"mesh", "scope", "add", "vault", "--nodes", "alpha,beta,gamma"},
		{"mesh", "scope", "add", "other", "--nodes", "alpha,beta"},
		{"mesh", "table", "add", "jobs"},
		{"mesh", "table", "add", "secrets", "--scope", "vault"},
	} {
		if code, out, errOut := cliEnv(t, m.admin, args...); code != 0 {
			t.Fatalf("%s: exit %d: %s%s", strings.Join(args, " "), code, out, errOut)
		}
	}
	alpha, beta, gamma := m.start(t, "alpha"), m.start(t, "beta"), m.start(t, "gamma")
	procs := []*meshtest.Process{alpha, beta, gamma}
	for _, p := range procs {
		waitKeysInStep(t, p)
	}
	var oldMesh, oldVault, oldOther string
	meshtest.WaitStatus(t, alpha.HTTPURL(), 30*time.Second, "alpha sealing with the keys of vault and other", func(s appliance.Status) bool {
		oldMesh, oldVault, oldOther = s.Keys.Current, s.Keys.Scopes["vault"], s.Keys.Scopes["other"]
		return oldMesh != "" && oldVault != "" && oldOther != ""
	})
	waitRows(t, alpha, 20*time.Second, 0, "", "put", "jobs", "before", "status=written-before")
	waitRows(t, alpha, 20*time.Second, 0, "", "put", "secrets", "before", "pin=written-before")
	for _, p := range procs {
		waitRows(t, p, 30*time.Second, 0, "written-before", "get", "jobs", "before", "--field", "status")
		waitRows(t, p, 30*time.Second, 0, "written-before", "get", "secrets", "before", "--field", "pin")
	}
	gamma.Signal(syscall.SIGTERM)
	gamma.Wait()
	stolen := copyDir(t, m.data["gamma"])

	// Bad input: an unknown node, and the node this machine is.
	code, out, errOut := cliEnv(t, m.admin, "mesh", "node", "remove", "nosuch", "--compromised")
	if code == 0 || !strings.Contains(errOut, `node "nosuch" not found`) || !strings.Contains(errOut, "nothing was changed") {
		t.Errorf("remove --compromised of an unknown node: exit %d: %s%s; want a refusal naming it", code, out, errOut)
	}
	code, out, errOut = cliEnv(t, append(m.admin, "MESHBOX_NODE=gamma"), "mesh", "node", "remove", "gamma", "--compromised")
	if code == 0 || !strings.Contains(errOut, "this machine is configured as node gamma") {
		t.Errorf("remove --compromised on gamma's own machine: exit %d: %s%s; want a refusal", code, out, errOut)
	}
	code, out, errOut = cliEnv(t, m.admin, "mesh", "node", "remove", "gamma", "--retention", "1h")
	if code == 0 || !strings.Contains(errOut, "go with --compromised") {
		t.Errorf("remove --retention without --compromised: exit %d: %s%s; want a refusal", code, out, errOut)
	}
	if _, out, _ := cliEnv(t, m.admin, "mesh", "node", "list"); !strings.Contains(out, "gamma") {
		t.Fatalf("a refused remove removed gamma:\n%s", out)
	}

	// beta is off when gamma is removed: it cannot hold the new keys yet.
	beta.Signal(syscall.SIGTERM)
	beta.Wait()
	start := time.Now()
	code, out, errOut = cliEnv(t, m.admin, "mesh", "node", "remove", "gamma", "--compromised", "--wait", "0")
	t.Logf("remove --compromised took %s:\n%s", time.Since(start).Round(time.Millisecond), out)
	for _, want := range []string{"node gamma: removed as compromised", "broker user of generation 1 deleted",
		"marked compromised", oldMesh, oldVault, "scope vault: new content key", "not yet held by", "beta"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("mesh node remove gamma --compromised: exit %d, want %q in:\n%s%s", code, want, out, errOut)
		}
	}
	if strings.Contains(out, oldOther) || strings.Contains(out, "scope other") {
		t.Errorf("remove --compromised touched scope other, which gamma was not in:\n%s", out)
	}
	if code, out, errOut := cliEnv(t, m.admin, "mesh", "key", "list"); code != 0 || !strings.Contains(out, "(compromised: no node seals with it)") {
		t.Errorf("mesh key list: exit %d: %s%s; want the old key marked compromised", code, out, errOut)
	}
	if gens := m.generations(t, "gamma"); len(gens) != 0 {
		t.Errorf("gamma still has broker users of generations %v", gens)
	}

	// alpha seals nothing while beta lacks the new keys: neither with the
	// compromised keys nor with new ones beta could not open. Its writes
	// are refused, saying why.
	meshtest.WaitStatus(t, alpha.HTTPURL(), 30*time.Second, "alpha sealing nothing with the mesh's key or vault's", func(s appliance.Status) bool {
		return s.Keys.Current == "" && s.Keys.Scopes["vault"] == "" && s.Keys.Scopes["other"] == oldOther
	})
	for _, table := range []string{"jobs", "secrets"} {
		code, out, errOut := rowsCLI(t, alpha, "put", table, "during", "pin=written-during")
		if code == 0 || !strings.Contains(errOut, "no key") || !strings.Contains(errOut, "once it holds the key") {
			t.Errorf("rows put %s on alpha while beta lacks the new key: exit %d: %s%s; want a refusal for want of a key", table, code, out, errOut)
		}
	}
	beta = m.start(t, "beta")

	// Both remaining nodes seal with the new keys (other's stays).
	for _, p := range []*meshtest.Process{alpha, beta} {
		meshtest.WaitStatus(t, p.HTTPURL(), 30*time.Second, p.Node()+" sealing with the new keys", func(s appliance.Status) bool {
			return s.Keys.Current != "" && s.Keys.Current != oldMesh && s.Keys.Scopes["vault"] != "" && s.Keys.Scopes["vault"] != oldVault
		})
		if s := meshtest.Status(t, p.HTTPURL()); s.Keys.Scopes["other"] != oldOther {
			t.Errorf("%s seals scope other with %s, want its key %s unchanged", p.Node(), s.Keys.Scopes["other"], oldOther)
		}
	}
	newMesh := meshtest.Status(t, alpha.HTTPURL()).Keys.Current
	if v, _ := scrape(t, alpha.HTTPURL()).value("meshbox_key_events_total", "kind=rotated"); v != 2 {
		t.Errorf("alpha counted %v rotated key events, want 2 (the mesh's key and vault's)", v)
	}
	if v, _ := scrape(t, alpha.HTTPURL()).value("meshbox_key_events_total", "kind=revoked"); v != 2 {
		t.Errorf("alpha counted %v revoked key events, want 2 (the compromised keys it holds)", v)
	}
	for _, line := range []string{"seals nothing with this key's scope", "sealing with a new content key"} {
		if !strings.Contains(alpha.Output(), line) {
			t.Errorf("alpha did not log %q\n%s", line, alpha.Output())
		}
	}
	waitRows(t, alpha, 20*time.Second, 0, "", "put", "jobs", "after", "status=written-after")
	waitRows(t, alpha, 20*time.Second, 0, "", "put", "secrets", "after", "pin=written-after")
	// The control: a current member reads both.
	waitRows(t, beta, 30*time.Second, 0, "written-after", "get", "jobs", "after", "--field", "status")
	waitRows(t, beta, 30*time.Second, 0, "written-after", "get", "secrets", "after", "--field", "pin")

	// The attacker: gamma's files, and every message of both logs.
	logs := readLogs(t, m.vhost, alpha, "jobs", "secrets")
	attacker := ringFrom(t, stolen, "gamma")
	for _, table := range []string{"jobs", "secrets"} {
		opened := openLogs(logs[table], attacker, table)
		if !slices.Contains(opened, "before") {
			t.Errorf("gamma's files open no row of %s written before the removal (%v): the attacker holds nothing; the test proves nothing", table, opened)
		}
		if slices.Contains(opened, "after") {
			t.Errorf("gamma's files open row %q of %s written after its removal as compromised", "after", table)
		}
	}
	// The same reader with a current member's files opens both.
	beta.Signal(syscall.SIGTERM)
	beta.Wait()
	member := ringFrom(t, m.data["beta"], "beta")
	for _, table := range []string{"jobs", "secrets"} {
		if opened := openLogs(logs[table], member, table); !slices.Contains(opened, "after") || !slices.Contains(opened, "before") {
			t.Errorf("beta's files open rows %v of %s, want before and after", opened, table)
		}
	}

	// The new keys are sealed for the recovery kit too.
	mdb, err := meshdb.Open(context.Background(), m.db, meshdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mdb.Close()
	meshtest.WaitFor(t, 30*time.Second, "the new mesh key sealed for the recovery kit", func() bool {
		_, copies, err := mdb.RecoveryKit(context.Background(), "")
		return err == nil && copies[newMesh] != ""
	})

	// The history shows the rotations and the revocations.
	code, out, errOut = cliEnv(t, m.admin, "mesh", "key", "list", "--history")
	t.Logf("history:\n%s", out)
	if code != 0 || !strings.Contains(out, "EVENT") || !strings.Contains(out, "node gamma removed as compromised") {
		t.Errorf("mesh key list --history: exit %d:\n%s%s", code, out, errOut)
	}
	code, out, errOut = cliEnv(t, m.admin, "mesh", "key", "list", "--history", "--json")
	var events []meshdb.KeyEvent
	if err := json.Unmarshal([]byte(out), &events); code != 0 || err != nil {
		t.Fatalf("mesh key list --history --json: exit %d, %v:\n%s%s", code, err, out, errOut)
	}
	has := func(kind, key, holder, detail string) bool {
		return slices.ContainsFunc(events, func(e meshdb.KeyEvent) bool {
			return e.Kind == kind && (key == "*" || e.Key == key) && (holder == "*" || e.Holder == holder) && strings.Contains(e.Detail, detail)
		})
	}
	for _, w := range []struct{ kind, key, holder, detail string }{
		{meshdb.KeyMade, oldMesh, "*", ""},
		{meshdb.KeySealed, oldMesh, "gamma", ""},
		{meshdb.KeySealed, oldMesh, meshdb.KitSealedBy, "recovery kit"},
		{meshdb.KeySealed, newMesh, meshdb.KitSealedBy, "recovery kit"},
		{meshdb.KeyRevoked, oldMesh, "gamma", "node gamma removed as compromised"},
		{meshdb.KeyRevoked, oldVault, "gamma", "node gamma removed as compromised"},
		{meshdb.KeyRevoked, "", "gamma", "marked compromised and rotated"},
		{meshdb.KeyRotated, "*", "", "replaces " + oldMesh + "; node gamma removed as compromised"},
		{meshdb.KeyRotated, "*", "", "replaces " + oldVault + "; node gamma removed as compromised"},
	} {
		if !has(w.kind, w.key, w.holder, w.detail) {
			t.Errorf("no %s event of key %q, holder %q, detail %q in the history:\n%s", w.kind, w.key, w.holder, w.detail, out)
		}
	}
	if slices.ContainsFunc(events, func(e meshdb.KeyEvent) bool {
		return e.Kind == meshdb.KeySealed && e.Holder == "gamma" && e.At.After(start)
	}) {
		t.Errorf("a key was sealed for gamma after its removal:\n%s", out)
	}
}

// copyDir copies the regular files under dir into a new directory and
// returns it.
func copyDir(t *testing.T, dir string) string {
	t.Helper()
	to := t.TempDir()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		switch {
		case d.IsDir():
			return os.MkdirAll(filepath.Join(to, rel), 0o700)
		case !d.Type().IsRegular():
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
	return to
}

// ringFrom is what whoever holds a node's data directory dir can open:
// the content keys sealed to its node key (node.key) in every snapshot of
// its bindings cache (cache.db), opened as the node opens them.
func ringFrom(t *testing.T, dir, node string) *seal.Keyring {
	t.Helper()
	text, err := os.ReadFile(filepath.Join(dir, "node.key"))
	if err != nil {
		t.Fatal(err)
	}
	nk, err := seal.ParseNodeKey(text)
	if err != nil {
		t.Fatal(err)
	}
	st, err := cache.Open(filepath.Join(dir, "cache.db"), cache.StoreOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	metas, err := st.History()
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]seal.ContentKey{}
	for _, meta := range metas {
		snap, err := st.Get(meta.Revision)
		if err != nil {
			t.Fatal(err)
		}
		for _, sk := range snap.Bindings.SealedKeys {
			raw, err := nk.Open(seal.ContentKeyInfo(sk.ID, node), sk.Sealed)
			if err != nil {
				continue
			}
			if k, err := seal.ContentKeyFrom(sk.ID, raw); err == nil {
				keys[sk.ID] = k
			}
		}
	}
	if len(keys) == 0 {
		t.Fatalf("no content key opens from %s's files", node)
	}
	ring, err := seal.NewKeyring(slices.Collect(maps.Values(keys)), "")
	if err != nil {
		t.Fatal(err)
	}
	return ring
}

// logMessage is one message of a table's log as the broker holds it.
type logMessage struct {
	key  string
	body []byte
}

// readLogs reads, with the broker's admin credential, every message of
// each table's log up to the end that p, which wrote last, published.
func readLogs(t *testing.T, vhostURL string, p *meshtest.Process, tables ...string) map[string][]logMessage {
	t.Helper()
	conn := meshtest.Dial(t, vhostURL)
	out := map[string][]logMessage{}
	for _, table := range tables {
		ts := waitTable(t, p, table, 30*time.Second, "every write on the broker", func(ts rows.TableStatus) bool { return ts.Pending == 0 && ts.Behind == 0 })
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Qos(100, 0, false); err != nil {
			t.Fatal(err)
		}
		ds, err := ch.Consume(rows.QueueOf(table), "", false, false, false, false, amqp.Table{"x-stream-offset": "first"})
		if err != nil {
			t.Fatalf("consume %s: %v", rows.QueueOf(table), err)
		}
		timeout := time.After(15 * time.Second)
		for done := false; !done; {
			select {
			case d := <-ds:
				key, _ := d.Headers[wire.HeaderKey].(string)
				out[table] = append(out[table], logMessage{key: key, body: d.Body})
				_ = d.Ack(false)
				if off, _ := d.Headers["x-stream-offset"].(int64); uint64(off)+1 >= ts.Offset {
					done = true
				}
			case <-timeout:
				t.Fatalf("%d messages of %s read in 15s, want up to offset %d", len(out[table]), rows.QueueOf(table), ts.Offset-1)
			}
		}
		_ = ch.Close()
	}
	return out
}

// openLogs returns the rows the messages of table's log that ring opens
// change.
func openLogs(msgs []logMessage, ring *seal.Keyring, table string) []string {
	var ids []string
	for _, m := range msgs {
		if got, err := rows.OpenLog(ring, table, m.key, m.body); err == nil {
			ids = append(ids, got...)
		}
	}
	return ids
}
