package meshdb_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/meshbox/meshbox/cache/meshdb"
)

// TestCredentialRotationRows walks a rotation through the database: the
// admin adds generation 2, the node reads it with its bindings and records
// that it switched (through its own role, and only for itself), and the
// admin deletes generation 1.
func TestCredentialRotationRows(t *testing.T) {
	db, url := initMesh(t)
	ctx := context.Background()
	a := addNode(t, db, url, "alpha", 0)
	addNode(t, db, url, "beta", 0)

	_, err := db.AddCredentialGeneration(ctx, "alpha", meshdb.BrokerCredential{Generation: 1, User: "node.alpha.g1", Password: "x"})
	if !errors.Is(err, meshdb.ErrExists) {
		t.Errorf("adding generation 1 again: got %v, want ErrExists", err)
	}
	_, err = db.AddCredentialGeneration(ctx, "nobody", meshdb.BrokerCredential{Generation: 2, User: "node.nobody.g2", Password: "x"})
	if !errors.Is(err, meshdb.ErrNotFound) {
		t.Errorf("unknown node: got %v, want ErrNotFound", err)
	}
	ch, err := db.AddCredentialGeneration(ctx, "alpha", meshdb.BrokerCredential{Generation: 2, User: "node.alpha.g2", Password: "secret-2"})
	if err != nil || !ch.Changed {
		t.Fatalf("add generation 2: %v %+v", err, ch)
	}

	nodeDB, err := meshdb.Open(ctx, a.Token.DB, meshdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer nodeDB.Close()
	snap, err := nodeDB.Load(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	b := snap.Bindings.Broker
	if b == nil || b.Generation != 2 || b.Password.Reveal() != "secret-2" || !b.SwitchedAt.IsZero() || len(b.Older) != 1 || b.Older[0] != 1 {
		t.Fatalf("alpha's bindings: got %+v, want generation 2, not switched, older [1]", b)
	}
	if err := nodeDB.CredentialSwitched(ctx, 7); !errors.Is(err, meshdb.ErrNotFound) {
		t.Errorf("switch to a generation that does not exist: got %v, want ErrNotFound", err)
	}
	if err := nodeDB.CredentialSwitched(ctx, 2); err != nil {
		t.Fatalf("record switch: %v", err)
	}
	gens, err := db.CredentialGenerations(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	switched := map[string]bool{}
	for _, g := range gens {
		switched[g.User] = g.Switched()
	}
	want := map[string]bool{"node.alpha.g1": false, "node.alpha.g2": true, "node.beta.g1": false}
	for u, w := range want {
		if got, ok := switched[u]; !ok || got != w {
			t.Errorf("%s switched: got %v (present %v), want %v", u, got, ok, w)
		}
	}

	// A node role changes no row directly, not even its own.
	conn, err := pgx.Connect(ctx, a.Token.DB)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `UPDATE node_credentials SET switched_at = now() WHERE node = 'beta'`); err == nil {
		t.Error("a node role updated node_credentials directly")
	}

	if _, err := db.DeleteCredentialGeneration(ctx, "alpha", 1); err != nil {
		t.Fatal(err)
	}
	snap, err = nodeDB.Load(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	if b := snap.Bindings.Broker; b.Generation != 2 || len(b.Older) != 0 || b.SwitchedAt.IsZero() {
		t.Errorf("after revoking generation 1: got %+v, want generation 2, switched, nothing older", b)
	}
}

// TestSetNodeStages replaces a node's stage allow-list and refuses bad
// input.
func TestSetNodeStages(t *testing.T) {
	db, url := initMesh(t)
	ctx := context.Background()
	addNode(t, db, url, "alpha", 0)
	if _, err := db.SetNodeStages(ctx, "alpha", []string{"resize", "thumbs"}); err != nil {
		t.Fatal(err)
	}
	got, err := db.NodeStages(ctx, "alpha")
	if err != nil || len(got) != 2 || got[0] != "resize" || got[1] != "thumbs" {
		t.Errorf("stages: got %v %v, want [resize thumbs]", got, err)
	}
	if _, err := db.SetNodeStages(ctx, "nobody", []string{"x"}); !errors.Is(err, meshdb.ErrNotFound) {
		t.Errorf("unknown node: got %v, want ErrNotFound", err)
	}
	if _, err := db.SetNodeStages(ctx, "alpha", []string{"no spaces"}); err == nil {
		t.Error("an invalid stage name was accepted")
	}
}
