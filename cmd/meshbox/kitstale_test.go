package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// kitMesh is a mesh database with a recovery kit and node alpha, which
// holds the mesh's key and sealed it for the kit.
type kitMesh struct {
	url   string
	db    *meshdb.DB
	mesh  string
	kit   *seal.Kit
	alpha *seal.NodeKey
	keys  map[string]seal.ContentKey // by id, as alpha made them
}

func newKitMesh(t *testing.T) *kitMesh {
	t.Helper()
	ctx := context.Background()
	url := meshtest.Postgres(t).Database(t)
	c := cli{env: map[string]string{"MESHBOX_DB": url}}
	c.ok(t, "init", "--node", "n1", "--broker", "amqp://127.0.0.1:5672/")
	db, err := meshdb.Open(ctx, url, meshdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	km := &kitMesh{url: url, db: db, keys: map[string]seal.ContentKey{}}
	if km.mesh, err = db.MeshID(ctx); err != nil {
		t.Fatal(err)
	}
	if km.kit, err = seal.NewKit(km.mesh); err != nil {
		t.Fatal(err)
	}
	if _, err := db.SetRecoveryKit(ctx, km.kit.Public(), false); err != nil {
		t.Fatal(err)
	}
	if _, err := db.AddNode(ctx, cache.NodeRecord{Name: "alpha"}); err != nil {
		t.Fatal(err)
	}
	if km.alpha, err = seal.GenerateNodeKey(); err != nil {
		t.Fatal(err)
	}
	if err := db.PublishNodeKey(ctx, "alpha", km.alpha.Public()); err != nil {
		t.Fatal(err)
	}
	km.claimAll(t, true)
	return km
}

// claimAll makes alpha hold every content key nobody holds, and seal it
// for the kit when forKit.
func (km *kitMesh) claimAll(t *testing.T, forKit bool) {
	t.Helper()
	ctx := context.Background()
	keys, holders, err := km.db.ContentKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]bool{}
	for _, h := range holders {
		held[h.KeyID] = true
	}
	for _, k := range keys {
		if held[k.ID] {
			continue
		}
		ck, err := seal.ContentKeyFrom(k.ID, seal.NewContentKey().Bytes())
		if err != nil {
			t.Fatal(err)
		}
		sealed, err := seal.SealTo(km.alpha.Public(), seal.ContentKeyInfo(k.ID, "alpha"), ck.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := km.db.ClaimKey(ctx, k.ID, "alpha", km.alpha.Fingerprint(), sealed, ck.Commitment()); err != nil || !ok {
			t.Fatalf("alpha claims %s: %v %v", k.ID, ok, err)
		}
		km.keys[k.ID] = ck
		if forKit {
			km.sealForKit(t, k.ID)
		}
	}
}

// sealForKit seals alpha's key id for the kit, as its keeper does.
func (km *kitMesh) sealForKit(t *testing.T, id string) {
	t.Helper()
	blob, err := seal.SealTo(km.kit.Public(), seal.KitKeyInfo(id, km.mesh), km.keys[id].Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := km.db.PutKitKey(context.Background(), id, "alpha", km.kit.Fingerprint(), blob); err != nil || !ok {
		t.Fatalf("alpha seals %s for the kit: %v %v", id, ok, err)
	}
}

// sealedFor checks that copies, sealed for a node whose key is nk, are
// exactly the keys ids, each opening to the key alpha made.
func (km *kitMesh) sealedFor(t *testing.T, node string, nk *seal.NodeKey, copies []meshdb.SealedCopy, ids ...string) {
	t.Helper()
	if len(copies) != len(ids) {
		t.Fatalf("copies for %s: %d, want %v", node, len(copies), ids)
	}
	for i, c := range copies {
		raw, err := nk.Open(seal.ContentKeyInfo(c.ID, node), c.Sealed)
		if c.ID != ids[i] || err != nil || !bytes.Equal(raw, km.keys[c.ID].Bytes()) {
			t.Fatalf("copy %d for %s: key %s (%v), want %s opening to alpha's key", i, node, c.ID, err, ids[i])
		}
	}
}

// TestKitAfterRotation: a key rotated since the kit's copies were sealed
// makes the kit stale until a node that holds the key seals it for the
// kit: until then adding a node with it is refused, naming the key and
// its holders and what to do; --lost-keys, for a key whose holders are
// all lost, adds the node with the rest, and names only such keys. A
// replaced kit is refused. The control: a kit in step opens every key.
// mesh kit --check says the same without adding a node.
func TestKitAfterRotation(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	ctx := context.Background()
	km := newKitMesh(t)
	if len(km.keys) != 1 {
		t.Fatalf("alpha holds %d keys after init, want the mesh's one", len(km.keys))
	}
	var k1 string
	for id := range km.keys {
		k1 = id
	}
	nk, copies, err := kitKeysForNode(ctx, km.db, km.kit, "gamma", newNodeOptions{})
	if err != nil {
		t.Fatalf("the kit in step: %v", err)
	}
	km.sealedFor(t, "gamma", nk, copies, k1)
	kitFile := filepath.Join(t.TempDir(), "mesh.kit")
	if err := writeKitFile(kitFile, km.kit); err != nil {
		t.Fatal(err)
	}
	c := cli{env: map[string]string{"MESHBOX_DB": km.url, "MESHBOX_BROKER_ADMIN": "http://admin:secret@127.0.0.1:1"}}
	if out := c.ok(t, "mesh", "kit", "--check", kitFile); !strings.Contains(strings.Join(strings.Fields(out), " "), k1+" the mesh opens it") || !strings.Contains(out, "opens every key nodes hold (1)") {
		t.Errorf("mesh kit --check, the kit in step:\n%s", out)
	}

	k2, _, err := km.db.RotateKey(ctx, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// Nobody holds k2 yet: the new node makes it itself.
	if _, copies, err := kitKeysForNode(ctx, km.db, km.kit, "gamma", newNodeOptions{}); err != nil || len(copies) != 1 {
		t.Fatalf("a rotated key nobody holds yet: %d copies, %v; want k1 and no error", len(copies), err)
	}
	km.claimAll(t, false) // alpha holds k2, and has not sealed it for the kit
	out, _, err := c.run(t, "mesh", "kit", "--check", kitFile)
	if err == nil || !strings.Contains(err.Error(), "lacks 1 keys that nodes hold") || !strings.Contains(strings.Join(strings.Fields(out), " "), k2+" the mesh has no copy: held by alpha") {
		t.Errorf("mesh kit --check, a stale kit: %v\n%s", err, out)
	}
	_, _, err = kitKeysForNode(ctx, km.db, km.kit, "gamma", newNodeOptions{})
	for _, want := range []string{"no copy of content key " + k2 + " (held by alpha)", "Start one of them", "--lost-keys " + k2, "nothing was changed"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("a stale kit: %v, want an error saying %q", err, want)
		}
	}
	for _, tc := range []struct{ lost, want string }{
		{k1, "the recovery kit opens that key"},
		{"nope", "not an active content key"},
	} {
		if _, _, err := kitKeysForNode(ctx, km.db, km.kit, "gamma", newNodeOptions{lostKeys: []string{k2, tc.lost}}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--lost-keys %s: %v, want %q", tc.lost, err, tc.want)
		}
	}
	nk, copies, err = kitKeysForNode(ctx, km.db, km.kit, "gamma", newNodeOptions{lostKeys: []string{k2}})
	if err != nil {
		t.Fatalf("--lost-keys %s: %v", k2, err)
	}
	km.sealedFor(t, "gamma", nk, copies, k1)

	// alpha's keeper seals k2 for the kit: the same kit opens both.
	km.sealForKit(t, k2)
	nk, copies, err = kitKeysForNode(ctx, km.db, km.kit, "gamma", newNodeOptions{})
	if err != nil {
		t.Fatalf("the kit in step after the rotation: %v", err)
	}
	km.sealedFor(t, "gamma", nk, copies, k1, k2)

	// Another mesh's kit is refused.
	otherKit, err := seal.NewKit("mesh-other")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := kitKeysForNode(ctx, km.db, otherKit, "gamma", newNodeOptions{}); !errors.Is(err, seal.ErrBadKit) ||
		!strings.Contains(err.Error(), "it is the kit of mesh mesh-other, this mesh is "+km.mesh) {
		t.Errorf("another mesh's kit: %v, want ErrBadKit naming both meshes", err)
	}

	// A replaced kit is refused through the command, and nothing is added.
	old := filepath.Join(t.TempDir(), "old.kit")
	if err := writeKitFile(old, km.kit); err != nil {
		t.Fatal(err)
	}
	kit2, err := seal.NewKit(km.mesh)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := km.db.SetRecoveryKit(ctx, kit2.Public(), true); err != nil {
		t.Fatal(err)
	}
	c.fails(t, "is not the mesh's current kit", "mesh", "node", "add", "gamma", "--kit", old)
	c.fails(t, "is not the mesh's current kit", "mesh", "kit", "--check", old)
	_, _, err = kitKeysForNode(ctx, km.db, km.kit, "gamma", newNodeOptions{})
	if !errors.Is(err, seal.ErrBadKit) || !strings.Contains(err.Error(), "it was replaced; use the newest kit") {
		t.Errorf("a replaced kit: %v, want ErrBadKit saying to use the newest", err)
	}
	if ok, err := km.db.NodeExists(ctx, "gamma"); err != nil || ok {
		t.Errorf("gamma recorded after a refused node add: %v %v", ok, err)
	}
	if b, _ := os.ReadFile(old); !bytes.Contains(b, []byte(km.kit.Words())) {
		t.Error("the old kit's file changed")
	}
}
