package meshdb_test

import (
	"bytes"
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/internal/seal"
)

// tokenPassword returns the password of a join token's database login.
func tokenPassword(tb testing.TB, tok meshdb.JoinToken) string {
	tb.Helper()
	u, err := url.Parse(tok.DB)
	if err != nil {
		tb.Fatal(err)
	}
	pw, _ := u.User.Password()
	return pw
}

// openWithKey opens url as a node holding k, closed in Cleanup.
func openWithKey(tb testing.TB, url string, k *seal.NodeKey) *meshdb.DB {
	tb.Helper()
	db, err := meshdb.Open(context.Background(), url, meshdb.Options{NodeKey: k})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	return db
}

// adminConn connects to url, closed in Cleanup.
func adminConn(tb testing.TB, url string) *pgx.Conn {
	tb.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// credentialDump is everything the database admin reads of the mesh's
// credentials: node_credentials, join_tokens and the roles' stored
// passwords, as text.
func credentialDump(tb testing.TB, url string) string {
	tb.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close(ctx)
	var b strings.Builder
	for _, q := range []string{
		`SELECT row_to_json(c)::text FROM node_credentials c`,
		`SELECT row_to_json(j)::text FROM join_tokens j`,
		// The catalog's stored passwords of the mesh's roles (a superuser's
		// view; the test's admin may read it or not).
		`SELECT coalesce(rolpassword, '') FROM pg_authid WHERE rolname LIKE 'meshbox_node_%'`,
	} {
		rows, err := conn.Query(ctx, q)
		if err != nil {
			if strings.Contains(q, "pg_authid") {
				continue
			}
			tb.Fatal(err)
		}
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				tb.Fatal(err)
			}
			b.WriteString(s + "\n")
		}
		rows.Close()
	}
	return b.String()
}

