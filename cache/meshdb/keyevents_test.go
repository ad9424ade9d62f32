package meshdb_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/internal/seal"
)

// TestRemoveCompromised: gamma, in scope vault (not in other), holds the
// mesh's key and vault's; removed as compromised, its database session
// ends and reads nothing, the keys it held are marked compromised and
// retire after the retention, the mesh and vault get a new key each,
// other's key is untouched, and the history records the copies made,
// sealed and revoked, the rotations and the removal. An unknown node
// changes nothing.
func TestRemoveCompromised(t *testing.T) {
	db, url := initMesh(t)
	ctx := context.Background()
	a := addNode(t, db, url, "alpha", 0)
	addNode(t, db, url, "beta", 0)
	g := addNode(t, db, url, "gamma", 0)
	adb, gdb := openDB(t, a.Token.DB), openDB(t, g.Token.DB)
	keys := map[string]*seal.NodeKey{}
	for node, ndb := range map[string]*meshdb.DB{"alpha": adb, "gamma": gdb} {
		k, err := seal.GenerateNodeKey()
		if err != nil {
			t.Fatal(err)
		}
		if err := ndb.PublishNodeKey(ctx, node, k.Public()); err != nil {
			t.Fatal(err)
		}
		keys[node] = k
	}
	must(t)(db.AddScope(ctx, "vault", []string{"alpha", "gamma"}))
	must(t)(db.AddScope(ctx, "other", []string{"alpha", "beta"}))
	byScope := map[string]string{}
	snap, err := adb.Load(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	for _, ck := range snap.Bindings.ContentKeys {
		byScope[ck.Scope] = ck.ID
	}
	// alpha makes every key and seals the mesh's and vault's for gamma.
	for _, sc := range []string{"", "vault", "other"} {
		id := byScope[sc]
		ck, err := seal.ContentKeyFrom(id, seal.NewContentKey().Bytes())
		if err != nil {
			t.Fatal(err)
		}
		sealed, _ := seal.SealTo(keys["alpha"].Public(), seal.ContentKeyInfo(id, "alpha"), ck.Bytes())
		if ok, err := adb.ClaimKey(ctx, id, "alpha", keys["alpha"].Fingerprint(), sealed, ck.Commitment()); err != nil || !ok {
			t.Fatalf("alpha claims %s: %v %v", id, ok, err)
		}
		if sc == "other" {
			continue
		}
		sealed, _ = seal.SealTo(keys["gamma"].Public(), seal.ContentKeyInfo(id, "gamma"), ck.Bytes())
		if ok, err := adb.PutSealedKey(ctx, id, "alpha", "gamma", keys["gamma"].Fingerprint(), sealed); err != nil || !ok {
			t.Fatalf("alpha seals %s for gamma: %v %v", id, ok, err)
		}
	}
	if _, err := gdb.Load(ctx, "gamma"); err != nil {
		t.Fatalf("gamma reads its bindings before: %v", err)
	}

	before := revision(t, db)
	if _, err := db.RemoveCompromised(ctx, "nosuch", false, time.Hour); !errors.Is(err, meshdb.ErrNotFound) {
		t.Errorf("remove unknown node as compromised: got %v, want ErrNotFound", err)
	}
	if got := revision(t, db); got != before {
		t.Errorf("a refused removal changed the revision from %d to %d", before, got)
	}

	comp, err := db.RemoveCompromised(ctx, "gamma", false, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{byScope[""], byScope["vault"]}; !slices.Equal(comp.Compromised, sorted(want)) || !slices.Equal(comp.Scopes, []string{"vault"}) {
		t.Errorf("compromised %v in scopes %v, want %v in [vault]", comp.Compromised, comp.Scopes, sorted(want))
	}
	if comp.NewKeys[""] == "" || comp.NewKeys["vault"] == "" || len(comp.NewKeys) != 2 || !comp.Change.Changed {
		t.Errorf("new keys %v (change %+v), want one for the mesh and one for vault", comp.NewKeys, comp.Change)
	}
	if len(comp.Sessions.Roles) == 0 || comp.Sessions.EndErr != nil {
		t.Errorf("gamma's roles %v, ending their sessions: %v", comp.Sessions.Roles, comp.Sessions.EndErr)
	}
	if _, err := gdb.Load(ctx, "gamma"); err == nil {
		t.Error("gamma's database session reads its bindings after its removal as compromised")
	}
	snap, err = adb.Load(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	for _, ck := range snap.Bindings.ContentKeys {
		old := slices.Contains(comp.Compromised, ck.ID)
		if ck.Compromised != old {
			t.Errorf("key %s (scope %q): compromised %v, want %v", ck.ID, ck.Scope, ck.Compromised, old)
		}
		if old && (ck.RetireAt == nil || ck.RetireAt.Sub(time.Now()) < 50*time.Minute) {
			t.Errorf("compromised key %s retires at %v, want in an hour", ck.ID, ck.RetireAt)
		}
		if ck.ID == byScope["other"] && ck.RetireAt != nil {
			t.Errorf("other's key %s retires: gamma was not in other", ck.ID)
		}
	}

	// A key whose retention ended is listed as retired once, before and
	// after the rotation that deletes it.
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `UPDATE content_keys SET retire_at = now() - interval '1 second' WHERE id = $1`, byScope["other"]); err != nil {
		t.Fatal(err)
	}
	retired := func() int {
		h, err := db.KeyHistory(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return count(h, meshdb.KeyRetired, byScope["other"], "", "")
	}
	if n := retired(); n != 1 {
		t.Errorf("other's retired key listed %d times as retired, want 1", n)
	}
	if _, _, err := db.RotateScopeKey(ctx, "other", 0); err != nil {
		t.Fatal(err)
	}
	if n := retired(); n != 1 {
		t.Errorf("other's retired key, deleted by a rotation, listed %d times as retired, want 1", n)
	}

	h, err := db.KeyHistory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct{ kind, key, holder, detail string }{
		{meshdb.KeyMade, byScope[""], "alpha", ""},
		{meshdb.KeySealed, byScope["vault"], "gamma", ""},
		{meshdb.KeyRevoked, byScope[""], "gamma", "node gamma removed as compromised"},
		{meshdb.KeyRevoked, byScope["vault"], "gamma", "node gamma removed as compromised"},
		{meshdb.KeyRevoked, "", "gamma", "marked compromised and rotated"},
		{meshdb.KeyRotated, comp.NewKeys[""], "", "replaces " + byScope[""] + "; node gamma removed as compromised"},
		{meshdb.KeyRotated, comp.NewKeys["vault"], "", "replaces " + byScope["vault"] + "; node gamma removed as compromised"},
	} {
		if count(h, w.kind, w.key, w.holder, w.detail) != 1 {
			t.Errorf("want one %s event of key %q, holder %q, detail %q; history:\n%s", w.kind, w.key, w.holder, w.detail, dumpHistory(h))
		}
	}
	if n := count(h, meshdb.KeyRevoked, byScope["other"], "*", ""); n != 0 {
		t.Errorf("%d revoked events of other's key, want none", n)
	}
}

// count counts the events of kind, key and holder ("*": any) whose detail
// holds detail.
func count(h []meshdb.KeyEvent, kind, key, holder, detail string) int {
	n := 0
	for _, e := range h {
		if e.Kind == kind && e.Key == key && (holder == "*" || e.Holder == holder) && strings.Contains(e.Detail, detail) {
			n++
		}
	}
	return n
}

func dumpHistory(h []meshdb.KeyEvent) string {
	var b strings.Builder
	for _, e := range h {
		b.WriteString(e.At.Format(time.RFC3339) + " " + e.Kind + " " + e.Key + " " + e.Scope + " " + e.Holder + " " + e.By + " " + e.Detail + "\n")
	}
	return b.String()
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}
