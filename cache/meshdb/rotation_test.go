package meshdb_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/meshbox/meshbox/cache/meshdb"
)

// TestCredentialRotationRows walks a rotation through the database: the
// admin adds generation 2 (a broker user's row and a new database role),
// the node reads it with its bindings, switches its database login to the
// new role (the old one still works until then) and records that it
// switched (through its own role, only for itself, and only as the new
// role); the admin then revokes generation 1, which drops the old role.
func TestCredentialRotationRows(t *testing.T) {
	db, url := initMesh(t)
	ctx := context.Background()
	a := addNode(t, db, url, "alpha", 0)
	addNode(t, db, url, "beta", 0)

	// A node that has not published its key gets no generation: it could
	// not open it.
	_, _, err := db.AddCredentialGeneration(ctx, "alpha", meshdb.BrokerCredential{Generation: 2, User: "node.alpha.g2", Password: "x"})
	if !errors.Is(err, meshdb.ErrNoPublicKey) {
		t.Errorf("a node without a public key: got %v, want ErrNoPublicKey", err)
	}
	k := withKey(t, db, "alpha")
	_, _, err = db.AddCredentialGeneration(ctx, "alpha", meshdb.BrokerCredential{Generation: 1, User: "node.alpha.g1", Password: "x"})
	if !errors.Is(err, meshdb.ErrExists) {
		t.Errorf("adding generation 1 again: got %v, want ErrExists", err)
	}
	_, _, err = db.AddCredentialGeneration(ctx, "nobody", meshdb.BrokerCredential{Generation: 2, User: "node.nobody.g2", Password: "x"})
	if !errors.Is(err, meshdb.ErrNotFound) {
		t.Errorf("unknown node: got %v, want ErrNotFound", err)
	}
	ch, role2, err := db.AddCredentialGeneration(ctx, "alpha", meshdb.BrokerCredential{Generation: 2, User: "node.alpha.g2", Password: "secret-2"})
	if err != nil || !ch.Changed || !strings.HasPrefix(role2, "meshbox_node_alpha_") || role2 == a.Role {
		t.Fatalf("add generation 2: %v %+v role %q (first role %q)", err, ch, role2, a.Role)
	}

	nodeDB, err := meshdb.Open(ctx, a.Token.DB, meshdb.Options{NodeKey: k})
	if err != nil {
		t.Fatal(err)
	}
	defer nodeDB.Close()
	snap, err := nodeDB.Load(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	b := snap.Bindings.Broker
	if b == nil || b.Generation != 2 || b.Password.Reveal() != "secret-2" || !b.SwitchedAt.IsZero() || len(b.Older) != 1 || b.Older[0] != 1 ||
		b.DBRole != role2 || len(b.DBPassword.Reveal()) < 32 {
		t.Fatalf("alpha's bindings: got %+v, want generation 2 with role %s, not switched, older [1]", b, role2)
	}
	// Still on the first role: the switch is not recorded.
	if err := nodeDB.CredentialSwitched(ctx, 2); !errors.Is(err, meshdb.ErrNotFound) {
		t.Errorf("switch recorded by the old role: got %v, want ErrNotFound", err)
	}
	if err := nodeDB.SwitchLogin(ctx, role2, "wrong"); err == nil || nodeDB.User() != a.Role {
		t.Fatalf("switch with a wrong password: got %v, user now %s; want an error and no change", err, nodeDB.User())
	}
	if err := nodeDB.SwitchLogin(ctx, role2, b.DBPassword.Reveal()); err != nil || nodeDB.User() != role2 {
		t.Fatalf("switch login: %v, user %s", err, nodeDB.User())
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
	if _, err := conn.Exec(ctx, `UPDATE node_credentials SET switched_at = now() WHERE node = 'beta'`); err == nil {
		t.Error("a node role updated node_credentials directly")
	}
	conn.Close(ctx)

	_, rev, err := db.DeleteCredentialGeneration(ctx, "alpha", 1)
	if err != nil {
		t.Fatal(err)
	}
	dropped := rev.Roles
	if rev.EndErr != nil || rev.Lingering != 0 {
		t.Errorf("ending the dropped role's sessions as the owner: %d left, %v", rev.Lingering, rev.EndErr)
	}
	if len(dropped) != 1 || dropped[0] != a.Role {
		t.Errorf("revoking generation 1 dropped %v, want [%s]", dropped, a.Role)
	}
	if conn, err := pgx.Connect(ctx, a.Token.DB); err == nil {
		conn.Close(ctx)
		t.Error("the first role still logs in after generation 1 was revoked")
	}
	snap, err = nodeDB.Load(ctx, "alpha")
	if err != nil {
		t.Fatalf("load as the new role after the old one was dropped: %v", err)
	}
	if b := snap.Bindings.Broker; b.Generation != 2 || len(b.Older) != 0 || b.SwitchedAt.IsZero() {
		t.Errorf("after revoking generation 1: got %+v, want generation 2, switched, nothing older", b)
	}
	// The new role reads only alpha's rows, like the first.
	if creds, err := nodeDB.BrokerCredentials(ctx, "beta"); err != nil || len(creds) != 0 {
		t.Errorf("the new role reads beta's credentials: %v %v", creds, err)
	}
}

// TestSetNodeStages replaces a node's stage allow-list and refuses bad
// input; the node reads its allow-list with its bindings, as a change of
// them.
func TestSetNodeStages(t *testing.T) {
	db, url := initMesh(t)
	ctx := context.Background()
	a := addNode(t, db, url, "alpha", 0)
	nodeDB, err := meshdb.Open(ctx, a.Token.DB, meshdb.Options{NodeKey: withKey(t, db, "alpha")})
	if err != nil {
		t.Fatal(err)
	}
	defer nodeDB.Close()
	before, err := nodeDB.Load(ctx, "alpha")
	if err != nil || before.Bindings.Stages == nil || len(before.Bindings.Stages) != 0 {
		t.Fatalf("alpha's bindings before set-stages: stages %#v %v, want none (an empty list)", before.Bindings.Stages, err)
	}
	if _, err := db.SetNodeStages(ctx, "alpha", []string{"resize", "thumbs"}); err != nil {
		t.Fatal(err)
	}
	got, err := db.NodeStages(ctx, "alpha")
	if err != nil || len(got) != 2 || got[0] != "resize" || got[1] != "thumbs" {
		t.Errorf("stages: got %v %v, want [resize thumbs]", got, err)
	}
	after, err := nodeDB.Load(ctx, "alpha")
	if err != nil || !slices.Equal(after.Bindings.Stages, []string{"resize", "thumbs"}) {
		t.Errorf("alpha's bindings after set-stages: stages %v %v, want [resize thumbs]", after.Bindings.Stages, err)
	}
	if after.Hash == before.Hash {
		t.Error("the bindings' hash did not change with the stages: a running node would not apply them")
	}
	if _, err := db.SetNodeStages(ctx, "nobody", []string{"x"}); !errors.Is(err, meshdb.ErrNotFound) {
		t.Errorf("unknown node: got %v, want ErrNotFound", err)
	}
	if _, err := db.SetNodeStages(ctx, "alpha", []string{"no spaces"}); err == nil {
		t.Error("an invalid stage name was accepted")
	}
}

// TestUseLoginRefusedFallsBack gives a node's DB a login from its cache
// the database refuses (a wrong password, a role that does not exist): the
// load fails once, the DB goes back to its URL's login, and the next load
// succeeds. A cached login that worked once is kept.
func TestUseLoginRefusedFallsBack(t *testing.T) {
	db, url := initMesh(t)
	ctx := context.Background()
	a := addNode(t, db, url, "alpha", 0)
	k := withKey(t, db, "alpha")
	_, role2, err := db.AddCredentialGeneration(ctx, "alpha", meshdb.BrokerCredential{Generation: 2, User: "node.alpha.g2", Password: "secret-2"})
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct{ user, password string }{{role2, "wrong"}, {"meshbox_node_alpha_gone", "x"}} {
		nodeDB, err := meshdb.Open(ctx, a.Token.DB, meshdb.Options{NodeKey: k})
		if err != nil {
			t.Fatal(err)
		}
		nodeDB.UseLogin(bad.user, bad.password)
		if _, err := nodeDB.Load(ctx, "alpha"); err == nil {
			t.Errorf("load as %s with a wrong password: no error", bad.user)
		}
		if nodeDB.User() != a.Role {
			t.Errorf("after the database refused %s: logs in as %s, want the URL's %s", bad.user, nodeDB.User(), a.Role)
		}
		if _, err := nodeDB.Load(ctx, "alpha"); err != nil {
			t.Errorf("load after going back to the URL's login: %v", err)
		}
		nodeDB.Close()
	}

	// A cached login that works stays, even if a later connection fails.
	snap, err := openWithKey(t, a.Token.DB, k).Load(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	nodeDB, err := meshdb.Open(ctx, a.Token.DB, meshdb.Options{NodeKey: k})
	if err != nil {
		t.Fatal(err)
	}
	defer nodeDB.Close()
	nodeDB.UseLogin(role2, snap.Bindings.Broker.DBPassword.Reveal())
	if _, err := nodeDB.Load(ctx, "alpha"); err != nil || nodeDB.User() != role2 {
		t.Fatalf("load as the cached %s: %v, user %s", role2, err, nodeDB.User())
	}
	if err := nodeDB.SwitchLogin(ctx, role2, "wrong"); err == nil || nodeDB.User() != role2 {
		t.Errorf("a refused switch after the cached login worked: %v, user %s; want an error and %s kept", err, nodeDB.User(), role2)
	}
}

// TestReissueJoin gives an existing node a new generation and a join
// token: the token's role is the generation's, it redeems once, and the
// node's record stays; an unknown node or an old generation is refused.
func TestReissueJoin(t *testing.T) {
	db, url := initMesh(t)
	ctx := context.Background()
	a := addNode(t, db, url, "alpha", 0)
	cred := func(gen int) meshdb.BrokerCredential {
		return meshdb.BrokerCredential{Generation: gen, User: fmt.Sprintf("node.alpha.g%d", gen), Password: "secret"}
	}
	if _, err := db.ReissueJoin(ctx, url, "nobody", cred(2), 0); !errors.As(err, new(*meshdb.NotFoundError)) {
		t.Errorf("reissue for an unknown node: got %v, want NotFoundError", err)
	}
	if _, err := db.ReissueJoin(ctx, url, "alpha", cred(1), 0); !errors.As(err, new(*meshdb.ExistsError)) {
		t.Errorf("reissue with generation 1 again: got %v, want ExistsError", err)
	}
	re, err := db.ReissueJoin(ctx, url, "alpha", cred(2), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if re.Role == a.Role || !strings.Contains(re.Token.DB, re.Role) || re.Token.Node != "alpha" || time.Until(re.Token.Expires) > time.Hour+time.Minute {
		t.Fatalf("reissued: role %q (first %q), token %+v", re.Role, a.Role, re.Token)
	}
	nodeDB, err := meshdb.Open(ctx, re.Token.DB, meshdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer nodeDB.Close()
	if node, err := nodeDB.Redeem(ctx, re.Token); err != nil || node != "alpha" {
		t.Fatalf("redeem the reissued token: %q, %v", node, err)
	}
	if _, err := nodeDB.Redeem(ctx, re.Token); !errors.As(err, new(*meshdb.TokenUsedError)) {
		t.Errorf("redeem it twice: got %v, want TokenUsedError", err)
	}
	snap, err := nodeDB.Load(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	// Sealed under the token's login, which opens it: the machine may
	// have lost its key.
	if b := snap.Bindings.Broker; b == nil || b.Generation != 2 || b.DBRole != re.Role || b.Password != "secret" || b.DBPassword.Reveal() != tokenPassword(t, re.Token) {
		t.Errorf("alpha's credential after reissue: %+v, want generation 2 with role %s and its passwords", b, re.Role)
	}
}
