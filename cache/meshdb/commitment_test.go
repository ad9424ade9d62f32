package meshdb_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/internal/seal"
)

// TestKeyCommitment: a claim records the key's commitment, which every
// node role reads and none may change; while a node holds the key not
// even the owner changes it, and a claim without one is refused. A key
// nobody holds any more is claimed again with a commitment of its own.
func TestKeyCommitment(t *testing.T) {
	db, url := initMesh(t)
	ctx := context.Background()
	a := addNode(t, db, url, "alpha", 0)
	b := addNode(t, db, url, "beta", 0)
	adb, bdb := openDB(t, a.Token.DB), openDB(t, b.Token.DB)
	ka, kb := withKey(t, db, "alpha"), withKey(t, db, "beta")
	ck, err := seal.ContentKeyFrom("k1", seal.NewContentKey().Bytes())
	if err != nil {
		t.Fatal(err)
	}
	sealed := func(k seal.ContentKey, node string, nk *seal.NodeKey) []byte {
		s, err := seal.SealTo(nk.Public(), seal.ContentKeyInfo(k.ID, node), k.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	// Without a commitment, by the new function or the one older nodes
	// call, nothing is claimed.
	if ok, err := adb.ClaimKey(ctx, "k1", "alpha", ka.Fingerprint(), sealed(ck, "alpha", ka), nil); err != nil || ok {
		t.Fatalf("claim without a commitment: got %v %v, want refused", ok, err)
	}
	aconn := connect(t, a.Token.DB)
	var ok bool
	if err := aconn.QueryRow(ctx, `SELECT meshbox_claim_key('k1', 'alpha', $1, $2)`, ka.Fingerprint(), sealed(ck, "alpha", ka)).Scan(&ok); err != nil || ok {
		t.Fatalf("claim through the function of older nodes: got %v %v, want refused", ok, err)
	}
	if ok, err := adb.ClaimKey(ctx, "k1", "alpha", ka.Fingerprint(), sealed(ck, "alpha", ka), ck.Commitment()); err != nil || !ok {
		t.Fatalf("alpha claims k1 with its commitment: got %v %v, want claimed", ok, err)
	}
	if ok, err := adb.PutSealedKey(ctx, "k1", "alpha", "beta", kb.Fingerprint(), sealed(ck, "beta", kb)); err != nil || !ok {
		t.Fatalf("alpha seals k1 for beta: got %v %v", ok, err)
	}

	// beta reads the commitment, and who sealed its copy.
	snap, err := bdb.Load(ctx, "beta")
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Bindings.ContentKeys) != 1 || !bytes.Equal(snap.Bindings.ContentKeys[0].Commitment, ck.Commitment()) {
		t.Fatalf("beta's content keys: got %+v, want k1 with alpha's commitment", snap.Bindings.ContentKeys)
	}
	if len(snap.Bindings.SealedKeys) != 1 || snap.Bindings.SealedKeys[0].SealedBy != "alpha" {
		t.Fatalf("beta's sealed keys: got %+v, want its copy sealed by alpha", snap.Bindings.SealedKeys)
	}
	if err := ck.CheckCommitment(snap.Bindings.ContentKeys[0].Commitment); err != nil {
		t.Fatalf("k1 against the commitment beta reads: %v", err)
	}

	other := seal.NewContentKey()
	for who, dsn := range map[string]string{"beta's role": b.Token.DB, "the owner": url} {
		conn := connect(t, dsn)
		if _, err := conn.Exec(ctx, `UPDATE content_keys SET commitment = $1 WHERE id = 'k1'`, other.Commitment()); err == nil {
			t.Errorf("%s changed k1's commitment while alpha and beta hold it", who)
		}
	}
	if got := commitmentOf(t, url, "k1"); !bytes.Equal(got, ck.Commitment()) {
		t.Fatalf("k1's commitment after the attempts: got %x, want %x", got, ck.Commitment())
	}

	// Once nobody holds k1, a claim makes it anew, with its own commitment.
	if _, err := connect(t, url).Exec(ctx, `DELETE FROM sealed_keys WHERE key_id = 'k1'`); err != nil {
		t.Fatal(err)
	}
	again, err := seal.ContentKeyFrom("k1", seal.NewContentKey().Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := bdb.ClaimKey(ctx, "k1", "beta", kb.Fingerprint(), sealed(again, "beta", kb), again.Commitment()); err != nil || !ok {
		t.Fatalf("beta claims k1 nobody holds: got %v %v, want claimed", ok, err)
	}
	if got := commitmentOf(t, url, "k1"); !bytes.Equal(got, again.Commitment()) {
		t.Fatalf("k1's commitment after the new claim: got %x, want beta's", got)
	}
}

// TestDropSealedKeyOwnCopyOnly: a node removes its own copy of a key, and
// only the copy it names (by its bytes); another node's role removes
// nothing of it, nor does a role that is no node's.
func TestDropSealedKeyOwnCopyOnly(t *testing.T) {
	db, url := initMesh(t)
	ctx := context.Background()
	a := addNode(t, db, url, "alpha", 0)
	b := addNode(t, db, url, "beta", 0)
	adb, bdb := openDB(t, a.Token.DB), openDB(t, b.Token.DB)
	ka, kb := withKey(t, db, "alpha"), withKey(t, db, "beta")
	ck, err := seal.ContentKeyFrom("k1", seal.NewContentKey().Bytes())
	if err != nil {
		t.Fatal(err)
	}
	forA, err := seal.SealTo(ka.Public(), seal.ContentKeyInfo("k1", "alpha"), ck.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	forB, err := seal.SealTo(kb.Public(), seal.ContentKeyInfo("k1", "beta"), ck.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := adb.ClaimKey(ctx, "k1", "alpha", ka.Fingerprint(), forA, ck.Commitment()); err != nil || !ok {
		t.Fatalf("alpha claims k1: %v %v", ok, err)
	}
	if ok, err := adb.PutSealedKey(ctx, "k1", "alpha", "beta", kb.Fingerprint(), forB); err != nil || !ok {
		t.Fatalf("alpha seals k1 for beta: %v %v", ok, err)
	}

	refused := []struct {
		what string
		db   *meshdb.DB
		node string
		blob []byte
	}{
		{"alpha's role drops beta's copy", adb, "beta", forB},
		{"beta's role drops alpha's copy", bdb, "alpha", forA},
		{"beta drops another copy than its own", bdb, "beta", forA},
	}
	for _, r := range refused {
		if ok, err := r.db.DropSealedKey(ctx, "k1", r.node, r.blob); err != nil || ok {
			t.Errorf("%s: got %v %v, want nothing removed", r.what, ok, err)
		}
	}
	// Raw SQL as alpha's role: the row is invisible and the function
	// refuses; a plain DELETE is not granted.
	aconn := connect(t, a.Token.DB)
	sum := sha256.Sum256(forB)
	var ok bool
	if err := aconn.QueryRow(ctx, `SELECT meshbox_drop_sealed_key('k1', 'beta', $1)`, sum[:]).Scan(&ok); err != nil || ok {
		t.Errorf("alpha's role calls the function for beta: got %v %v, want refused", ok, err)
	}
	if _, err := aconn.Exec(ctx, `DELETE FROM sealed_keys WHERE node = 'beta'`); err == nil {
		t.Error("alpha's role deletes from sealed_keys")
	}
	if got := holdersOf(t, db, "k1"); got != "alpha beta" {
		t.Fatalf("holders of k1 after the refused drops: got %q, want alpha beta", got)
	}

	if ok, err := bdb.DropSealedKey(ctx, "k1", "beta", forB); err != nil || !ok {
		t.Fatalf("beta drops its own copy: got %v %v, want removed", ok, err)
	}
	if got := holdersOf(t, db, "k1"); got != "alpha" {
		t.Fatalf("holders of k1 after beta dropped its copy: got %q, want alpha", got)
	}
	// The key's commitment stays, and alpha seals k1 for beta again.
	if got := commitmentOf(t, url, "k1"); !bytes.Equal(got, ck.Commitment()) {
		t.Fatalf("k1's commitment after the drop: got %x", got)
	}
	if ok, err := adb.PutSealedKey(ctx, "k1", "alpha", "beta", kb.Fingerprint(), forB); err != nil || !ok {
		t.Fatalf("alpha seals k1 for beta again: %v %v", ok, err)
	}
}

// connect opens a plain connection to dsn, closed in Cleanup.
func connect(tb testing.TB, dsn string) *pgx.Conn {
	tb.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// commitmentOf reads key id's commitment as the database's owner.
func commitmentOf(tb testing.TB, url, id string) []byte {
	tb.Helper()
	var sum []byte
	if err := connect(tb, url).QueryRow(context.Background(), `SELECT commitment FROM content_keys WHERE id = $1`, id).Scan(&sum); err != nil {
		tb.Fatal(err)
	}
	return sum
}

// holdersOf lists the nodes that hold a copy of key id, space-separated.
func holdersOf(tb testing.TB, db *meshdb.DB, id string) string {
	tb.Helper()
	_, holders, err := db.ContentKeys(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	var out []byte
	for _, h := range holders {
		if h.KeyID == id {
			if len(out) > 0 {
				out = append(out, ' ')
			}
			out = append(out, h.Node...)
		}
	}
	return string(out)
}
