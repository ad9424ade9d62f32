package e2e

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/testing/ledger"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
)

func nodeScopes(t *testing.T, p *meshtest.Process) (held []string, scopes map[string]string) {
	t.Helper()
	st := meshtest.Status(t, p.HTTPURL())
	if st.Keys == nil {
		return nil, nil
	}
	return st.Keys.Held, st.Keys.Scopes
}

// TestScopeHeldByTwoOfThree runs three joined nodes and a scope vault held
// by alpha and beta, to which stage ledger, capability safe and topic
// vault-door are bound. gamma, outside it, never receives the scope's key
// (the database refuses to store a copy for it), does not consume the
// ledger queue although a program there serves work.ledger, cannot read
// the scope's events (they reach it and are refused as wrong_scope; its
// subscriber gets none), and its program's submissions to ledger, events
// on vault-door and calls of safe are refused with an error naming the
// scope.
// Then the scope's key is rotated while alpha submits to ledger: nothing
// is lost, alpha and beta switch to the new key, the old one retires, and
// no sealed message is refused.
func TestScopeHeldByTwoOfThree(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	ctx := context.Background()
	rmq := meshtest.LeaseRabbitMQ(t)
	vhost := rmq.Vhost(t)
	db := meshtest.Postgres(t).Database(t)
	if code, _, errOut := cli(t, "init", "--db", db, "--node", "console", "--broker", meshtest.NoCredential(vhost)); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	alpha := joinedNode(t, db, rmq.AdminURL(), "alpha")
	beta := joinedNode(t, db, rmq.AdminURL(), "beta")
	gamma := joinedNode(t, db, rmq.AdminURL(), "gamma")
	for _, p := range []*meshtest.Process{alpha, beta, gamma} {
		waitSealing(t, p)
	}
	dbEnv := []string{"MESHBOX_DB=" + db}
	for _, args := range [][]string{
		{"mesh", "scope", "add", "vault", "--nodes", "alpha,beta"},
		{"mesh", "scope", "bind", "vault", "--stage", "ledger", "--cap", "safe", "--topic", "vault-door"},
	} {
		if code, out, errOut := cliEnv(t, dbEnv, args...); code != 0 {
			t.Fatalf("%s: exit %d: %s%s", strings.Join(args, " "), code, out, errOut)
		}
	}
	// Every node applies the scope's bindings before any traffic: a sender
	// that has not read the bind yet seals with the mesh's key, and a
	// member refuses that downgrade (the sealing under test, not a lag).
	_, out, _ := cliEnv(t, dbEnv, "mesh", "revision")
	rev, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil {
		t.Fatalf("mesh revision: %q: %v", out, err)
	}
	for _, p := range []*meshtest.Process{alpha, beta, gamma} {
		meshtest.WaitStatus(t, p.HTTPURL(), 30*time.Second, "the scope's bindings applied", func(s appliance.Status) bool {
			return s.Bindings.Revision >= rev
		})
	}
	// Both members seal with the same key of the scope.
	var scopeKey string
	if !meshtest.Poll(30*time.Second, func() bool {
		_, sa := nodeScopes(t, alpha)
		_, sb := nodeScopes(t, beta)
		scopeKey = sa["vault"]
		return scopeKey != "" && sb["vault"] == scopeKey
	}) {
		_, sa := nodeScopes(t, alpha)
		_, sb := nodeScopes(t, beta)
		t.Fatalf("alpha and beta do not seal with one key of scope vault: %v %v\n%s\n%s", sa, sb, alpha.Output(), beta.Output())
	}

	// gamma cannot read: it holds no key of the scope, the database holds
	// no copy for it, and a member cannot store one.
	held, scopes := nodeScopes(t, gamma)
	if slices.Contains(held, scopeKey) || len(scopes) != 0 {
		t.Errorf("gamma holds %v (scopes %v), want nothing of scope vault (key %s)", held, scopes, scopeKey)
	}
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var copies int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM sealed_keys s JOIN content_keys k ON k.id = s.key_id
		WHERE k.scope = 'vault' AND s.node = 'gamma'`).Scan(&copies); err != nil {
		t.Fatal(err)
	}
	if copies != 0 {
		t.Errorf("the database holds %d copies of vault's keys for gamma, want 0", copies)
	}
	var stored bool
	if err := conn.QueryRow(ctx, `SELECT meshbox_put_sealed_key($1, 'alpha', 'gamma',
		(SELECT meshbox_key_fingerprint(public_key) FROM nodes WHERE name = 'gamma'), '\x00'::bytea)`, scopeKey).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored {
		t.Error("the database stored a copy of vault's key for gamma, which is not in the scope")
	}

	// beta's program hosts the stage and the capability; so does gamma's
	// (it must not get them).
	var mu sync.Mutex
	handled := map[string]bool{}
	bprog := natsConn(t, beta)
	if _, err := bprog.QueueSubscribe("work.ledger", "h", func(m *nats.Msg) {
		mu.Lock()
		handled[string(m.Data)] = true
		mu.Unlock()
		_ = m.Respond(nil)
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := bprog.Subscribe("cap.safe", func(m *nats.Msg) { _ = m.Respond(append([]byte("opened:"), m.Data...)) }); err != nil {
		t.Fatal(err)
	}
	flush(t, bprog)
	gprog := natsConn(t, gamma)
	gammaGot := make(chan string, 100)
	if _, err := gprog.QueueSubscribe("work.ledger", "h", func(m *nats.Msg) {
		gammaGot <- string(m.Data)
		_ = m.Respond(nil)
	}); err != nil {
		t.Fatal(err)
	}
	flush(t, gprog)
	if !meshtest.Poll(30*time.Second, func() bool { return strings.Contains(gamma.Output(), "does not consume its queue") }) {
		t.Errorf("gamma does not say it refuses to host stage ledger\n%s", gamma.Output())
	}

	caller := natsConn(t, alpha)
	if !meshtest.Poll(30*time.Second, func() bool {
		o, _, _ := ledger.Submit(caller, "cmd.ledger", []byte("probe"), 5*time.Second)
		return o == ledger.Acked
	}) {
		t.Fatal("the scoped stage never accepted a command from alpha")
	}
	var reply *nats.Msg
	if !meshtest.Poll(30*time.Second, func() bool {
		reply, err = caller.Request("cap.safe", []byte("x"), 5*time.Second)
		return err == nil && string(reply.Data) == "opened:x"
	}) {
		t.Fatalf("alpha cannot call the scoped capability: %v %v", reply, err)
	}

	// gamma's attempts are refused, with an error that names the scope.
	o, resp, err := ledger.Submit(gprog, "cmd.ledger", []byte("from-gamma"), 5*time.Second)
	code, text := natstest.ServiceError(resp)
	if o != ledger.Refused || code != 403 || !strings.Contains(text, "not in scope vault") || !strings.Contains(text, "stage ledger") {
		t.Errorf("gamma's submission to ledger: %v %d %q %v, want refused with 403 naming scope vault", o, code, text, err)
	}
	if !meshtest.Poll(30*time.Second, func() bool {
		reply, err = gprog.Request("cap.safe", []byte("x"), 5*time.Second)
		code, text = natstest.ServiceError(reply)
		return err == nil && code == 403
	}) {
		t.Fatalf("gamma's call of the scoped capability: %v %v, want refused with 403", reply, err)
	}
	if !strings.Contains(text, "not in scope vault") || !strings.Contains(text, "capability safe") {
		t.Errorf("gamma's call of safe refused with %q, want it to name scope vault and the capability", text)
	}

	// The scope's events reach beta, and not gamma's subscriber: gamma's
	// node gets them sealed with a key it lacks and drops them.
	bdoor, err := bprog.SubscribeSync("evt.vault-door")
	if err != nil {
		t.Fatal(err)
	}
	flush(t, bprog)
	gdoor, err := gprog.SubscribeSync("evt.vault-door")
	if err != nil {
		t.Fatal(err)
	}
	flush(t, gprog)
	if !meshtest.Poll(30*time.Second, func() bool {
		if err := caller.Publish("evt.vault-door", []byte("door-opened")); err != nil {
			t.Fatal(err)
		}
		v, _ := scrape(t, gamma.HTTPURL()).value("meshbox_unseal_failures_total", "shape=event", "reason=wrong_scope")
		m, err := bdoor.NextMsg(200 * time.Millisecond)
		return v >= 1 && err == nil && string(m.Data) == "door-opened"
	}) {
		t.Fatalf("the scope's event did not reach beta, or gamma did not refuse it as wrong_scope\n%s", gamma.Output())
	}
	if m, err := gdoor.NextMsg(100 * time.Millisecond); err == nil {
		t.Errorf("gamma's program got the scope's event: %q", m.Data)
	}
	o, resp, err = ledger.Submit(gprog, "evt.vault-door", []byte("from-gamma"), 5*time.Second)
	code, text = natstest.ServiceError(resp)
	if o != ledger.Refused || code != 403 || !strings.Contains(text, "not in scope vault") || !strings.Contains(text, "topic vault-door") {
		t.Errorf("gamma's event on vault-door: %v %d %q %v, want refused with 403 naming scope vault", o, code, text, err)
	}

	// Rotation of the scope's key under traffic.
	stop, sentc := ledgerTraffic(t, caller)
	mdb, err := meshdb.Open(ctx, db, meshdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mdb.Close()
	const retention = 8 * time.Second
	newID, _, err := mdb.RotateScopeKey(ctx, "vault", retention)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*meshtest.Process{alpha, beta} {
		if !meshtest.Poll(30*time.Second, func() bool { _, s := nodeScopes(t, p); return s["vault"] == newID }) {
			_, s := nodeScopes(t, p)
			t.Fatalf("a member still seals vault's traffic with %s, want %s", s["vault"], newID)
		}
	}
	for _, p := range []*meshtest.Process{alpha, beta} {
		if !meshtest.Poll(retention+20*time.Second, func() bool {
			held, _ := nodeScopes(t, p)
			return !slices.Contains(held, scopeKey) && slices.Contains(held, newID)
		}) {
			held, _ := nodeScopes(t, p)
			t.Fatalf("the old key %s of vault is not retired: the node holds %v", scopeKey, held)
		}
	}
	close(stop)
	sent := <-sentc
	if len(sent) < 50 {
		t.Fatalf("only %d commands sent during the rotation", len(sent))
	}
	waitAllHandled(t, 30*time.Second, "in the rotation", sent, &mu, handled)
	if held, _ := nodeScopes(t, gamma); slices.Contains(held, newID) {
		t.Errorf("gamma holds vault's new key %s", newID)
	}
	select {
	case m := <-gammaGot:
		t.Errorf("gamma's program got a command of the scoped stage: %q", m)
	default:
	}
	for _, p := range []*meshtest.Process{alpha, beta} {
		if mf, ok := scrape(t, p.HTTPURL())["meshbox_unseal_failures_total"]; ok {
			for _, m := range mf.GetMetric() {
				if v := m.GetCounter().GetValue(); v != 0 {
					t.Errorf("a member refused %v sealed messages (%v), want none", v, m.GetLabel())
				}
			}
		}
	}
}
