package meshdb_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/internal/seal"
)

// TestRecoveryKit walks the kit through the database: the admin stores
// its public key; alpha, which holds k1, seals it for the kit (a node
// that does not hold it cannot); the admin opens the copy with the kit
// and seals it for a new node, whose key was unpublished; a second kit
// replaces the first only when asked, and drops the copies sealed to it.
func TestRecoveryKit(t *testing.T) {
	db, url := initMesh(t)
	ctx := context.Background()
	a := addNode(t, db, url, "alpha", 0)
	b := addNode(t, db, url, "beta", 0)
	adb, bdb := openDB(t, a.Token.DB), openDB(t, b.Token.DB)
	ka := withKey(t, db, "alpha")
	mesh, err := db.MeshID(ctx)
	if err != nil || mesh == "" {
		t.Fatalf("mesh id: %q, %v", mesh, err)
	}
	if again, _ := adb.MeshID(ctx); again != mesh {
		t.Errorf("mesh id read by alpha: got %q, want %q", again, mesh)
	}
	if pub, copies, err := adb.RecoveryKit(ctx, "alpha"); err != nil || pub != nil || len(copies) != 0 {
		t.Fatalf("recovery kit before one is made: %v %v %v, want none", pub, copies, err)
	}
	kit, err := seal.NewKit(mesh)
	if err != nil {
		t.Fatal(err)
	}
	if ch, err := db.SetRecoveryKit(ctx, kit.Public(), false); err != nil || !ch.Changed {
		t.Fatalf("set recovery kit: %+v %v", ch, err)
	}
	if _, err := adb.SetRecoveryKit(ctx, kit.Public(), true); err == nil {
		t.Error("alpha's role set the recovery kit")
	}

	ck, err := seal.ContentKeyFrom("k1", seal.NewContentKey().Bytes())
	if err != nil {
		t.Fatal(err)
	}
	forAlpha, err := seal.SealTo(ka.Public(), seal.ContentKeyInfo("k1", "alpha"), ck.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := adb.ClaimKey(ctx, "k1", "alpha", ka.Fingerprint(), forAlpha, ck.Commitment()); err != nil || !ok {
		t.Fatalf("alpha claims k1: %v %v", ok, err)
	}
	forKit, err := seal.SealTo(kit.Public(), seal.KitKeyInfo("k1", mesh), ck.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := bdb.PutKitKey(ctx, "k1", "beta", kit.Fingerprint(), forKit); err != nil || ok {
		t.Errorf("beta, which does not hold k1, seals it for the kit: %v %v, want refused", ok, err)
	}
	if ok, err := adb.PutKitKey(ctx, "k1", "alpha", "0000000000000000", forKit); err != nil || ok {
		t.Errorf("alpha seals k1 for another kit: %v %v, want refused", ok, err)
	}
	if ok, err := adb.PutKitKey(ctx, "k1", "alpha", kit.Fingerprint(), forKit); err != nil || !ok {
		t.Fatalf("alpha seals k1 for the kit: %v %v", ok, err)
	}
	if ok, err := adb.PutKitKey(ctx, "k1", "alpha", kit.Fingerprint(), forKit); err != nil || ok {
		t.Errorf("alpha seals k1 for the kit again: %v %v, want no change", ok, err)
	}
	pub, copies, err := bdb.RecoveryKit(ctx, "beta")
	if err != nil || !bytes.Equal(pub, kit.Public()) || copies["k1"] != kit.Fingerprint() {
		t.Fatalf("recovery kit read by beta: %x %v %v", pub, copies, err)
	}

	// The admin opens the copy with the kit and seals k1 for gamma.
	addNode(t, db, url, "gamma", 0)
	kc, err := db.KitKeysFor(ctx, "gamma", nil)
	if err != nil || len(kc) != 1 || kc[0].ID != "k1" || kc[0].SealedFor != kit.Fingerprint() {
		t.Fatalf("kit keys for gamma: %+v %v", kc, err)
	}
	raw, err := kit.Open(seal.KitKeyInfo("k1", mesh), kc[0].Sealed)
	if err != nil || !bytes.Equal(raw, ck.Bytes()) {
		t.Fatalf("open k1 with the kit: %v", err)
	}
	kg, err := seal.GenerateNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	forGamma, err := seal.SealTo(kg.Public(), seal.ContentKeyInfo("k1", "gamma"), raw)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.SealForNewNode(ctx, "gamma", kg.Public(), []meshdb.SealedCopy{{ID: "k1", Sealed: forGamma}}); err != nil {
		t.Fatalf("seal for gamma: %v", err)
	}
	if _, err := db.SealForNewNode(ctx, "gamma", kg.Public(), nil); err == nil {
		t.Error("seal for gamma again: want refused, it has a public key")
	}
	held, err := db.CopiesOf(ctx, "gamma")
	if err != nil || len(held) != 1 || held[0].SealedFor != kg.Fingerprint() {
		t.Fatalf("gamma's sealed keys: %+v %v", held, err)
	}
	if got, err := kg.Open(seal.ContentKeyInfo("k1", "gamma"), held[0].Sealed); err != nil || !bytes.Equal(got, ck.Bytes()) {
		t.Fatalf("gamma opens its copy: %v", err)
	}

	// Another kit replaces this one only when asked.
	kit2, err := seal.NewKit(mesh)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.SetRecoveryKit(ctx, kit2.Public(), false); !errors.Is(err, meshdb.ErrExists) {
		t.Fatalf("set another kit without replace: %v, want ErrExists", err)
	}
	if _, err := db.SetRecoveryKit(ctx, kit2.Public(), true); err != nil {
		t.Fatal(err)
	}
	if _, copies, err := db.RecoveryKit(ctx, ""); err != nil || len(copies) != 0 {
		t.Errorf("copies after a new kit: %v %v, want none (sealed to the old kit)", copies, err)
	}
	if kc, err := db.KitKeysFor(ctx, "gamma", nil); err != nil || len(kc) != 1 || kc[0].Sealed != nil {
		t.Errorf("kit keys after a new kit: %+v %v, want k1 without a copy", kc, err)
	}
}
