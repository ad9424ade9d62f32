package meshdb_test

import (
	"context"
	"crypto/rand"
	"errors"
	neturl "net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// addNode adds node with a broker credential and a join token of ttl and
// drops its role in Cleanup (roles outlive the test's database).
func addNode(tb testing.TB, db *meshdb.DB, adminURL, node string, ttl time.Duration) meshdb.AddedNode {
	tb.Helper()
	added, err := db.AddNodeIdentity(context.Background(), adminURL, meshdb.NewNode{
		Record: cache.NodeRecord{Name: node},
		Broker: meshdb.BrokerCredential{Generation: 1, User: "node." + node + ".g1", Password: cache.Credential("broker-secret-of-" + node)},
		TTL:    ttl,
	})
	if err != nil {
		tb.Fatalf("add node %s: %v", node, err)
	}
	tb.Cleanup(func() { _, _ = db.RemoveNode(context.Background(), node, true) })
	return added
}

// TestNodeRoleSeesOnlyItsOwnRows connects as two nodes' roles and checks,
// with plain SQL, that PostgreSQL filters grants, assignments, overrides
// and credentials to the node's own, while every node record and setting
// stays readable, and that writes are refused.
func TestNodeRoleSeesOnlyItsOwnRows(t *testing.T) {
	db, url := initMesh(t)
	ctx := context.Background()
	a := addNode(t, db, url, "alpha", 0)
	addNode(t, db, url, "beta", 0)
	if !strings.HasPrefix(a.Role, "meshbox_node_alpha_") || len(a.Role) > 63 {
		t.Fatalf("role name: got %q", a.Role)
	}
	for _, node := range []string{"alpha", "beta"} {
		withKey(t, db, node)
		must(t)(db.Grant(ctx, cache.Grant{Consumer: node, Resource: "res-" + node, Provider: "p", Credential: cache.Credential("cred-" + node)}))
		must(t)(db.Assign(ctx, node, cache.Assignment{Module: "mod-" + node}))
		must(t)(db.SetOverride(ctx, node, cache.Override{Module: "mod-" + node, Key: "k", Value: "v-" + node}))
	}

	conn, err := pgx.Connect(ctx, a.Token.DB)
	if err != nil {
		t.Fatalf("connect as alpha's role: %v", err)
	}
	defer conn.Close(ctx)
	queries := []struct {
		query string
		want  []string
	}{
		// The credential only sealed (TestGrantCredentialSealed opens it).
		{`SELECT consumer || '/' || credential || '/' || (length(sealed_credential) > 0) FROM grants ORDER BY 1`, []string{"alpha//true"}},
		{`SELECT consumer FROM grants WHERE consumer = 'beta'`, nil},
		{`SELECT node || '/' || module FROM assignments ORDER BY 1`, []string{"alpha/mod-alpha"}},
		{`SELECT node || '/' || value FROM overrides ORDER BY 1`, []string{"alpha/v-alpha"}},
		// The broker password only sealed (with the join token's login).
		{`SELECT node || '/' || broker_user || '/' || broker_password || '/' || sealed_with FROM node_credentials ORDER BY 1`,
			[]string{"alpha/node.alpha.g1//login"}},
		{`SELECT broker_password FROM node_credentials WHERE node = 'beta'`, nil},
		{`SELECT name FROM nodes ORDER BY 1`, []string{"alpha", "beta", "n1"}},
		{`SELECT key FROM settings ORDER BY 1`, []string{"broker.url"}},
	}
	for _, q := range queries {
		var got []string
		rows, err := conn.Query(ctx, q.query)
		if err != nil {
			t.Fatalf("%s: %v", q.query, err)
		}
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			got = append(got, s)
		}
		if err := rows.Err(); err != nil {
			t.Fatalf("%s: %v", q.query, err)
		}
		if strings.Join(got, ",") != strings.Join(q.want, ",") {
			t.Errorf("as alpha: %s: got %q, want %q", q.query, got, q.want)
		}
	}
	for _, stmt := range []string{
		`SELECT count(*) FROM join_tokens`,
		`SELECT count(*) FROM node_roles`,
		`UPDATE grants SET credential = 'x'`,
		`INSERT INTO grants (consumer, resource, provider) VALUES ('alpha', 'r', 'p')`,
		`DELETE FROM node_credentials`,
		`UPDATE settings SET value = 'amqp://evil/'`,
		`CREATE TABLE evil (x int)`,
	} {
		if _, err := conn.Exec(ctx, stmt); err == nil {
			t.Errorf("as alpha: %s: allowed, want permission denied", stmt)
		}
	}

	// The node's own loader and credential reader, as the node role.
	nodeDB := openDB(t, a.Token.DB)
	snap, err := nodeDB.Load(ctx, "beta") // asks for another node's bindings
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Bindings.Grants)+len(snap.Bindings.Assignments)+len(snap.Bindings.Overrides) != 0 || snap.Bindings.Broker != nil {
		t.Errorf("alpha's role loading beta's bindings: got %+v, want no grants, assignments, overrides or broker credential", snap.Bindings)
	}
	// Its own bindings hold its newest broker credential, part of the hash.
	own, err := nodeDB.Load(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	if c := own.Bindings.Broker; c == nil || c.User != "node.alpha.g1" || c.Password.Reveal() != "broker-secret-of-alpha" || c.Generation != 1 || c.CreatedAt.IsZero() {
		t.Errorf("alpha's bindings: broker credential %+v, want generation 1 node.alpha.g1 with its password", c)
	}
	without := own.Bindings
	without.Broker = nil
	if without.Hash() == own.Hash {
		t.Error("the broker credential is not part of the bindings' hash")
	}
	if creds, err := nodeDB.BrokerCredentials(ctx, "beta"); err != nil || len(creds) != 0 {
		t.Errorf("alpha's role reading beta's broker credentials: got %d rows, %v; want none", len(creds), err)
	}
	creds, err := nodeDB.BrokerCredentials(ctx, "alpha")
	if err != nil || len(creds) != 1 || creds[0].User != "node.alpha.g1" || creds[0].Password != "" {
		t.Fatalf("alpha's own broker credential: got %+v, %v", creds, err)
	}

	// LISTEN/NOTIFY works under the node role.
	notified := make(chan struct{}, 16)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { // exits when wctx is cancelled below
		defer close(done)
		_ = nodeDB.Watch(wctx, func() { notified <- struct{}{} }, func(error) {})
	}()
	defer func() { cancel(); <-done }()
	select {
	case <-notified: // LISTEN in place
	case <-time.After(10 * time.Second):
		t.Fatal("watch as alpha's role: never listening")
	}
	must(t)(db.SetSetting(ctx, "forge.url", "https://forge.example.org"))
	select {
	case <-notified:
	case <-time.After(10 * time.Second):
		t.Fatal("watch as alpha's role: no notification of a setting change")
	}
}

