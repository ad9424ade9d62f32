package meshdb_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/internal/seal"
)

// TestScopeKeysOnlyForMembers: a scope's key is claimed only by a member
// and sealed only by a member for a member, each node role (row-level
// security and the definer functions) included; a member that leaves loses
// its copy; Load gives every node the scopes and the keys' scopes.
func TestScopeKeysOnlyForMembers(t *testing.T) {
	db, url := initMesh(t)
	ctx := context.Background()
	a := addNode(t, db, url, "alpha", 0)
	b := addNode(t, db, url, "beta", 0)
	g := addNode(t, db, url, "gamma", 0)
	adb, bdb, gdb := openDB(t, a.Token.DB), openDB(t, b.Token.DB), openDB(t, g.Token.DB)
	keys := map[string]*seal.NodeKey{}
	for node, ndb := range map[string]*meshdb.DB{"alpha": adb, "beta": bdb, "gamma": gdb} {
		k, err := seal.GenerateNodeKey()
		if err != nil {
			t.Fatal(err)
		}
		if err := ndb.PublishNodeKey(ctx, node, k.Public()); err != nil {
			t.Fatal(err)
		}
		keys[node] = k
	}
	must(t)(db.AddScope(ctx, "vault", []string{"alpha", "beta"}))
	must(t)(db.BindScope(ctx, "vault", seal.BindStage, []string{"ledger"}))
	if _, err := db.BindScope(ctx, "vault", "queue", []string{"x"}); err == nil {
		t.Error("bound a name of kind queue")
	}
	if _, err := db.AddScope(ctx, "vault", []string{"alpha"}); !errors.Is(err, meshdb.ErrExists) {
		t.Errorf("add scope vault again: got %v, want ErrExists", err)
	}
	scopes, err := gdb.Scopes(ctx)
	if err != nil || len(scopes) != 1 || len(scopes[0].Members) != 2 || len(scopes[0].Bindings) != 1 {
		t.Fatalf("gamma reads the scopes: %+v %v", scopes, err)
	}
	snap, err := gdb.Load(ctx, "gamma")
	if err != nil {
		t.Fatal(err)
	}
	var kid string
	for _, ck := range snap.Bindings.ContentKeys {
		if ck.Scope == "vault" {
			kid = ck.ID
		}
	}
	if kid == "" || len(snap.Bindings.Scopes) != 1 {
		t.Fatalf("gamma's bindings: keys %+v scopes %+v, want vault's key and the scope", snap.Bindings.ContentKeys, snap.Bindings.Scopes)
	}
	ck, err := seal.ContentKeyFrom(kid, seal.NewContentKey().Bytes())
	if err != nil {
		t.Fatal(err)
	}
	sealFor := func(node string) []byte {
		s, err := seal.SealTo(keys[node].Public(), seal.ContentKeyInfo(kid, node), ck.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if ok, err := gdb.ClaimKey(ctx, kid, "gamma", keys["gamma"].Fingerprint(), sealFor("gamma"), ck.Commitment()); err != nil || ok {
		t.Fatalf("gamma, outside vault, claims its key: got %v %v, want refused", ok, err)
	}
	if ok, err := adb.ClaimKey(ctx, kid, "alpha", keys["alpha"].Fingerprint(), sealFor("alpha"), ck.Commitment()); err != nil || !ok {
		t.Fatalf("alpha claims vault's key: got %v %v, want claimed", ok, err)
	}
	if ok, err := adb.PutSealedKey(ctx, kid, "alpha", "gamma", keys["gamma"].Fingerprint(), sealFor("gamma")); err != nil || ok {
		t.Fatalf("alpha seals vault's key for gamma: got %v %v, want refused", ok, err)
	}
	if ok, err := adb.PutSealedKey(ctx, kid, "alpha", "beta", keys["beta"].Fingerprint(), sealFor("beta")); err != nil || !ok {
		t.Fatalf("alpha seals vault's key for beta: got %v %v, want stored", ok, err)
	}

	// beta leaves the scope: its copy goes.
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `DELETE FROM scope_members WHERE scope = 'vault' AND node = 'beta'`); err != nil {
		t.Fatal(err)
	}
	snap, err = bdb.Load(ctx, "beta")
	if err != nil {
		t.Fatal(err)
	}
	for _, sk := range snap.Bindings.SealedKeys {
		if sk.ID == kid {
			t.Errorf("beta left vault and still has a copy of its key")
		}
	}
	// The mesh's rotation leaves the scope's key alone.
	if _, _, err := db.RotateKey(ctx, 0); err != nil {
		t.Fatal(err)
	}
	snap, err = adb.Load(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range snap.Bindings.ContentKeys {
		if k.ID == kid && k.RetireAt != nil {
			t.Errorf("rotating the mesh's key retires vault's %s", kid)
		}
	}
}
