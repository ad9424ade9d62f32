package e2e

import (
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// doctorReport is the JSON of `meshbox doctor --json`.
type doctorReport struct {
	Checks []struct {
		Name    string `json:"name"`
		Status  string `json:"status"`
		Message string `json:"message"`
		Hint    string `json:"hint"`
	} `json:"checks"`
	OK, Warn, Fail int
}

// check returns the status and message of the check called name.
func (r doctorReport) check(t *testing.T, name string) (status, message string) {
	t.Helper()
	for _, c := range r.Checks {
		if c.Name == name {
			return c.Status, c.Message
		}
	}
	t.Fatalf("doctor ran no check %q", name)
	return "", ""
}

// failed lists the checks that failed.
func (r doctorReport) failed() []string {
	var out []string
	for _, c := range r.Checks {
		if c.Status == "fail" {
			out = append(out, c.Name+": "+c.Message)
		}
	}
	return out
}

// doctor runs `meshbox doctor --json args...` with an empty hosts file
// unless args name one, and returns its exit code and report.
func doctor(t *testing.T, args ...string) (int, doctorReport) {
	t.Helper()
	hasHosts := false
	for _, a := range args {
		hasHosts = hasHosts || a == "--hosts"
	}
	if !hasHosts {
		hosts := filepath.Join(t.TempDir(), "hosts")
		if err := os.WriteFile(hosts, []byte("127.0.0.1 localhost\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--hosts", hosts)
	}
	code, out, errOut := cli(t, append([]string{"doctor", "--json"}, args...)...)
	var rep doctorReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("doctor --json: exit %d, output is not JSON: %v\n%s%s", code, err, out, errOut)
	}
	if (code != 0) != (rep.Fail > 0) {
		t.Errorf("doctor: exit %d with %d failed checks, want non-zero exactly when a check fails", code, rep.Fail)
	}
	return code, rep
}

// natsListen turns a node's NATS URL into the host:port it listens on.
func natsListen(t *testing.T, natsURL string) string {
	t.Helper()
	u, err := url.Parse(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

func wantCheck(t *testing.T, rep doctorReport, name, status string, contains ...string) {
	t.Helper()
	got, msg := rep.check(t, name)
	if got != status {
		t.Errorf("%s: got %s (%s), want %s", name, got, msg, status)
		return
	}
	for _, c := range contains {
		if !strings.Contains(msg, c) {
			t.Errorf("%s: message %q lacks %q", name, msg, c)
		}
	}
}

// TestDoctorHealthyNode checks a running node on the real database and
// broker: every check passes. Stopped, the node's cache is read directly,
// with the broker's address and the node's public name from it; a public
// name pinned in the hosts file then fails.
func TestDoctorHealthyNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, RabbitMQ and a node")
	}
	t.Parallel()
	meshtest.Binary(t) // built before cli's timeout starts
	vhost := meshtest.RabbitMQ(t).Vhost(t)
	db := meshtest.Postgres(t).Database(t)
	if code, _, errOut := cli(t, "init", "--db", db, "--node", "alpha", "--broker", meshtest.NoCredential(vhost), "--public-name", "alpha.example.org"); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	data := filepath.Join(t.TempDir(), "data")
	p := meshtest.StartProcess(t, "--node", "alpha", "--db", db, "--data", data)
	nats := natsListen(t, p.NATSURL())

	code, rep := doctor(t, "--node", "alpha", "--data", data, "--nats", nats, "--db", db, "--broker", vhost)
	if code != 0 {
		t.Errorf("healthy node: exit %d, failed: %v", code, rep.failed())
	}
	wantCheck(t, rep, "data directory", "ok", "mode 0700")
	wantCheck(t, rep, "data files", "ok", "cache.db")
	wantCheck(t, rep, "node", "ok", "alpha is running")
	wantCheck(t, rep, "bindings cache", "ok", "from db")
	wantCheck(t, rep, "database", "ok", "reachable")
	wantCheck(t, rep, "broker", "ok", "credentials accepted")
	// The test broker's guest is an administrator: a node must not hold it.
	wantCheck(t, rep, "broker credential", "warn", `connects as "guest"`, "the admin's credential")
	wantCheck(t, rep, "clock", "ok", "the database's clock")
	wantCheck(t, rep, "mesh names", "ok", "127.0.0.1")
	wantCheck(t, rep, "local NATS", "ok", "loopback only")

	// Without --broker and --nats, doctor asks the running node: the broker
	// it uses, its link as it reports it, and the address it listens on.
	code, rep = doctor(t, "--node", "alpha", "--data", data, "--db", db, "--server", p.NATSURL())
	if code != 0 {
		t.Errorf("healthy node asked: exit %d, failed: %v", code, rep.failed())
	}
	wantCheck(t, rep, "broker", "ok", "the running node's link to", "is connected")
	// The node holds its cache: what it uses comes from its status, not
	// "not checked" or "no cached bindings".
	wantCheck(t, rep, "broker credential", "warn", `the running node connects as "guest"`)
	wantCheck(t, rep, "hosts file", "ok", "alpha.example.org is not pinned")
	wantCheck(t, rep, "local NATS", "ok", "loopback only ("+nats+")")
	for _, c := range rep.Checks {
		if listens, _, _ := strings.Cut(c.Message, ";"); c.Name == "local NATS" && strings.Contains(listens, ":4222") {
			t.Errorf("local NATS: %q says the node listens on port 4222, which it does not use", c.Message)
		}
	}

	// Stopped: doctor reads the cache itself, and learns the broker and the
	// public name from it.
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	code, rep = doctor(t, "--node", "alpha", "--data", data, "--nats", nats)
	if code != 0 {
		t.Errorf("stopped node: exit %d, failed: %v", code, rep.failed())
	}
	wantCheck(t, rep, "node", "warn", "no node answers")
	wantCheck(t, rep, "bindings cache", "ok", "revision")
	wantCheck(t, rep, "broker", "ok", "from the cached bindings", "credentials accepted")
	wantCheck(t, rep, "hosts file", "ok", "alpha.example.org is not pinned")

	// The node's own public name pinned in the hosts file.
	hosts := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(hosts, []byte("127.0.0.1 localhost\n127.0.1.1 alpha.example.org alpha\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, rep = doctor(t, "--node", "alpha", "--data", data, "--nats", nats, "--hosts", hosts)
	if code == 0 {
		t.Errorf("pinned public name: exit 0, want non-zero")
	}
	wantCheck(t, rep, "hosts file", "fail", "alpha.example.org", "line 2: 127.0.1.1")
}

// TestDoctorDatabaseDown stops a real PostgreSQL: the database check fails
// with a hint, and the clock cannot be measured.
func TestDoctorDatabaseDown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and stops PostgreSQL")
	}
	t.Parallel()
	meshtest.Binary(t)
	pg := meshtest.NewPostgres(t) // private: this test stops it
	db := pg.Database(t)
	data := filepath.Join(t.TempDir(), "data") // not created yet: a warning, not a failure

	code, rep := doctor(t, "--node", "alpha", "--data", data, "--db", db)
	if code != 0 {
		t.Fatalf("database up: exit %d, failed: %v", code, rep.failed())
	}
	wantCheck(t, rep, "database", "ok", "reachable")

	pg.Stop(t)
	code, rep = doctor(t, "--node", "alpha", "--data", data, "--db", db)
	if code == 0 {
		t.Errorf("database down: exit 0, want non-zero")
	}
	wantCheck(t, rep, "database", "fail", "cannot connect")
	wantCheck(t, rep, "clock", "warn", "not measured")
	if got := rep.failed(); len(got) != 1 {
		t.Errorf("database down: failed %v, want only the database", got)
	}
}

// TestDoctorBrokerDown runs doctor against a real RabbitMQ: wrong
// credentials are refused, then a broker address where nothing listens
// any more (the proxy the node reached it through, closed) is
// unreachable. What doctor sees of a stopped broker is that closed port;
// the broker itself stays up for the other tests.
func TestDoctorBrokerDown(t *testing.T) {
	if testing.Short() {
		t.Skip("uses RabbitMQ")
	}
	meshtest.Binary(t)
	t.Parallel()
	_, _, good, px := vhostBehindProxy(t)
	data := filepath.Join(t.TempDir(), "data") // not created yet: a warning, not a failure

	code, rep := doctor(t, "--node", "alpha", "--data", data, "--broker", good)
	if code != 0 {
		t.Fatalf("broker up: exit %d, failed: %v", code, rep.failed())
	}
	wantCheck(t, rep, "broker", "ok", "credentials accepted")

	u, err := url.Parse(good)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), "not-the-password")
	code, rep = doctor(t, "--node", "alpha", "--data", data, "--broker", u.String())
	if code == 0 {
		t.Errorf("wrong password: exit 0, want non-zero")
	}
	wantCheck(t, rep, "broker", "fail", "credentials refused")
	if _, msg := rep.check(t, "broker"); strings.Contains(msg, "not-the-password") {
		t.Errorf("broker check shows the password: %q", msg)
	}

	px.Cut(t)
	code, rep = doctor(t, "--node", "alpha", "--data", data, "--broker", good)
	if code == 0 {
		t.Errorf("broker down: exit 0, want non-zero")
	}
	wantCheck(t, rep, "broker", "fail", "cannot connect", px.Addr())
	if got := rep.failed(); len(got) != 1 {
		t.Errorf("broker down: failed %v, want only the broker", got)
	}
}

