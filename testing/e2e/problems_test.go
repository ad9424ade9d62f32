package e2e

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// readiness reads a node's GET /readyz.
func readiness(t *testing.T, httpURL string) appliance.Readiness {
	t.Helper()
	resp, err := http.Get(httpURL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rd appliance.Readiness
	if err := json.NewDecoder(resp.Body).Decode(&rd); err != nil {
		t.Fatalf("readyz: %v", err)
	}
	return rd
}

// anyContains reports whether a string of list contains every one of subs.
func anyContains(list []string, subs ...string) bool {
	for _, s := range list {
		all := true
		for _, sub := range subs {
			all = all && strings.Contains(s, sub)
		}
		if all {
			return true
		}
	}
	return false
}

// TestWrongDatabasePassword runs a new node whose database login the real
// PostgreSQL refuses: it serves its programs, and readiness, the status,
// `meshbox status` and doctor say that the database refuses its login and
// where the password is set, not that it is ready at its best or has no
// broker configured. Once the login works, the problem leaves.
func TestWrongDatabasePassword(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, RabbitMQ and a node")
	}
	t.Parallel()
	meshtest.Binary(t)
	pg := meshtest.Postgres(t)
	db := pg.Database(t)
	vhost := meshtest.RabbitMQ(t).Vhost(t)
	if code, _, errOut := cli(t, "init", "--db", db, "--node", "alpha", "--broker", meshtest.NoCredential(vhost)); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	// A role of the node's, and the node given another password than its.
	const role = "e2e_wrong_db_password"
	pg.Exec(t, "CREATE ROLE "+role+" LOGIN PASSWORD 'the-password'")
	t.Cleanup(func() { pg.Exec(t, "DROP ROLE IF EXISTS "+role) })
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, "not-the-password")
	wrong := u.String()

	p := meshtest.StartProcess(t, "--node", "alpha", "--db", wrong)
	st := meshtest.WaitStatus(t, p.HTTPURL(), 10*time.Second, "the refused login among the problems", func(s appliance.Status) bool {
		return anyContains(s.Problems, "refused the login", role)
	})
	if !anyContains(st.Problems, "refused the login", "MESHBOX_DB", "--db") {
		t.Errorf("problems: %q, want the refused login and where the password is set", st.Problems)
	}
	if st.Standalone {
		t.Errorf("a node with a mesh database says it is standalone")
	}
	if st.Broker.State != bridge.StateNone || strings.Contains(st.Broker.Reason, "no broker configured") || !strings.Contains(st.Broker.Reason, "refuses its login") {
		t.Errorf("broker: state %q reason %q, want none because the database refuses the login (not: no broker configured)", st.Broker.State, st.Broker.Reason)
	}
	if strings.Contains(strings.Join(st.Problems, " "), "not-the-password") {
		t.Errorf("problems show the password: %q", st.Problems)
	}

	rd := readiness(t, p.HTTPURL())
	if !rd.Ready || !anyContains(rd.Degraded, "refused the login", role) {
		t.Errorf("readyz: %+v, want ready (it serves its programs), degraded by the refused login", rd)
	}

	code, out, errOut := cliEnv(t, onNode(p), "status")
	if code != 0 || !strings.Contains(out, "PROBLEM") || !strings.Contains(out, "refused the login") {
		t.Errorf("meshbox status: exit %d\n%s%s\nwant a PROBLEM line naming the refused login", code, out, errOut)
	}

	_, rep := doctor(t, "--node", "alpha", "--data", p.DataDir(), "--server", p.NATSURL(), "--db", wrong)
	wantCheck(t, rep, "node", "fail", "refused the login", "MESHBOX_DB")
	wantCheck(t, rep, "database", "fail", "password authentication failed")
	wantCheck(t, rep, "broker", "fail", "no broker", "refuses its login")

	// The password the node has becomes the role's: the problem ends and
	// leaves (the role may read nothing of the mesh, which is another).
	pg.Exec(t, "ALTER ROLE "+role+" PASSWORD 'not-the-password'")
	meshtest.WaitStatus(t, p.HTTPURL(), 20*time.Second, "the refused login gone from the problems", func(s appliance.Status) bool {
		return !anyContains(s.Problems, "refused the login")
	})
	if rd := readiness(t, p.HTTPURL()); anyContains(rd.Degraded, "refused the login") {
		t.Errorf("readyz after the login works: %+v, want the refused login gone", rd)
	}
}

// TestWrongBrokerPasswordOverride runs a node whose broker URL comes from
// its own setting (--broker), which overrides the bindings, with a password
// the real RabbitMQ refuses: the log, the status, readiness and `meshbox
// status` say to fix the setting, not that a credential from the bindings
// will replace it.
func TestWrongBrokerPasswordOverride(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, RabbitMQ and a node")
	}
	t.Parallel()
	meshtest.Binary(t)
	db := meshtest.Postgres(t).Database(t)
	vhost := meshtest.RabbitMQ(t).Vhost(t)
	if code, _, errOut := cli(t, "init", "--db", db, "--node", "alpha", "--broker", meshtest.NoCredential(vhost)); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	u, err := url.Parse(vhost)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("guest", "not-the-password")

	p := meshtest.StartProcess(t, "--node", "alpha", "--db", db, "--broker", u.String())
	st := meshtest.WaitStatus(t, p.HTTPURL(), 20*time.Second, "the broker refusing the credential", func(s appliance.Status) bool {
		return s.Broker.Credential != nil && s.Broker.Credential.State == bridge.CredentialRefused
	})
	want := []string{"refuses user guest", "--broker", "MESHBOX_BROKER", "overrides"}
	if !anyContains(st.Problems, want...) {
		t.Errorf("problems: %q, want the refused user and the setting that overrides the bindings (%q)", st.Problems, want)
	}
	if anyContains(st.Problems, "the credential comes from this node's bindings") || anyContains(st.Problems, "not-the-password") {
		t.Errorf("problems: %q, want no credential from the bindings promised, and no password", st.Problems)
	}
	if rd := readiness(t, p.HTTPURL()); !anyContains(rd.Degraded, want...) {
		t.Errorf("readyz: %+v, want degraded by the refused credential of the override", rd)
	}
	code, out, errOut := cliEnv(t, onNode(p), "status")
	if code != 0 || !strings.Contains(out, "PROBLEM") || !strings.Contains(out, "MESHBOX_BROKER") {
		t.Errorf("meshbox status: exit %d\n%s%s\nwant a PROBLEM line naming the override", code, out, errOut)
	}
	log := p.Output()
	if strings.Contains(log, "takes a new credential from its bindings") {
		t.Errorf("the log promises a credential from the bindings, which the override beats:\n%s", tail(log, 20))
	}
	if !strings.Contains(log, "the broker URL comes from the node's setting broker") {
		t.Errorf("the log does not say where the refused credential comes from:\n%s", tail(log, 20))
	}
}

// anyHasPrefix reports whether a string of list begins with prefix.
func anyHasPrefix(list []string, prefix string) bool {
	for _, s := range list {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}