// TestCredentialRowsSealed walks a node's credential through its life as
// the database stores it: node add, a rotation, a rejoin. No broker or
// database password is ever in a row, a join token's row or the roles'
// stored passwords; the node opens each generation (with its join token's
// login, or with its key), and a node whose key changed is told so.
func TestCredentialRowsSealed(t *testing.T) {
	db, adminURL := initMesh(t)
	ctx := context.Background()
	a := addNode(t, db, adminURL, "alpha", 0)
	secrets := map[string]string{
		"generation 1's broker password": "broker-secret-of-alpha",
		"generation 1's login password":  tokenPassword(t, a.Token),
	}
	leaks := func(when string) {
		t.Helper()
		dump := credentialDump(t, adminURL)
		for what, s := range secrets {
			if strings.Contains(dump, s) {
				t.Errorf("%s: the database holds %s", when, what)
			}
		}
	}
	leaks("after node add")

	// The join token's login opens generation 1; another login does not.
	k, err := seal.GenerateNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	nodeDB := openWithKey(t, a.Token.DB, k)
	snap, err := nodeDB.Load(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	if b := snap.Bindings.Broker; b == nil || b.Password != "broker-secret-of-alpha" || b.DBRole != "" || b.DBPassword != "" {
		t.Fatalf("generation 1 as alpha loads it: %+v, want its broker password and no role of its own", b)
	}
	var sealed *meshdb.CredentialSealedError
	if _, err := openWithKey(t, adminURL, k).Load(ctx, "alpha"); !errors.As(err, &sealed) || sealed.Generation != 1 || sealed.SealedFor != "" {
		t.Errorf("generation 1 loaded with another login: got %v, want a CredentialSealedError for generation 1", err)
	}

	// Rotation: both passwords sealed to alpha's key.
	if err := nodeDB.PublishNodeKey(ctx, "alpha", k.Public()); err != nil {
		t.Fatal(err)
	}
	_, role2, err := db.AddCredentialGeneration(ctx, "alpha", meshdb.BrokerCredential{Generation: 2, User: "node.alpha.g2", Password: "broker-secret-2"})
	if err != nil {
		t.Fatal(err)
	}
	snap, err = nodeDB.Load(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	b := snap.Bindings.Broker
	if b == nil || b.Generation != 2 || b.Password != "broker-secret-2" || b.DBRole != role2 || len(b.DBPassword) < 32 {
		t.Fatalf("generation 2 as alpha loads it: %+v, want its passwords opened", b)
	}
	secrets["generation 2's broker password"] = "broker-secret-2"
	secrets["generation 2's login password"] = b.DBPassword.Reveal()
	leaks("after a rotation")
	// The row is alpha's only: moved to another generation it does not
	// open, and the login's password logs in.
	if err := nodeDB.SwitchLogin(ctx, role2, b.DBPassword.Reveal()); err != nil {
		t.Fatalf("log in with generation 2's opened password: %v", err)
	}
	var sb, sd []byte
	var fpr string
	if err := adminConn(t, adminURL).QueryRow(ctx, `SELECT sealed_broker_password, sealed_db_password, sealed_for FROM node_credentials
		WHERE node = 'alpha' AND generation = 2`).Scan(&sb, &sd, &fpr); err != nil {
		t.Fatal(err)
	}
	if fpr != k.Fingerprint() {
		t.Errorf("sealed for %s, want alpha's key %s", fpr, k.Fingerprint())
	}
	if _, err := k.Open(seal.CredentialInfo("alpha", 3, seal.PurposeBroker), sb); err == nil {
		t.Error("generation 2's sealed broker password opens as generation 3's")
	}
	if _, err := k.Open(seal.CredentialInfo("alpha", 2, seal.PurposeBroker), sd); err == nil {
		t.Error("generation 2's sealed database password opens as its broker password")
	}
	if bytes.Contains(sb, []byte("broker-secret-2")) {
		t.Error("the sealed form holds the plain text")
	}

	// A node whose key changed is told which key its row is sealed to.
	other, err := seal.GenerateNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	_, err = openWithKey(t, a.Token.DB, other).Load(ctx, "alpha")
	if !errors.As(err, &sealed) || !errors.Is(err, meshdb.ErrCredentialSealed) || sealed.SealedFor != k.Fingerprint() || sealed.NodeKey != other.Fingerprint() {
		t.Fatalf("load with another key: got %v, want a CredentialSealedError naming both keys", err)
	}
	if !strings.Contains(err.Error(), "meshbox mesh node rejoin alpha") {
		t.Errorf("the error does not name the way out: %v", err)
	}

	// Rejoin: sealed under the new token's login, which opens it without
	// the key.
	re, err := db.ReissueJoin(ctx, adminURL, "alpha", meshdb.BrokerCredential{Generation: 3, User: "node.alpha.g3", Password: "broker-secret-3"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	snap, err = openWithKey(t, re.Token.DB, other).Load(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	if b := snap.Bindings.Broker; b == nil || b.Generation != 3 || b.Password != "broker-secret-3" || b.DBRole != re.Role || b.DBPassword.Reveal() != tokenPassword(t, re.Token) {
		t.Fatalf("generation 3 after rejoin: %+v", b)
	}
	secrets["generation 3's broker password"] = "broker-secret-3"
	secrets["generation 3's login password"] = tokenPassword(t, re.Token)
	leaks("after a rejoin")
}

// TestPlainCredentialRowsStillRead: a row written before credentials were
// sealed (plain text, as an older meshbox wrote it) loads as before.
func TestPlainCredentialRowsStillRead(t *testing.T) {
	db, adminURL := initMesh(t)
	ctx := context.Background()
	a := addNode(t, db, adminURL, "alpha", 0)
	conn := adminConn(t, adminURL)
	if _, err := conn.Exec(ctx, `UPDATE node_credentials SET broker_password = 'plain-old', sealed_with = NULL, sealed_broker_password = NULL WHERE node = 'alpha'`); err != nil {
		t.Fatal(err)
	}
	snap, err := openDB(t, a.Token.DB).Load(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	if b := snap.Bindings.Broker; b == nil || b.Password != "plain-old" {
		t.Fatalf("a plain row: %+v, want its password as stored", b)
	}
	// A sealed row with its plain text too is refused by the database.
	if _, err := conn.Exec(ctx, `UPDATE node_credentials SET sealed_with = 'login', sealed_broker_password = '\x00' WHERE node = 'alpha'`); err == nil {
		t.Error("a sealed row with a plain password was accepted")
	}
}
