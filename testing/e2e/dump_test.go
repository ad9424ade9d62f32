package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// dumpSecret is a grant's credential in TestDumpsHoldSecretsOnlySealed.
const dumpSecret = "nas-password-5e1b77"

// TestDumpsHoldSecretsOnlySealed runs a sealing mesh (alpha and beta, a
// scope held by both) and grants beta a credential through `meshbox mesh
// grant`. Then it dumps everything: the whole database with pg_dump as
// its owner, every table beta's own role can read with pg_dump as that
// role, and every snapshot in beta's cache file. The content keys (the
// mesh's and the scope's, opened with alpha's private key), alpha's
// private key and the grant's credential appear in none of them, in any
// encoding, while their sealed forms do.
func TestDumpsHoldSecretsOnlySealed(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	ctx := context.Background()
	rmq := meshtest.LeaseRabbitMQ(t)
	vhost := rmq.Vhost(t)
	pg := meshtest.Postgres(t)
	db := pg.Database(t)
	if code, _, errOut := cli(t, "init", "--db", db, "--node", "console", "--broker", meshtest.NoCredential(vhost)); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	alpha := joinedNode(t, db, rmq.AdminURL(), "alpha")
	beta, betaEnv := joinedNodeEnv(t, db, rmq.AdminURL(), "beta")
	waitSealing(t, alpha)
	waitSealing(t, beta)
	mesh(t, db, "scope", "add", "vault", "--nodes", "alpha,beta")
	if !meshtest.Poll(30*time.Second, func() bool {
		_, sa := nodeScopes(t, alpha)
		_, sb := nodeScopes(t, beta)
		return sa["vault"] != "" && sb["vault"] == sa["vault"]
	}) {
		t.Fatalf("alpha and beta do not hold one key of scope vault\n%s", beta.Output())
	}
	credFile := filepath.Join(t.TempDir(), "cred")
	if err := os.WriteFile(credFile, []byte(dumpSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	mesh(t, db, "grant", "beta", "nas-storage", "alpha", "--credential-file", credFile)
	rev, err := strconv.ParseInt(strings.TrimSpace(mesh(t, db, "revision")), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	meshtest.WaitStatus(t, beta.HTTPURL(), 30*time.Second, "beta at the grant's revision", func(s appliance.Status) bool {
		return s.Bindings.Source == "db" && s.Bindings.Revision >= rev
	})

	// The secrets, each in every form a dump could show it in.
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	keyText, err := os.ReadFile(filepath.Join(alpha.DataDir(), "node.key"))
	if err != nil {
		t.Fatal(err)
	}
	alphaKey, err := seal.ParseNodeKey(keyText)
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(keyText)) // "meshbox-node-key-v1 SEED"
	seed, err := base64.RawURLEncoding.DecodeString(f[len(f)-1])
	if err != nil || len(seed) < 16 {
		t.Fatalf("alpha's node.key: seed %d bytes, %v", len(seed), err)
	}
	secrets := map[string][]byte{
		"the grant's credential": []byte(dumpSecret),
		"alpha's private key":    seed,
	}
	rows, err := conn.Query(ctx, `SELECT s.key_id, coalesce(k.scope, ''), s.sealed FROM sealed_keys s JOIN content_keys k ON k.id = s.key_id WHERE s.node = 'alpha'`)
	if err != nil {
		t.Fatal(err)
	}
	scopes := map[string]bool{}
	for rows.Next() {
		var id, scope string
		var sealed []byte
		if err := rows.Scan(&id, &scope, &sealed); err != nil {
			t.Fatal(err)
		}
		key, err := alphaKey.Open(seal.ContentKeyInfo(id, "alpha"), sealed)
		if err != nil {
			t.Fatalf("alpha's copy of %s does not open with alpha's key: %v", id, err)
		}
		secrets["content key "+id+" of scope '"+scope+"'"] = key
		scopes[scope] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !scopes[""] || !scopes["vault"] {
		t.Fatalf("alpha holds keys of scopes %v, want the mesh's and vault's: the test proves nothing for the others", scopes)
	}
	leaks := func(where, text string) {
		t.Helper()
		for what, s := range secrets {
			for _, form := range []string{string(s), hex.EncodeToString(s), base64.StdEncoding.EncodeToString(s),
				base64.RawURLEncoding.EncodeToString(s), base64.RawStdEncoding.EncodeToString(s)} {
				if len(form) >= 16 && strings.Contains(text, form) || form == dumpSecret && strings.Contains(text, form) {
					t.Errorf("%s holds %s", where, what)
					break
				}
			}
		}
	}

	// The database's owner: pg_dump of everything.
	dump := pg.Dump(t, db)
	leaks("pg_dump of the database", dump)
	for _, want := range []string{"COPY public.sealed_keys", "COPY public.grants", "nas-storage", "vault"} {
		if !strings.Contains(dump, want) {
			t.Errorf("the dump lacks %q: it does not hold what the test looks in", want)
		}
	}

	// beta's own role: pg_dump of every table it may read, as it sees them.
	betaDB := envVar(t, betaEnv, "MESHBOX_DB")
	bconn, err := pgx.Connect(ctx, betaDB)
	if err != nil {
		t.Fatal(err)
	}
	defer bconn.Close(ctx)
	trows, err := bconn.Query(ctx, `SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND has_table_privilege(c.oid, 'SELECT') ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--data-only", "--enable-row-security"}
	var tables []string
	for trows.Next() {
		var name string
		if err := trows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, name)
		args = append(args, "--table", "public."+name)
	}
	if err := trows.Err(); err != nil {
		t.Fatal(err)
	}
	roleDump := pg.Dump(t, betaDB, args...)
	t.Logf("beta's role reads tables %v: a dump of %d bytes; the owner's dump: %d bytes", tables, len(roleDump), len(dump))
	leaks("pg_dump as beta's role (tables "+strings.Join(tables, ", ")+")", roleDump)
	if !strings.Contains(roleDump, "nas-storage") || !strings.Contains(roleDump, "COPY public.sealed_keys") {
		t.Errorf("beta's role dump lacks its grant or its sealed keys (tables %v): it proves nothing", tables)
	}

	// beta's cache file, every snapshot in it, once beta has stopped.
	beta.Signal(syscall.SIGTERM)
	if code := beta.Wait(); code != 0 {
		t.Fatalf("beta stopped with exit %d", code)
	}
	path := filepath.Join(beta.DataDir(), "cache.db")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	leaks("beta's cache file", string(raw))
	store, err := cache.Open(path, cache.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	hist, err := store.History()
	if err != nil {
		t.Fatal(err)
	}
	sealedGrant := false
	for _, h := range hist {
		snap, err := store.Get(h.Revision)
		if err != nil {
			t.Fatal(err)
		}
		js, err := json.Marshal(snap) // credentials as they are stored, not redacted
		if err != nil {
			t.Fatal(err)
		}
		leaks("beta's cached snapshot "+strconv.FormatInt(h.Revision, 10), string(js))
		for _, g := range snap.Bindings.Grants {
			if g.Resource == "nas-storage" {
				sealedGrant = g.SealedCredential != "" && g.Credential == ""
				if !sealedGrant {
					t.Errorf("snapshot %d holds the grant as %+v, want it sealed", h.Revision, g)
				}
			}
		}
	}
	if !sealedGrant {
		t.Errorf("beta's cache holds no snapshot with the grant (%d snapshots): it proves nothing", len(hist))
	}

	// meshbox cache show on that real cache prints no password: not the
	// grant's, nor beta's broker or database password.
	bu, err := url.Parse(brokerURLOf(t, ctx, db, vhost, "beta"))
	if err != nil {
		t.Fatal(err)
	}
	brokerPW, _ := bu.User.Password()
	du, err := url.Parse(betaDB)
	if err != nil {
		t.Fatal(err)
	}
	dbPW, _ := du.User.Password()
	if len(brokerPW) < 8 || len(dbPW) < 8 {
		t.Fatalf("beta's passwords: broker %d, database %d characters: want real ones", len(brokerPW), len(dbPW))
	}
	store.Close()
	for _, args := range [][]string{{"cache", "show", "--json"}, {"cache", "show"}, {"cache", "history", "--json"}} {
		code, out, errOut := cli(t, append(args, "--data", beta.DataDir())...)
		if code != 0 || args[1] == "show" && !strings.Contains(out, "nas-storage") {
			t.Fatalf("meshbox %s: exit %d, want the grant listed: %s%s", strings.Join(args, " "), code, out, errOut)
		}
		for what, pw := range map[string]string{"the grant's credential": dumpSecret, "beta's broker password": brokerPW, "beta's database password": dbPW} {
			if strings.Contains(out, pw) {
				t.Errorf("meshbox %s prints %s", strings.Join(args, " "), what)
			}
		}
	}
}

// envVar reads KEY from an env file (KEY=VALUE lines).
func envVar(t *testing.T, path, key string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key+"="); ok {
			return v
		}
	}
	t.Fatalf("%s sets no %s", path, key)
	return ""
}