// TestJoinTokenOnceAndExpiring redeems a token as its node role: it works
// once; again it says when it was used; an expired token says when it
// expired; another node's role cannot use it.
func TestJoinTokenOnceAndExpiring(t *testing.T) {
	db, url := initMesh(t)
	ctx := context.Background()
	a := addNode(t, db, url, "alpha", time.Hour)

	line := a.Token.Encode()
	if strings.ContainsAny(line, " \n\t") {
		t.Fatalf("token is not one word: %q", line)
	}
	tok, err := meshdb.ParseJoinToken(line)
	if err != nil || tok.DB != a.Token.DB || tok.Secret != a.Token.Secret || tok.Node != "alpha" {
		t.Fatalf("parse token: got %+v, %v", tok, err)
	}
	if strings.Contains(a.Token.String(), a.Token.Secret) {
		t.Error("the token's String shows its secret")
	}
	var stored []byte
	if err := pgxQueryRow(t, url, `SELECT secret_sha256 FROM join_tokens WHERE id = $1`, tok.ID, &stored); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(stored), tok.Secret) || len(stored) != 32 {
		t.Errorf("the database stores %d bytes for the secret, want its 32-byte SHA-256", len(stored))
	}

	nodeDB := openDB(t, tok.DB)
	wrong := tok
	wrong.Secret = "nope"
	if _, err := nodeDB.Redeem(ctx, wrong); !errors.Is(err, meshdb.ErrTokenUnknown) {
		t.Errorf("wrong secret: got %v, want ErrTokenUnknown", err)
	}
	node, err := nodeDB.Redeem(ctx, tok)
	if err != nil || node != "alpha" {
		t.Fatalf("redeem: got %q, %v", node, err)
	}
	_, err = nodeDB.Redeem(ctx, tok)
	var used *meshdb.TokenUsedError
	if !errors.As(err, &used) || !strings.Contains(err.Error(), "token already used at ") {
		t.Errorf("second redeem: got %v, want token already used at ...", err)
	}

	b := addNode(t, db, url, "beta", time.Millisecond)
	time.Sleep(5 * time.Millisecond) // the token's validity is real time
	_, err = openDB(t, b.Token.DB).Redeem(ctx, b.Token)
	var expired *meshdb.TokenExpiredError
	if !errors.As(err, &expired) || !strings.Contains(err.Error(), "token expired at ") {
		t.Errorf("late redeem: got %v, want token expired at ...", err)
	}

	c := addNode(t, db, url, "gamma", time.Hour)
	if _, err := nodeDB.Redeem(ctx, c.Token); !errors.Is(err, meshdb.ErrTokenUnknown) {
		t.Errorf("alpha's role redeeming gamma's token: got %v, want ErrTokenUnknown", err)
	}
}