// TestDoctorStagedFailures covers what needs no service: a .local broker,
// a data directory others can read, a local NATS reachable off loopback.
func TestDoctorStagedFailures(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the meshbox binary")
	}
	t.Parallel()
	meshtest.Binary(t)

	// A multicast DNS name for the broker.
	code, rep := doctor(t, "--node", "alpha", "--data", filepath.Join(t.TempDir(), "data"), "--broker", "amqp://guest:guest@meshbroker.local:5672/")
	if code == 0 {
		t.Errorf(".local broker: exit 0, want non-zero")
	}
	wantCheck(t, rep, "mesh names", "fail", "broker host meshbroker.local")

	// Bad permissions. Tests run as root, for whom nothing is unreadable:
	// doctor judges mode bits and owners, not whether access fails.
	data := filepath.Join(t.TempDir(), "data")
	p := meshtest.StartProcess(t, "--node", "alpha", "--data", data)
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	code, rep = doctor(t, "--node", "alpha", "--data", data)
	if code != 0 {
		t.Fatalf("fresh data directory: exit %d, failed %v", code, rep.failed())
	}
	if err := os.Chmod(data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(data, "cache.db"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, rep = doctor(t, "--node", "alpha", "--data", data)
	if code == 0 {
		t.Errorf("open permissions: exit 0, want non-zero")
	}
	wantCheck(t, rep, "data directory", "fail", "mode 0755")
	wantCheck(t, rep, "data files", "fail", "cache.db has mode 0644")

	// A node whose NATS listens on every address.
	p = meshtest.StartProcess(t, "--node", "alpha", "--nats", "0.0.0.0:0")
	code, rep = doctor(t, "--node", "alpha", "--data", filepath.Join(t.TempDir(), "data"), "--server", p.NATSURL())
	if code == 0 {
		t.Errorf("NATS on 0.0.0.0: exit 0, want non-zero")
	}
	wantCheck(t, rep, "local NATS", "fail", "other machines can reach")
}

// TestDoctorAsksTheJoinedNode: a node joined with its own broker user
// runs and holds its cache; doctor, given its env file, takes the node's
// word for the broker user it connects as and for its public name, as the
// node's status says them.
func TestDoctorAsksTheJoinedNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, RabbitMQ and a node")
	}
	t.Parallel()
	rmq := meshtest.LeaseRabbitMQ(t)
	vhost := rmq.Vhost(t)
	db := meshtest.Postgres(t).Database(t)
	if code, _, errOut := cli(t, "init", "--db", db, "--node", "console", "--broker", meshtest.NoCredential(vhost)); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	p, envFile := joinedNodeEnv(t, db, rmq.AdminURL(), "alpha")
	mesh(t, db, "node", "set", "alpha", "--public-name", "alpha.example.org")
	meshtest.WaitStatus(t, p.HTTPURL(), 30*time.Second, "alpha on its own broker user, with its public name", func(s appliance.Status) bool {
		return s.Broker.State == "connected" && s.PublicName == "alpha.example.org"
	})

	if err := os.Chmod(p.DataDir(), 0o700); err != nil { // a test's directory is 0755
		t.Fatal(err)
	}
	code, rep := doctor(t, "--env-file", envFile, "--data", p.DataDir(), "--server", p.NATSURL())
	if code != 0 {
		t.Errorf("joined node: exit %d, failed: %v", code, rep.failed())
	}
	wantCheck(t, rep, "bindings cache", "ok", "the running node holds the cache")
	wantCheck(t, rep, "broker", "ok", "the running node's link to", "is connected")
	wantCheck(t, rep, "broker credential", "ok", "the running node connects as its own broker user node.alpha.g1")
	wantCheck(t, rep, "hosts file", "ok", "alpha.example.org is not pinned")
	for _, c := range rep.Checks {
		if strings.Contains(c.Message, "not checked") || strings.Contains(c.Message, "no cached bindings") {
			t.Errorf("%s: %q contradicts the running node", c.Name, c.Message)
		}
	}
}
