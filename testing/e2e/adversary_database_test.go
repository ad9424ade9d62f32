package e2e

import (
	"context"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
)

// The mesh database as the adversary: its admin reads every row, and a
// peer writes with its own database role.

// TestAdversaryDatabaseDumpHoldsNoNodePassword is the database's admin
// reading everything the mesh keeps of its nodes' credentials
// (node_credentials, join_tokens) after alpha and beta joined, and again
// after a rotation. Every value found is tried as each node's broker
// password (every broker user of the rows) on the real RabbitMQ and as
// each node role's password on the real PostgreSQL: all are refused. The
// control: each node's own password, as the node opens it, is accepted;
// the nodes call each other after the join, after the rotation, and after
// a restart from their caches with the database stopped.
func TestAdversaryDatabaseDumpHoldsNoNodePassword(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	ctx := context.Background()
	pg := meshtest.NewPostgres(t) // private: this test stops it
	nodes := []string{"alpha", "beta"}
	m := newIdentityMeshOn(t, pg.Database(t), nodes...)
	procs := map[string]*meshtest.Process{}
	start := func() {
		t.Helper()
		for _, n := range nodes {
			procs[n] = m.start(t, n)
		}
		host := natsConn(t, procs["alpha"])
		if _, err := host.Subscribe("cap.echo", func(msg *nats.Msg) { _ = msg.Respond(msg.Data) }); err != nil {
			t.Fatal(err)
		}
		flush(t, host)
	}
	call := func(when string) {
		t.Helper()
		caller := natsConn(t, procs["beta"])
		waitCallable(t, caller, "node.alpha.cap.echo", nil, func(msg *nats.Msg) bool { c, _ := natstest.ServiceError(msg); return c == 0 })
		resp, err := caller.Request("node.alpha.cap.echo", []byte(when), 5*time.Second)
		if err != nil {
			t.Fatalf("%s: beta calling echo on alpha: %v", when, err)
		}
		if code, text := natstest.ServiceError(resp); code != 0 || string(resp.Data) != when {
			t.Fatalf("%s: beta calling echo on alpha: %d %q %q", when, code, text, resp.Data)
		}
	}

	refusedAll := func(when string) {
		t.Helper()
		values, roles, users := dumpCredentials(t, ctx, m.db)
		if len(users) < len(nodes) || len(roles) < len(nodes) {
			t.Fatalf("%s: the dump names broker users %v and roles %v: it proves nothing", when, users, roles)
		}
		// Every login is tried at once, 16 at a time: a refused login
		// costs the broker and the database a round of their own.
		var wg sync.WaitGroup
		sem := make(chan struct{}, 16)
		try := func(what, name, v string, accepts func() bool) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				if accepts() {
					t.Errorf("%s: the %s accepts a value of the dump as %s's password", when, what, name)
				}
			}()
		}
		for _, user := range users {
			for _, v := range values {
				try("broker", user, v, func() bool { return brokerAccepts(m.vhost, user, v) })
			}
		}
		for _, role := range roles {
			for _, v := range values {
				try("database", role, v, func() bool { return databaseAccepts(ctx, m.db, role, v) })
			}
		}
		wg.Wait()
		t.Logf("%s: %d values of the dump tried on %d broker users and %d roles: all refused", when, len(values), len(users), len(roles))
		// The control: what each node opens is accepted.
		for _, n := range nodes {
			if user, pw := nodeCredential(t, ctx, m.db, n); !brokerAccepts(m.vhost, user, pw) {
				t.Fatalf("%s: the broker refuses %s's own credential, as the node opens it", when, n)
			}
		}
	}

	start()
	call("joined")
	refusedAll("after the join")

	code, out, errOut := m.rotate(t, "--all", "--wait", "30s")
	if code != 0 {
		t.Fatalf("rotate --all: exit %d: %s%s", code, out, errOut)
	}
	for _, n := range nodes {
		waitIdentity(t, procs[n].HTTPURL(), n+" on generation 2, nothing older", func(s appliance.Status) bool {
			return s.Identity.Generation == 2 && s.Identity.State == "in use" && s.Identity.Rotation == ""
		})
	}
	call("rotated")
	refusedAll("after the rotation")

	// From the caches alone: the database stopped, both nodes restarted.
	for _, n := range nodes {
		procs[n].Signal(syscall.SIGTERM)
		if code := procs[n].Wait(); code != 0 {
			t.Fatalf("%s stopped with exit %d", n, code)
		}
	}
	pg.Stop(t)
	start()
	for _, n := range nodes {
		meshtest.WaitStatus(t, procs[n].HTTPURL(), 15*time.Second, n+" on its cached bindings", func(s appliance.Status) bool {
			return s.Bindings.Source == "cache"
		})
		waitIdentity(t, procs[n].HTTPURL(), n+" on generation 2 from its cache", func(s appliance.Status) bool {
			return s.Identity.Generation == 2 && s.Identity.State == "in use"
		})
	}
	call("restarted from the cache")
	pg.Start(t) // for the cleanup's node remove
}

