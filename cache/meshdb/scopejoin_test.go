package meshdb_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/cache/meshdb"
)

// TestAddNodeIntoScopes: a node added with NewNode.Scopes is a member of
// them at once, and the kit's keys for it include theirs before it is
// one; a scope that does not exist is refused, and nothing is added.
func TestAddNodeIntoScopes(t *testing.T) {
	db, url := initMesh(t)
	ctx := context.Background()
	addNode(t, db, url, "alpha", 0)
	must(t)(db.AddScope(ctx, "vault", []string{"alpha"}))

	kc, err := db.KitKeysFor(ctx, "gamma", nil)
	if err != nil || len(kc) != 1 || kc[0].Scope != "" {
		t.Fatalf("kit keys for gamma, in no scope: %+v %v, want the mesh's key only", kc, err)
	}
	kc, err = db.KitKeysFor(ctx, "gamma", []string{"vault"})
	if err != nil || len(kc) != 2 || !slices.ContainsFunc(kc, func(c meshdb.KitCopy) bool { return c.Scope == "vault" }) {
		t.Fatalf("kit keys for gamma, joining vault: %+v %v, want the mesh's and vault's", kc, err)
	}

	rev := revision(t, db)
	_, err = db.AddNodeIdentity(ctx, url, meshdb.NewNode{Record: cache.NodeRecord{Name: "delta"}, Scopes: []string{"vault", "attic"},
		Broker: meshdb.BrokerCredential{Generation: 1, User: "node.delta.g1", Password: "broker-secret-of-delta"}})
	if !errors.Is(err, meshdb.ErrNotFound) {
		t.Fatalf("add node into scope attic, which does not exist: %v, want ErrNotFound", err)
	}
	if ok, _ := db.NodeExists(ctx, "delta"); ok || revision(t, db) != rev {
		t.Errorf("a refused add changed the mesh: delta recorded %v, revision %d then %d", ok, rev, revision(t, db))
	}

	_, err = db.AddNodeIdentity(ctx, url, meshdb.NewNode{Record: cache.NodeRecord{Name: "gamma"}, Scopes: []string{"vault"},
		Broker: meshdb.BrokerCredential{Generation: 1, User: "node.gamma.g1", Password: "broker-secret-of-gamma"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.RemoveNode(context.Background(), "gamma", true) })
	scopes, err := db.Scopes(ctx)
	if err != nil || len(scopes) != 1 || !slices.Equal(scopes[0].Members, []string{"alpha", "gamma"}) {
		t.Fatalf("scopes after adding gamma into vault: %+v %v", scopes, err)
	}
}
