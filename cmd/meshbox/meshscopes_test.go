package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/testing/meshtest"
)

func TestMeshScopeCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	c := cli{env: map[string]string{"MESHBOX_DB": meshtest.Postgres(t).Database(t)}}
	c.ok(t, "init", "--node", "n1", "--broker", "amqp://127.0.0.1:5672/")
	c.ok(t, "mesh", "node", "add", "n2", "--record-only")
	c.ok(t, "mesh", "node", "add", "n3", "--record-only")

	c.fails(t, "--nodes is required", "mesh", "scope", "add", "vault")
	c.fails(t, `scope name "bad.name"`, "mesh", "scope", "add", "bad.name", "--nodes", "n1")
	c.fails(t, `node "nope" not found`, "mesh", "scope", "add", "vault", "--nodes", "n1,nope")
	if out := c.ok(t, "mesh", "scope", "add", "vault", "--nodes", "n1,n2"); !strings.Contains(out, "scope vault added, held by n1, n2") {
		t.Fatalf("scope add:\n%s", out)
	}
	c.fails(t, `scope "vault" already exists`, "mesh", "scope", "add", "vault", "--nodes", "n1")
	c.fails(t, "name at least one", "mesh", "scope", "bind", "vault")
	c.fails(t, `scope "other" not found`, "mesh", "scope", "bind", "other", "--stage", "ledger")
	out := c.ok(t, "mesh", "scope", "bind", "vault", "--stage", "ledger", "--cap", "safe.open", "--topic", "door")
	for _, want := range []string{"stage ledger bound to scope vault", "cap safe.open bound to scope vault", "topic door bound to scope vault"} {
		if !strings.Contains(out, want) {
			t.Errorf("scope bind: want %q in:\n%s", want, out)
		}
	}
	c.ok(t, "mesh", "scope", "add", "other", "--nodes", "n3")
	c.fails(t, `stage "ledger" bound to scope "vault" already exists`, "mesh", "scope", "bind", "other", "--stage", "ledger")

	type scopeRow struct {
		Name     string   `json:"name"`
		Members  []string `json:"members"`
		Bindings []struct {
			Kind string `json:"kind"`
			Name string `json:"name"`
		} `json:"bindings"`
		Keys []struct {
			ID       string     `json:"id"`
			RetireAt *time.Time `json:"retire_at"`
		} `json:"keys"`
	}
	list := func() []scopeRow {
		var rows []scopeRow
		if err := json.Unmarshal([]byte(c.ok(t, "mesh", "scope", "list", "--json")), &rows); err != nil {
			t.Fatal(err)
		}
		return rows
	}
	rows := list()
	if len(rows) != 2 || rows[1].Name != "vault" || strings.Join(rows[1].Members, ",") != "n1,n2" ||
		len(rows[1].Bindings) != 3 || len(rows[1].Keys) != 1 || rows[1].Keys[0].RetireAt != nil {
		t.Fatalf("scope list: %+v, want vault held by n1,n2 with 3 bindings and one key", rows)
	}
	first := rows[1].Keys[0].ID

	// Rotating the mesh's key leaves the scope's alone, and the scope's
	// keys are not the mesh's.
	c.ok(t, "mesh", "key", "rotate", "--retention", "2h")
	if out := c.ok(t, "mesh", "key", "list"); strings.Contains(out, first) {
		t.Errorf("mesh key list shows the scope's key %s:\n%s", first, out)
	}
	if rows := list(); rows[1].Keys[0].RetireAt != nil {
		t.Errorf("rotating the mesh's key retires the scope's: %+v", rows[1].Keys)
	}
	c.fails(t, "shorter than a minute", "mesh", "scope", "rotate", "vault", "--retention", "1s")
	c.fails(t, `scope "nope" not found`, "mesh", "scope", "rotate", "nope")
	if out := c.ok(t, "mesh", "scope", "rotate", "vault", "--retention", "2h"); !strings.Contains(out, "added to scope vault") {
		t.Fatalf("scope rotate:\n%s", out)
	}
	rows = list()
	if len(rows[1].Keys) != 2 || rows[1].Keys[0].ID != first || rows[1].Keys[0].RetireAt == nil || rows[1].Keys[1].RetireAt != nil {
		t.Fatalf("vault's keys after rotation: %+v, want %s retiring and a new one", rows[1].Keys, first)
	}
	if len(rows[0].Keys) != 1 || rows[0].Keys[0].RetireAt != nil {
		t.Errorf("rotating vault touched scope other's keys: %+v", rows[0].Keys)
	}
	c.ok(t, "mesh", "scope", "bind", "vault", "--topic", "door", "--unbind")
	if rows := list(); len(rows[1].Bindings) != 2 {
		t.Errorf("after unbinding topic door: %+v", rows[1].Bindings)
	}
}

func TestSealingLineScopes(t *testing.T) {
	got := sealingLine(&appliance.KeysStatus{Sealing: true, Current: "k1", NodeKey: "abcd",
		Scopes: map[string]string{"vault": "kv", "attic": ""}})
	want := "on, key k1, node key abcd; scope attic (no key yet); scope vault key kv"
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