// TestAdversaryPeerSealsBogusKey: peer, a node of the mesh that holds the
// mesh's key, writes with its own database role (raw pgx) the first copy
// of the key for fresh, a new node none has sealed it for yet: bytes of
// its own choosing, sealed to fresh's real public key. fresh refuses it
// (the bytes do not match the key's commitment), counts and logs it, and
// removes it; once alpha, an honest holder, is back it seals the real key
// for fresh, and calls cross the mesh both ways (the control). A fresh
// that took the bogus key would seal what alpha cannot open.
func TestAdversaryPeerSealsBogusKey(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	ctx := context.Background()
	m := newIdentityMesh(t, "alpha", "peer", "fresh")
	alpha, peer := m.start(t, "alpha"), m.start(t, "peer")
	for _, p := range []*meshtest.Process{alpha, peer} {
		waitSealing(t, p)
		waitKeysInStep(t, p)
	}
	kid := currentKey(t, alpha)
	if kid == "" || currentKey(t, peer) != kid {
		t.Fatalf("alpha seals with %q, peer with %q: want one key", kid, currentKey(t, peer))
	}
	// Both holders stop, so that no honest one seals the key for fresh
	// before the attacker does; peer's database role stays.
	for _, p := range []*meshtest.Process{alpha, peer} {
		p.Signal(syscall.SIGTERM)
		if code := p.Wait(); code != 0 {
			t.Fatalf("a holder stopped with exit %d", code)
		}
	}
	fresh := m.start(t, "fresh")
	lacks := func() bool {
		st := meshtest.Status(t, fresh.HTTPURL())
		return st.Keys != nil && slices.Contains(st.Keys.Lacking, kid)
	}
	if !meshtest.Poll(30*time.Second, lacks) {
		t.Fatalf("fresh does not say it lacks %s\n%s", kid, fresh.Output())
	}

	// The attack, with peer's own database login.
	pconn, err := pgx.Connect(ctx, envValue(t, m.envs["peer"], "MESHBOX_DB"))
	if err != nil {
		t.Fatal(err)
	}
	defer pconn.Close(ctx)
	var pub []byte
	if err := pconn.QueryRow(ctx, `SELECT public_key FROM nodes WHERE name = 'fresh'`).Scan(&pub); err != nil || len(pub) == 0 {
		t.Fatalf("peer reads fresh's public key: %v (%d bytes)", err, len(pub))
	}
	bogus, err := seal.ContentKeyFrom(kid, seal.NewContentKey().Bytes())
	if err != nil {
		t.Fatal(err)
	}
	blob, err := seal.SealTo(pub, seal.ContentKeyInfo(kid, "fresh"), bogus.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	var wrote bool
	if err := pconn.QueryRow(ctx, `SELECT meshbox_put_sealed_key($1, 'peer', 'fresh', $2, $3)`,
		kid, seal.Fingerprint(pub), blob).Scan(&wrote); err != nil || !wrote {
		t.Fatalf("peer stores its copy for fresh: got %v %v, want stored (the attack needs it)", wrote, err)
	}
	refusedCount := func() float64 {
		v, _ := scrape(t, fresh.HTTPURL()).value("meshbox_sealed_keys_refused_total", "reason=commitment")
		return v
	}
	// fresh either refuses the copy or (without commitments) holds it.
	if !meshtest.Poll(15*time.Second, func() bool { return refusedCount() >= 1 || !lacks() }) {
		t.Fatalf("fresh neither refused nor took peer's copy\n%s", fresh.Output())
	}

	// alpha, an honest holder, is back: fresh ends up with the real key,
	// and calls cross the mesh both ways.
	alpha = m.start(t, "alpha")
	waitSealing(t, fresh)
	for _, c := range []struct{ from, to *meshtest.Process }{{fresh, alpha}, {alpha, fresh}} {
		host := natsConn(t, c.to)
		if _, err := host.Subscribe("cap.echo", func(msg *nats.Msg) { _ = msg.Respond(msg.Data) }); err != nil {
			t.Fatal(err)
		}
		flush(t, host)
		to := "alpha"
		if c.to == fresh {
			to = "fresh"
		}
		caller := natsConn(t, c.from)
		subject := "node." + to + ".cap.echo"
		waitCallable(t, caller, subject, nil, func(msg *nats.Msg) bool { code, _ := natstest.ServiceError(msg); return code == 0 })
		resp, err := caller.Request(subject, []byte("real key"), 5*time.Second)
		if code, text := natstest.ServiceError(resp); err != nil || code != 0 || string(resp.Data) != "real key" {
			t.Fatalf("calling echo on %s: %v %d %q", to, err, code, text)
		}
		host.Close()
	}

	// What fresh did with peer's copy: counted, logged once, removed.
	if got := refusedCount(); got != 1 {
		t.Errorf("fresh's refused copies (commitment): got %v, want 1", got)
	}
	if n := logLines(fresh.Output(), "refused a sealed copy of a content key", "reason=commitment", "sealed_by=peer"); n != 1 {
		t.Errorf("fresh's log lines for peer's copy: got %d, want 1\n%s", n, fresh.Output())
	}
	aconn, err := pgx.Connect(ctx, m.db)
	if err != nil {
		t.Fatal(err)
	}
	defer aconn.Close(ctx)
	var by string
	if err := aconn.QueryRow(ctx, `SELECT sealed_by FROM sealed_keys WHERE key_id = $1 AND node = 'fresh'`, kid).Scan(&by); err != nil || by != "alpha" {
		t.Errorf("fresh's copy of %s: sealed by %q (%v), want alpha's", kid, by, err)
	}
}
