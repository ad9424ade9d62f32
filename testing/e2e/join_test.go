package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
)

// joinToken returns the join token line of `meshbox mesh node add` output.
func joinToken(t *testing.T, out string) string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "meshbox-join-v1.") {
			return l
		}
	}
	t.Fatalf("no join token in the output of mesh node add:\n%s", out)
	return ""
}

// TestNodeAddJoinRun makes a node with `meshbox mesh node add` (broker user,
// database role, join token), joins it with `meshbox join` on "another
// machine" (a fresh env file), runs it from that file alone, and checks
// that a token works once and not after it expired, and that bad input
// gets clear errors.
func TestNodeAddJoinRun(t *testing.T) {
	t.Parallel()
	rmq := meshtest.LeaseRabbitMQ(t)
	vhost := rmq.Vhost(t)
	db := meshtest.Postgres(t).Database(t)
	if code, _, errOut := cli(t, "init", "--db", db, "--node", "alpha", "--broker", meshtest.NoCredential(vhost)); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	// Node roles are cluster-wide: drop them before the database goes.
	t.Cleanup(func() {
		for _, n := range []string{"alpha", "hall", "cellar", "late"} {
			_, _, _ = cliEnv(t, []string{"MESHBOX_DB=" + db, "MESHBOX_BROKER_ADMIN=" + rmq.AdminURL()}, "mesh", "node", "remove", n, "--force")
		}
	})
	admin := []string{"MESHBOX_DB=" + db, "MESHBOX_BROKER_ADMIN=" + rmq.AdminURL()}

	// Bad input first: nothing may be left behind by a refused add.
	mgmtPort := strings.TrimPrefix(rmq.ManagementURL(), "http://127.0.0.1:")
	bad := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"no admin credential", []string{"MESHBOX_DB=" + db}, []string{"cellar"}, "--broker-admin is required"},
		{"wrong admin password", []string{"MESHBOX_DB=" + db}, []string{"cellar", "--broker-admin", "http://guest:wrong@127.0.0.1:" + mgmtPort},
			"401: wrong admin user or password"},
		{"no management API listening", []string{"MESHBOX_DB=" + db},
			[]string{"cellar", "--broker-admin", "http://guest:guest@" + meshtest.ClosedAddr(t)}, "rabbitmq_management plugin"},
		{"bad stage", admin, []string{"cellar", "--stages", "a b"}, "stage name"},
		{"token without a lifetime", admin, []string{"cellar", "--ttl", "0s"}, "--ttl 0s: must be more than 0"},
		{"token with a negative lifetime", admin, []string{"cellar", "--ttl", "-1h"}, "--ttl -1h0m0s: must be more than 0"},
	}
	for _, b := range bad {
		code, _, errOut := cliEnv(t, b.env, append([]string{"mesh", "node", "add"}, b.args...)...)
		if code == 0 || !strings.Contains(errOut, b.want) {
			t.Errorf("%s: exit %d, stderr %q; want a failure saying %q", b.name, code, errOut, b.want)
		}
		if strings.Contains(errOut, "guest:wrong") {
			t.Errorf("%s: the error repeats the admin password: %s", b.name, errOut)
		}
	}
	if out := mesh(t, db, "node", "list"); strings.Contains(out, "cellar") {
		t.Fatalf("a refused node add left a node record:\n%s", out)
	}

	// The mesh is running: node hall, joined the same way, hosts echo.
	code, out, errOut := cliEnv(t, admin, "mesh", "node", "add", "hall")
	if code != 0 {
		t.Fatalf("mesh node add hall: exit %d: %s%s", code, out, errOut)
	}
	// A node with its own credential exists; the first node init recorded
	// without one gets one from node add, like any other node.
	if code, _, errOut := cliEnv(t, admin, "mesh", "node", "add", "hall"); code == 0 ||
		!strings.Contains(errOut, `node "hall" already exists`) || !strings.Contains(errOut, "meshbox mesh node rejoin hall") {
		t.Errorf("node add of an existing node: exit %d, stderr %q; want it exists, and rejoin for a new token", code, errOut)
	}
	if code, out, errOut := cliEnv(t, admin, "mesh", "node", "add", "alpha"); code != 0 ||
		!strings.Contains(out, "alpha: recorded without a credential of its own; giving it one") {
		t.Errorf("node add of init's first node: exit %d: %s%s; want it given a credential", code, out, errOut)
	} else {
		joinToken(t, out)
	}
	hallEnv := filepath.Join(t.TempDir(), "hall.env")
	if code, out, errOut := cli(t, "join", joinToken(t, out), "--env-file", hallEnv); code != 0 {
		t.Fatalf("join hall: exit %d: %s%s", code, out, errOut)
	}
	hall := meshtest.StartProcess(t, "--env-file", hallEnv)
	meshtest.WaitStatus(t, hall.HTTPURL(), 30*time.Second, "hall connected to the broker", func(s appliance.Status) bool { return s.Broker.State == "connected" })
	hallNC := natsConn(t, hall)
	if _, err := hallNC.Subscribe("cap.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		t.Fatal(err)
	}
	flush(t, hallNC)

	code, out, errOut = cliEnv(t, admin, "mesh", "node", "add", "cellar", "--ttl", "1h")
	if code != 0 {
		t.Fatalf("mesh node add cellar: exit %d: %s%s", code, out, errOut)
	}
	token := joinToken(t, out)
	if strings.Contains(out, "guest:guest") {
		t.Errorf("node add prints the admin credential:\n%s", out)
	}

	// On the new machine.
	envFile := filepath.Join(t.TempDir(), "etc", "meshbox.env")
	code, out, errOut = cli(t, "join", token, "--env-file", envFile)
	if code != 0 {
		t.Fatalf("join: exit %d: %s%s", code, out, errOut)
	}
	fi, err := os.Stat(envFile)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("config file mode: got %v, want 0600", fi.Mode().Perm())
	}
	data, err := os.ReadFile(envFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "MESHBOX_NODE=cellar\n") || !strings.Contains(string(data), "MESHBOX_DB=postgres://meshbox_node_cellar_") {
		t.Errorf("config file: got\n%s\nwant MESHBOX_NODE=cellar and the node role's database URL", data)
	}
	if strings.Contains(string(data), "guest") || strings.Contains(string(data), "postgres://postgres") {
		t.Errorf("config file holds the admin's credentials:\n%s", data)
	}

	// Used twice: refused, saying so; the first file is untouched.
	code, _, errOut = cli(t, "join", token, "--env-file", filepath.Join(t.TempDir(), "again.env"))
	if code == 0 || !strings.Contains(errOut, "token already used at ") || !strings.Contains(errOut, "meshbox mesh node rejoin cellar") {
		t.Errorf("second join: exit %d, stderr %q; want token already used at ..., and rejoin cellar for a new one", code, errOut)
	}
	// Late: refused, saying when it expired.
	code, out, errOut = cliEnv(t, admin, "mesh", "node", "add", "late", "--ttl", "1ms")
	if code != 0 {
		t.Fatalf("mesh node add late: exit %d: %s%s", code, out, errOut)
	}
	lateToken := joinToken(t, out)
	expired := func() bool {
		return code != 0 && strings.Contains(errOut, "token expired at ") && strings.Contains(errOut, "meshbox mesh node rejoin late")
	}
	meshtest.Poll(10*time.Second, func() bool {
		code, _, errOut = cli(t, "join", lateToken, "--env-file", filepath.Join(t.TempDir(), "late.env"))
		return code == 0 || expired()
	})
	if !expired() {
		t.Fatalf("late join: exit %d, stderr %q; want token expired at ...", code, errOut)
	}

	// The node runs from the written file alone (the harness adds only its
	// data dir and loopback ports), reading its bindings as its own role.
	p := meshtest.StartProcess(t, "--env-file", envFile)
	st := meshtest.WaitStatus(t, p.HTTPURL(), 15*time.Second, "bindings from the database", func(s appliance.Status) bool {
		return s.Bindings.Source == "db" && s.Bindings.DB == "connected"
	})
	if st.Node != "cellar" {
		t.Errorf("status: node %q, want cellar", st.Node)
	}
	if !strings.Contains(p.Output(), "snapshot.source=postgres://meshbox_node_cellar_") {
		t.Errorf("the node did not read its bindings as its own role:\n%s", p.Output())
	}
	// It reaches the broker with its own broker user, from its bindings.
	st = meshtest.WaitStatus(t, p.HTTPURL(), 15*time.Second, "broker connected", func(s appliance.Status) bool { return s.Broker.State == "connected" })
	if !strings.Contains(st.Broker.URL, "node.cellar.g1:xxxxx@") {
		t.Errorf("broker URL in status: got %q, want the node's own user node.cellar.g1, password redacted", st.Broker.URL)
	}
	// It takes part in the running mesh: hall sees it up, and it calls
	// hall's echo across the broker.
	if !meshtest.Poll(30*time.Second, func() bool { return peer(meshtest.Status(t, hall.HTTPURL()), "cellar").State == "up" }) {
		t.Errorf("hall's view of cellar: %q, want up", peer(meshtest.Status(t, hall.HTTPURL()), "cellar").State)
	}
	cellarNC := natsConn(t, p)
	waitCallable(t, cellarNC, "cap.echo", nil, func(m *nats.Msg) bool { c, _ := natstest.ServiceError(m); return c == 0 })
	resp, err := cellarNC.Request("cap.echo", []byte("from cellar"), 5*time.Second)
	if code, text := natstest.ServiceError(resp); err != nil || code != 0 || string(resp.Data) != "from cellar" {
		t.Errorf("cellar calling hall's echo: %v %d %s", err, code, text)
	}
}
