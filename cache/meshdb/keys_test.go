package meshdb_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/internal/seal"
)

// TestContentKeyDistribution walks a content key through the database as
// nodes do: alpha publishes its public key and claims k1, seals it for
// beta; each role reads only its own sealed copy, and a dump of the
// database shows the key only sealed.
func TestContentKeyDistribution(t *testing.T) {
	db, url := initMesh(t)
	ctx := context.Background()
	a := addNode(t, db, url, "alpha", 0)
	b := addNode(t, db, url, "beta", 0)
	adb, bdb := openDB(t, a.Token.DB), openDB(t, b.Token.DB)
	ka, err := seal.GenerateNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	kb, err := seal.GenerateNodeKey()
	if err != nil {
		t.Fatal(err)
	}

	if err := adb.PublishNodeKey(ctx, "alpha", ka.Public()); err != nil {
		t.Fatalf("alpha publishes its key: %v", err)
	}
	if err := adb.PublishNodeKey(ctx, "alpha", ka.Public()); err != nil {
		t.Fatalf("alpha publishes the same key again: %v", err)
	}
	if err := adb.PublishNodeKey(ctx, "beta", ka.Public()); err == nil {
		t.Fatal("alpha's role set beta's public key")
	}
	if err := bdb.PublishNodeKey(ctx, "beta", kb.Public()); err != nil {
		t.Fatalf("beta publishes its key: %v", err)
	}

	ck := seal.NewContentKey()
	ck, err = seal.ContentKeyFrom("k1", ck.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	sealFor := func(node string, k *seal.NodeKey) []byte {
		s, err := seal.SealTo(k.Public(), seal.ContentKeyInfo("k1", node), ck.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if ok, err := bdb.PutSealedKey(ctx, "k1", "beta", kb.Fingerprint(), sealFor("beta", kb)); err != nil || ok {
		t.Fatalf("beta, holding nothing, stores a copy: got %v %v, want refused", ok, err)
	}
	if ok, err := adb.ClaimKey(ctx, "k1", ka.Fingerprint(), sealFor("alpha", ka)); err != nil || !ok {
		t.Fatalf("alpha claims k1: got %v %v, want claimed", ok, err)
	}
	if ok, err := bdb.ClaimKey(ctx, "k1", kb.Fingerprint(), sealFor("beta", kb)); err != nil || ok {
		t.Fatalf("beta claims k1 after alpha: got %v %v, want refused", ok, err)
	}
	if ok, err := adb.PutSealedKey(ctx, "k1", "beta", ka.Fingerprint(), sealFor("beta", kb)); err != nil || ok {
		t.Fatalf("a copy for beta under another key's fingerprint: got %v %v, want refused", ok, err)
	}
	if ok, err := adb.PutSealedKey(ctx, "k1", "beta", kb.Fingerprint(), sealFor("beta", kb)); err != nil || !ok {
		t.Fatalf("alpha seals k1 for beta: got %v %v, want stored", ok, err)
	}
	if ok, err := adb.PutSealedKey(ctx, "k1", "beta", kb.Fingerprint(), sealFor("beta", kb)); err != nil || ok {
		t.Fatalf("the same copy again: got %v %v, want no change", ok, err)
	}

	snap, err := bdb.Load(ctx, "beta")
	if err != nil {
		t.Fatal(err)
	}
	bs := snap.Bindings
	if len(bs.SealedKeys) != 1 || bs.SealedKeys[0].ID != "k1" || bs.SealedKeys[0].SealedFor != kb.Fingerprint() {
		t.Fatalf("beta's sealed keys: got %+v, want its copy of k1", bs.SealedKeys)
	}
	opened, err := kb.Open(seal.ContentKeyInfo("k1", "beta"), bs.SealedKeys[0].Sealed)
	if err != nil || !bytes.Equal(opened, ck.Bytes()) {
		t.Fatalf("beta opens its copy: got %v, want k1's bytes", err)
	}
	if len(bs.KeyHolders) != 2 || len(bs.ContentKeys) != 1 || bs.ContentKeys[0].ID != "k1" {
		t.Fatalf("holders %+v, keys %+v: want alpha and beta holding k1", bs.KeyHolders, bs.ContentKeys)
	}
	if rec, _ := bs.NodeRecord("alpha"); rec.PublicKey != base64.StdEncoding.EncodeToString(ka.Public()) {
		t.Fatal("alpha's record has not its public key")
	}

	// What a node role or the database's owner can read holds the key only
	// sealed.
	for who, dsn := range map[string]string{"beta's role": b.Token.DB, "the owner": url} {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := conn.Query(ctx, `SELECT node, sealed FROM sealed_keys`)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for rows.Next() {
			var node string
			var blob []byte
			if err := rows.Scan(&node, &blob); err != nil {
				t.Fatal(err)
			}
			n++
			if bytes.Contains(blob, ck.Bytes()) {
				t.Errorf("%s reads k1's bytes in %s's row", who, node)
			}
			if who == "beta's role" && node != "beta" {
				t.Errorf("beta's role reads %s's sealed copy", node)
			}
		}
		if rows.Err() != nil {
			t.Fatal(rows.Err())
		}
		if n == 0 {
			t.Errorf("%s reads no sealed copy", who)
		}
		var dump string
		if err := conn.QueryRow(ctx, `SELECT string_agg(t::text, ' ') FROM content_keys t`).Scan(&dump); err != nil {
			t.Fatal(err)
		}
		if bytes.Contains([]byte(dump), []byte(base64.StdEncoding.EncodeToString(ck.Bytes()))) {
			t.Errorf("%s reads k1's bytes in content_keys", who)
		}
		conn.Close(ctx)
	}

	id, _, err := db.RotateKey(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	keys, _, err := db.ContentKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || keys[0].ID != "k1" || keys[0].RetireAt == nil || keys[1].ID != id || keys[1].RetireAt != nil {
		t.Fatalf("after rotation: got %+v, want k1 retiring and %s new", keys, id)
	}
	_ = meshdb.DefaultKeyRetention
}
