package meshdb_test

import (
	"context"
	"encoding/base64"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/meshbox/meshbox/internal/seal"
)

// TestSigningKeyPublished: each node sets its own signing key and no
// other node's; every node's bindings carry every node's key, and the
// change bumps the revision.
func TestSigningKeyPublished(t *testing.T) {
	db, url := initMesh(t)
	ctx := context.Background()
	a := addNode(t, db, url, "alpha", 0)
	b := addNode(t, db, url, "beta", 0)
	adb, bdb := openDB(t, a.Token.DB), openDB(t, b.Token.DB)
	ka, err := seal.GenerateSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	kb, err := seal.GenerateSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	rev := revision(t, db)
	if err := adb.PublishSigningKey(ctx, "alpha", ka.Public()); err != nil {
		t.Fatalf("alpha publishes its signing key: %v", err)
	}
	if got := revision(t, db); got <= rev {
		t.Errorf("revision after alpha published its signing key: got %d, want more than %d", got, rev)
	}
	if err := adb.PublishSigningKey(ctx, "alpha", ka.Public()); err != nil {
		t.Fatalf("alpha publishes the same signing key again: %v", err)
	}
	if err := adb.PublishSigningKey(ctx, "beta", ka.Public()); err == nil {
		t.Fatal("alpha's role set beta's signing key")
	}
	if err := adb.PublishSigningKey(ctx, "alpha", []byte("short")); err == nil {
		t.Fatal("a signing key of 5 bytes was published")
	}
	// Plain SQL: alpha's role may not write the column at all.
	conn, err := pgx.Connect(ctx, a.Token.DB)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `UPDATE nodes SET signing_key = $1 WHERE name = 'beta'`, ka.Public()); err == nil {
		t.Error("alpha's role updated beta's signing_key with plain SQL")
	}
	if err := bdb.PublishSigningKey(ctx, "beta", kb.Public()); err != nil {
		t.Fatalf("beta publishes its signing key: %v", err)
	}

	snap, err := bdb.Load(ctx, "beta")
	if err != nil {
		t.Fatal(err)
	}
	keys := snap.Bindings.SigningKeys()
	for node, want := range map[string][]byte{"alpha": ka.Public(), "beta": kb.Public()} {
		if got := keys[node]; string(got) != string(want) {
			t.Errorf("beta's bindings: %s's signing key %s, want %s", node,
				base64.StdEncoding.EncodeToString(got), base64.StdEncoding.EncodeToString(want))
		}
	}
	if _, ok := keys["n1"]; ok {
		t.Error("beta's bindings: n1 has a signing key, want none (it never published one)")
	}
}