// TestAddNodeIdentityRefusesExistingNode: the node init recorded without
// an identity of its own gets one (a role, a credential, a join token);
// a node that has one is refused, and nothing changes.
func TestAddNodeIdentityRefusesExistingNode(t *testing.T) {
	db, url := initMesh(t)
	ctx := context.Background()
	if exists, identity, err := db.NodeHasIdentity(ctx, "n1"); err != nil || !exists || identity {
		t.Fatalf("init's first node: exists %v, identity %v, %v; want recorded without an identity", exists, identity, err)
	}
	first := addNode(t, db, url, "n1", time.Hour)
	if first.Role == "" || first.Token.Node != "n1" {
		t.Fatalf("identity for init's first node: %+v", first)
	}
	if exists, identity, err := db.NodeHasIdentity(ctx, "n1"); err != nil || !exists || !identity {
		t.Fatalf("after node add: exists %v, identity %v, %v; want an identity", exists, identity, err)
	}
	before := revision(t, db)
	_, err := db.AddNodeIdentity(ctx, url, meshdb.NewNode{
		Record: cache.NodeRecord{Name: "n1"},
		Broker: meshdb.BrokerCredential{Generation: 1, User: "node.n1.g1", Password: "x"},
	})
	if !errors.Is(err, meshdb.ErrExists) {
		t.Fatalf("got %v, want ErrExists", err)
	}
	if after := revision(t, db); after != before {
		t.Errorf("revision: got %d, want %d (nothing changed)", after, before)
	}
}

func TestParseJoinTokenRejects(t *testing.T) {
	for _, s := range []string{"", "hello", "meshbox-join-v1.!!!", "meshbox-join-v1." + "YQ"} {
		if _, err := meshdb.ParseJoinToken(s); !errors.Is(err, meshdb.ErrTokenFormat) {
			t.Errorf("ParseJoinToken(%q): got %v, want ErrTokenFormat", s, err)
		}
	}
}

func pgxQueryRow(tb testing.TB, url, query string, arg any, dst any) error {
	tb.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(context.Background(), query, arg).Scan(dst)
}

// TestWrongPasswordIsNotUnreachable: a database that answers and refuses
// the login says so, naming the user, and is not called unreachable.
func TestWrongPasswordIsNotUnreachable(t *testing.T) {
	pg := meshtest.Postgres(t)
	url := pg.Database(t)
	role := "meshdb_wrong_pw_" + strings.ToLower(rand.Text()[:6])
	pg.Exec(t, "CREATE ROLE "+role+" LOGIN PASSWORD 'right-password'")
	t.Cleanup(func() { _ = pg.ExecContext(context.Background(), "DROP ROLE IF EXISTS "+role) })
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	u.User = neturl.UserPassword(role, "wrong-password")
	db, err := meshdb.Open(context.Background(), u.String(), meshdb.Options{ConnectTimeout: 2 * time.Second})
	if err == nil {
		defer db.Close()
		_, err = db.Revision(context.Background())
		if err == nil {
			err = db.Ping(context.Background())
		}
	}
	if !errors.Is(err, meshdb.ErrLoginRefused) || !strings.Contains(err.Error(), "refused the login of user "+role) ||
		!strings.Contains(err.Error(), "wrong password") || strings.Contains(err.Error(), " unreachable:") {
		t.Fatalf("got %v, want the login refused, naming %s, not unreachable", err, role)
	}
}

// TestCheckCanAddNodes: a database user without CREATEROLE is told what
// to run; the superuser (control) may add nodes.
func TestCheckCanAddNodes(t *testing.T) {
	pg := meshtest.Postgres(t)
	url := pg.Database(t)
	if err := openDB(t, url).CheckCanAddNodes(context.Background()); err != nil {
		t.Fatalf("superuser: %v, want nil", err)
	}
	role := "meshdb_nocreaterole_" + strings.ToLower(rand.Text()[:6])
	pg.Exec(t, "CREATE ROLE "+role+" LOGIN PASSWORD 'pw'")
	t.Cleanup(func() { _ = pg.ExecContext(context.Background(), "DROP ROLE IF EXISTS "+role) })
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	u.User = neturl.UserPassword(role, "pw")
	err = openDB(t, u.String()).CheckCanAddNodes(context.Background())
	if err == nil || !strings.Contains(err.Error(), "database user "+role+" may not create roles") || !strings.Contains(err.Error(), "ALTER ROLE "+role+" CREATEROLE") {
		t.Fatalf("got %v, want it to say %s may not create roles and the ALTER ROLE that fixes it", err, role)
	}
}
