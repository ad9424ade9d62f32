package meshdb_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/meshbox/meshbox/cache"
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
	if ok, err := bdb.PutSealedKey(ctx, "k1", "beta", "beta", kb.Fingerprint(), sealFor("beta", kb)); err != nil || ok {
		t.Fatalf("beta, holding nothing, stores a copy: got %v %v, want refused", ok, err)
	}
	if ok, err := bdb.ClaimKey(ctx, "k1", "alpha", ka.Fingerprint(), sealFor("alpha", ka), ck.Commitment()); err != nil || ok {
		t.Fatalf("beta's role claims k1 as alpha: got %v %v, want refused", ok, err)
	}
	if ok, err := adb.ClaimKey(ctx, "k1", "alpha", ka.Fingerprint(), sealFor("alpha", ka), ck.Commitment()); err != nil || !ok {
		t.Fatalf("alpha claims k1: got %v %v, want claimed", ok, err)
	}
	if ok, err := bdb.ClaimKey(ctx, "k1", "beta", kb.Fingerprint(), sealFor("beta", kb), ck.Commitment()); err != nil || ok {
		t.Fatalf("beta claims k1 after alpha: got %v %v, want refused", ok, err)
	}
	if ok, err := adb.PutSealedKey(ctx, "k1", "alpha", "beta", ka.Fingerprint(), sealFor("beta", kb)); err != nil || ok {
		t.Fatalf("a copy for beta under another key's fingerprint: got %v %v, want refused", ok, err)
	}
	if ok, err := adb.PutSealedKey(ctx, "k1", "alpha", "beta", kb.Fingerprint(), sealFor("beta", kb)); err != nil || !ok {
		t.Fatalf("alpha seals k1 for beta: got %v %v, want stored", ok, err)
	}
	if ok, err := adb.PutSealedKey(ctx, "k1", "alpha", "beta", kb.Fingerprint(), sealFor("beta", kb)); err != nil || ok {
		t.Fatalf("the same copy again: got %v %v, want no change", ok, err)
	}

	// The tables' owner (nodes run on the admin's credential) acts for the
	// node it names.
	must(t)(db.AddNode(ctx, cache.NodeRecord{Name: "gamma"}))
	kg := withKey(t, db, "gamma")
	if ok, err := db.PutSealedKey(ctx, "k1", "alpha", "gamma", kg.Fingerprint(), sealFor("gamma", kg)); err != nil || !ok {
		t.Fatalf("the owner, for alpha, seals k1 for gamma: got %v %v, want stored", ok, err)
	}
	if ok, err := adb.PutSealedKey(ctx, "k1", "gamma", "beta", kb.Fingerprint(), sealFor("beta", kb)); err != nil || ok {
		t.Fatalf("alpha's role acts for gamma: got %v %v, want refused", ok, err)
	}

	if ok, err := adb.MarkKeyOpened(ctx, "k1", "beta", kb.Fingerprint()); err != nil || ok {
		t.Fatalf("alpha's role says beta opens k1: got %v %v, want refused", ok, err)
	}
	if ok, err := bdb.MarkKeyOpened(ctx, "k1", "beta", kb.Fingerprint()); err != nil || !ok {
		t.Fatalf("beta says it opens k1: got %v %v, want recorded", ok, err)
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
	if len(bs.KeyHolders) != 3 || len(bs.ContentKeys) != 1 || bs.ContentKeys[0].ID != "k1" {
		t.Fatalf("holders %+v, keys %+v: want alpha, beta and gamma holding k1", bs.KeyHolders, bs.ContentKeys)
	}
	for _, h := range bs.KeyHolders {
		if h.Opened != (h.Node == "beta") {
			t.Errorf("holder %+v: want only beta marked as opening k1", h)
		}
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

// withKey publishes a new public key for node (as the database's owner)
// and returns the key pair.
func withKey(tb testing.TB, db *meshdb.DB, node string) *seal.NodeKey {
	tb.Helper()
	k, err := seal.GenerateNodeKey()
	if err != nil {
		tb.Fatal(err)
	}
	if err := db.PublishNodeKey(context.Background(), node, k.Public()); err != nil {
		tb.Fatal(err)
	}
	return k
}

// openGrant opens a grant's sealed credential with k.
func openGrant(tb testing.TB, k *seal.NodeKey, g cache.Grant) string {
	tb.Helper()
	if g.Credential != "" {
		tb.Fatalf("grant %s/%s holds a plain credential", g.Consumer, g.Resource)
	}
	raw, err := base64.StdEncoding.DecodeString(g.SealedCredential)
	if err != nil {
		tb.Fatal(err)
	}
	cred, err := k.Open(seal.GrantInfo(g.Consumer, g.Resource, g.Provider), raw)
	if err != nil {
		tb.Fatalf("open the credential of %s/%s: %v", g.Consumer, g.Resource, err)
	}
	return string(cred)
}

// TestGrantCredentialSealed: a grant's credential is stored sealed to its
// consumer; a consumer without a public key cannot get one; a node role
// and the owner read it only sealed.
func TestGrantCredentialSealed(t *testing.T) {
	db, url := initMesh(t)
	ctx := context.Background()
	a := addNode(t, db, url, "alpha", 0)
	if _, err := db.Grant(ctx, cache.Grant{Consumer: "alpha", Resource: "bucket", Provider: "p", Credential: "pw-1234"}); !errors.Is(err, meshdb.ErrNoPublicKey) {
		t.Fatalf("grant to a node without a public key: got %v, want ErrNoPublicKey", err)
	}
	must(t)(db.Grant(ctx, cache.Grant{Consumer: "alpha", Resource: "open", Provider: "p"})) // no credential: fine
	k := withKey(t, db, "alpha")
	must(t)(db.Grant(ctx, cache.Grant{Consumer: "alpha", Resource: "bucket", Provider: "p", Credential: "pw-1234"}))
	snap, err := openDB(t, a.Token.DB).Load(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	var got string
	for _, g := range snap.Bindings.Grants {
		if g.Resource == "bucket" {
			got = openGrant(t, k, g)
		}
	}
	if got != "pw-1234" {
		t.Fatalf("alpha opens its credential: got %q, want pw-1234", got)
	}
	for who, dsn := range map[string]string{"alpha's role": a.Token.DB, "the owner": url} {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		var dump string
		if err := conn.QueryRow(ctx, `SELECT string_agg(g::text, ' ') FROM grants g`).Scan(&dump); err != nil {
			t.Fatal(err)
		}
		conn.Close(ctx)
		if strings.Contains(dump, "pw-1234") || !strings.Contains(dump, "bucket") {
			t.Errorf("%s reads the grants as %q: want the bucket grant without its credential", who, dump)
		}
	}
}
