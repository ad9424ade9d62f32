package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/testing/meshtest"
)

func TestMeshTableCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	url := meshtest.Postgres(t).Database(t)
	c := cli{env: map[string]string{"MESHBOX_DB": url}}
	c.ok(t, "init", "--node", "n1", "--broker", "amqp://127.0.0.1:5672/")
	setting := func(key string) string {
		t.Helper()
		return strings.TrimSpace(c.ok(t, "mesh", "setting", "get", key))
	}

	// On one shared broker credential (no node has a user of its own) no
	// admin is needed: the nodes make the table's log.
	out := c.ok(t, "mesh", "table", "add", "jobs")
	if !strings.Contains(out, "table jobs added, sealed with the mesh's key (mesh revision") || !strings.Contains(out, "stream queue rows.jobs, themselves") {
		t.Errorf("mesh table add jobs:\n%s", out)
	}
	if got := setting("table.jobs"); got != "{}" {
		t.Errorf("setting table.jobs: %q, want {}", got)
	}
	if out := c.ok(t, "mesh", "table", "add", "jobs"); !strings.Contains(out, "already so, nothing changed") {
		t.Errorf("mesh table add jobs again:\n%s", out)
	}
	c.fails(t, `table "Jobs": a table name is`, "mesh", "table", "add", "Jobs")
	c.fails(t, `scope "vault" not found (meshbox mesh scope add vault --nodes A,B makes it)`, "mesh", "table", "add", "secrets", "--scope", "vault")
	c.fails(t, "want 1 arguments (TABLE), got 0", "mesh", "table", "add")

	c.ok(t, "mesh", "scope", "add", "vault", "--nodes", "n1")
	if out := c.ok(t, "mesh", "table", "add", "secrets", "--scope", "vault"); !strings.Contains(out, "table secrets added, sealed with scope vault's key") {
		t.Errorf("mesh table add secrets --scope vault:\n%s", out)
	}
	if got := setting("table.secrets"); got != `{"scope":"vault"}` {
		t.Errorf("setting table.secrets: %q", got)
	}
	c.fails(t, `table "jobs", sealed with the mesh's key, already exists; meshbox mesh table bind jobs --scope S`, "mesh", "table", "add", "jobs", "--scope", "vault")

	// bind, and scope bind --table, which does the same.
	c.fails(t, "--scope is required", "mesh", "table", "bind", "jobs")
	c.fails(t, `table "nothing" not found`, "mesh", "table", "bind", "nothing", "--scope", "vault")
	c.fails(t, `scope "other" not found`, "mesh", "table", "bind", "jobs", "--scope", "other")
	if out := c.ok(t, "mesh", "table", "bind", "jobs", "--scope", "vault"); !strings.Contains(out, "table jobs bound to scope vault") ||
		!strings.Contains(out, "from now on are sealed with scope vault's key") {
		t.Errorf("mesh table bind jobs --scope vault:\n%s", out)
	}
	if got := setting("table.jobs"); got != `{"scope":"vault"}` {
		t.Errorf("setting table.jobs after bind: %q", got)
	}
	if out := c.ok(t, "mesh", "scope", "bind", "vault", "--table", "jobs", "--unbind"); !strings.Contains(out, "table jobs unbound from scope vault") {
		t.Errorf("mesh scope bind vault --table jobs --unbind:\n%s", out)
	}
	if got := setting("table.jobs"); got != "{}" {
		t.Errorf("setting table.jobs after unbind: %q", got)
	}
	c.fails(t, "it is sealed with the mesh's key, not scope vault's", "mesh", "scope", "bind", "vault", "--table", "jobs", "--unbind")
	if out := c.ok(t, "mesh", "scope", "bind", "vault", "--table", "jobs"); !strings.Contains(out, "table jobs bound to scope vault") {
		t.Errorf("mesh scope bind vault --table jobs:\n%s", out)
	}

	// list, with a setting that defines no table.
	c.ok(t, "mesh", "setting", "set", "table.broken", "not json")
	out, errOut, err := c.run(t, "mesh", "table", "list")
	if err != nil || !strings.Contains(out, "jobs     scope vault  rows.jobs") || !strings.Contains(out, "secrets  scope vault  rows.secrets") ||
		strings.Contains(out, "broken") || !strings.Contains(errOut, "setting table.broken") {
		t.Errorf("mesh table list: %v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
	}
	var list []struct{ Table, Scope, Queue string }
	if err := json.Unmarshal([]byte(c.ok(t, "mesh", "table", "list", "--json")), &list); err != nil || len(list) != 2 || list[0].Table != "jobs" || list[0].Queue != "rows.jobs" {
		t.Errorf("mesh table list --json: %+v %v", list, err)
	}

	// A node with a broker user of its own may not make queues: without
	// the admin, a new table is refused and nothing changes.
	db, err := meshdb.Open(context.Background(), url, meshdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.AddNodeIdentity(context.Background(), url, meshdb.NewNode{Record: cache.NodeRecord{Name: "n2"}, TTL: time.Hour,
		Broker: meshdb.BrokerCredential{Generation: 1, User: "node.n2.g1", Password: "not-a-real-one"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.RemoveNode(context.Background(), "n2", true) })
	rev := c.ok(t, "mesh", "revision")
	c.fails(t, "--broker-admin is required (or set MESHBOX_BROKER_ADMIN): the mesh's nodes log in to the broker as users of their own, which may not make queues, so the table's log, stream queue rows.photos, must be made with --broker-admin",
		"mesh", "table", "add", "photos")
	if got := c.ok(t, "mesh", "revision"); got != rev {
		t.Errorf("a refused table add changed the mesh: revision %s, then %s", rev, got)
	}
	c.fails(t, "scheme must be http or https", "mesh", "table", "add", "photos", "--broker-admin", "amqp://guest:guest@127.0.0.1:5672/")
	if got := c.ok(t, "mesh", "revision"); got != rev {
		t.Errorf("a table add whose broker admin failed changed the mesh: revision %s, then %s", rev, got)
	}
}
