package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/bridge/brokeradmin"
	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/meshbox/meshbox/testing/ledger"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
)

// identityMesh is a mesh of nodes made with `mesh node add` and `join`,
// each running from its own configuration file.
type identityMesh struct {
	rmq   *meshtest.Rabbit
	vhost string // AMQP URL of the mesh's vhost (guest's credential)
	db    string // the admin's database URL
	admin []string
	envs  map[string]string // node -> its env file
	data  map[string]string // node -> its data directory
}

// newIdentityMesh initialises a mesh (first node "hub", a record only) and
// adds and joins the named nodes, each allowed every stage (--stages *:
// the tests run stages on any of them); none is started.
func newIdentityMesh(t *testing.T, nodes ...string) *identityMesh {
	t.Helper()
	return newIdentityMeshOn(t, meshtest.Postgres(t).Database(t), nodes...)
}

// newIdentityMeshOn is newIdentityMesh with the mesh database db (one of
// a private server, for a test that stops it).
func newIdentityMeshOn(t *testing.T, db string, nodes ...string) *identityMesh {
	t.Helper()
	rmq := meshtest.LeaseRabbitMQ(t)
	m := &identityMesh{rmq: rmq, vhost: rmq.Vhost(t), db: db, envs: map[string]string{}, data: map[string]string{}}
	m.admin = []string{"MESHBOX_DB=" + m.db, "MESHBOX_BROKER_ADMIN=" + rmq.AdminURL()}
	if code, _, errOut := cli(t, "init", "--db", m.db, "--node", "hub", "--broker", meshtest.NoCredential(m.vhost)); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	// Node roles and broker users outlive the test's database and vhost.
	t.Cleanup(func() {
		for _, n := range nodes {
			_, _, _ = cliEnv(t, m.admin, "mesh", "node", "remove", n, "--force")
		}
	})
	for _, n := range nodes {
		code, out, errOut := cliEnv(t, m.admin, "mesh", "node", "add", n, "--stages", "*")
		if code != 0 {
			t.Fatalf("mesh node add %s: exit %d: %s%s", n, code, out, errOut)
		}
		m.envs[n] = filepath.Join(t.TempDir(), n+".env")
		m.data[n] = filepath.Join(t.TempDir(), "data")
		rememberDataDir(m.db, n, m.data[n])
		if code, out, errOut := cli(t, "join", joinToken(t, out), "--env-file", m.envs[n]); code != 0 {
			t.Fatalf("join %s: exit %d: %s%s", n, code, out, errOut)
		}
	}
	return m
}

// start runs node from its env file and data directory and waits until it
// is connected to the broker.
func (m *identityMesh) start(t *testing.T, node string) *meshtest.Process {
	t.Helper()
	p := meshtest.StartProcess(t, "--env-file", m.envs[node], "--data", m.data[node])
	meshtest.WaitStatus(t, p.HTTPURL(), 30*time.Second, node+" connected to the broker",
		func(s appliance.Status) bool { return s.Broker.State == "connected" })
	return p
}

// waitSwitchKnown waits until the mesh database records that node
// switched to generation gen and p, the running node, applied bindings at
// least that new: from then on its cache holds the switch, and the node
// takes the broker's refusal of that generation's user for a revocation.
func (m *identityMesh) waitSwitchKnown(t *testing.T, p *meshtest.Process, node string, gen int) {
	t.Helper()
	ctx := context.Background()
	db, err := meshdb.Open(ctx, m.db, meshdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	meshtest.Eventually(t, 30*time.Second, node+" on bindings that record its switch to generation "+strconv.Itoa(gen), func() error {
		gens, err := db.CredentialGenerations(ctx, node)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(gens, func(g meshdb.CredentialGeneration) bool { return g.Generation == gen && g.Switched() }) {
			return fmt.Errorf("the mesh database records no switch: %+v", gens)
		}
		rev, err := db.Revision(ctx)
		if err != nil {
			return err
		}
		if got := meshtest.Status(t, p.HTTPURL()).Bindings.Revision; got < rev {
			return fmt.Errorf("%s runs revision %d, the mesh is at %d", node, got, rev)
		}
		return nil
	})
}

// rotate runs `meshbox mesh node rotate args...` as the admin.
func (m *identityMesh) rotate(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return cliEnv(t, m.admin, append([]string{"mesh", "node", "rotate"}, args...)...)
}

// generations returns the generations of node's broker users on the
// broker.
func (m *identityMesh) generations(t *testing.T, node string) []int {
	t.Helper()
	u, err := url.Parse(m.vhost)
	if err != nil {
		t.Fatal(err)
	}
	vhost, _ := url.PathUnescape(strings.TrimPrefix(u.Path, "/"))
	a, err := brokeradmin.Connect(context.Background(), m.rmq.AdminURL(), vhost, brokeradmin.Options{})
	if err != nil {
		t.Fatal(err)
	}
	gens, err := a.Generations(context.Background(), node)
	if err != nil {
		t.Fatal(err)
	}
	return gens
}

// waitIdentity waits until the node's status has its identity (the
// broker user and credential) and ok accepts the status.
func waitIdentity(t *testing.T, httpURL, what string, ok func(appliance.Status) bool) appliance.Status {
	t.Helper()
	return meshtest.WaitStatus(t, httpURL, 30*time.Second, what, func(s appliance.Status) bool { return s.Identity != nil && ok(s) })
}

// calls keeps requests flowing from one node to capability echo on
// another, and counts what they were answered.
type calls struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	errs       map[string]int
}

func (c *calls) run(nc *nats.Conn, target string, workers int, stop <-chan struct{}, wg *sync.WaitGroup) {
	for w := range workers {
		wg.Add(1)
		go func() { // caller: exits when stop is closed
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				body := fmt.Sprintf("%s-%d-%d", target, w, i)
				// The node's deadline as long as the caller's wait: a reply
				// lost in the switch fails either way, one slowed by a busy
				// machine (brokers of other tests booting beside it) does
				// not fail at the default 5 s.
				req := nats.NewMsg("node." + target + ".cap.echo")
				req.Data = []byte(body)
				req.Header.Set(wire.HeaderTimeout, "9s")
				m, err := nc.RequestMsg(req, 10*time.Second)
				code, text := natstest.ServiceError(m)
				if err == nil && code == 0 && string(m.Data) == body {
					c.ok.Add(1)
					time.Sleep(10 * time.Millisecond)
					continue
				}
				c.failed.Add(1)
				c.mu.Lock()
				if err != nil {
					c.errs[ledger.Clip(err.Error())]++
				} else {
					c.errs[ledger.Clip(fmt.Sprintf("%d %s %q", code, text, m.Data))]++
				}
				c.mu.Unlock()
			}
		}()
	}
}

// TestRotateAllUnderLoad runs three joined nodes with requests flowing
// between each pair and commands flowing to a stage, rotates every node's
// credential with `meshbox mesh node rotate --all`, and checks that no
// request failed, no command was lost, every node now uses generation 2,
// and the generation 1 broker users are gone.
func TestRotateAllUnderLoad(t *testing.T) {
	names := []string{"ant", "bee", "cat"}
	m := newIdentityMesh(t, names...)
	procs := map[string]*meshtest.Process{}
	for _, n := range names {
		procs[n] = m.start(t, n)
		st := waitIdentity(t, procs[n].HTTPURL(), n+" on generation 1, switch recorded", func(s appliance.Status) bool {
			return s.Identity.Generation == 1 && s.Identity.State == "in use"
		})
		if st.Identity.BrokerUser != "node."+n+".g1" {
			t.Errorf("%s: broker user %q, want node.%s.g1", n, st.Identity.BrokerUser, n)
		}
	}
	// Every node hosts echo; cat handles stage rot.
	for _, n := range names {
		nc := natsConn(t, procs[n])
		if _, err := nc.QueueSubscribe("cap.echo", "echo", func(msg *nats.Msg) {
			time.Sleep(5 * time.Millisecond)
			_ = msg.Respond(msg.Data)
		}); err != nil {
			t.Fatal(err)
		}
		flush(t, nc)
	}
	cmds := ledger.NewHistory()
	hnc := natsConn(t, procs["cat"])
	csub, err := hnc.QueueSubscribe("work.rot", "handlers", func(msg *nats.Msg) {
		cmds.Delivered(ledger.DeliveryOf("cat", msg))
		_ = msg.Respond(nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := csub.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	flush(t, hnc)
	waitConsumers(t, m.rmq, m.vhost, "cmd.rot", 1)
	// Messages are sealed from the start of the load on: the switch to
	// sealing is not what this test is about.
	for _, n := range names {
		waitSealing(t, procs[n])
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	reqs := &calls{errs: map[string]int{}}
	for i, n := range names {
		nc := natsConn(t, procs[n])
		target := names[(i+1)%len(names)]
		waitCallable(t, nc, "node."+target+".cap.echo", nil, func(msg *nats.Msg) bool { c, _ := natstest.ServiceError(msg); return c == 0 })
		reqs.run(nc, target, 3, stop, &wg)
	}
	var loads []*ledger.Load
	for _, n := range []string{"ant", "bee"} {
		l := &ledger.Load{NC: natsConn(t, procs[n]), Subject: "cmd.rot", Origin: n, History: cmds}
		loads = append(loads, l)
		wg.Add(1)
		go func() { // load generator: exits when stop is closed and the minimum is submitted
			defer wg.Done()
			l.Run(4, 100, 300, 100000, stop)
		}()
	}
	if !meshtest.Poll(30*time.Second, func() bool { return reqs.ok.Load() > 200 && loads[0].Started() > 100 }) {
		t.Fatal("the load did not start")
	}

	start := time.Now()
	code, out, errOut := m.rotate(t, "--all", "--wait", "25s")
	t.Logf("rotate --all took %s:\n%s%s", time.Since(start).Round(time.Millisecond), out, errOut)
	if code != 0 {
		t.Fatalf("rotate --all: exit %d", code)
	}
	for _, n := range names {
		for _, want := range []string{"node " + n + ": generation 2 (broker user node." + n + ".g2, database role meshbox_node_" + n + "_",
			"node " + n + ": switched to generation 2", "node " + n + ": generation 1 revoked"} {
			if !strings.Contains(out, want) {
				t.Errorf("rotate output lacks %q", want)
			}
		}
	}
	if !strings.Contains(out, "rotation complete") {
		t.Error("rotate output lacks: rotation complete")
	}
	// The load goes on for a while on the new credentials.
	after := reqs.ok.Load()
	if !meshtest.Poll(30*time.Second, func() bool { return reqs.ok.Load() > after+200 }) {
		t.Errorf("requests did not keep flowing after the rotation")
	}
	close(stop)
	wg.Wait()

	meshtest.Poll(time.Minute, func() bool { return len(cmds.Check().Lost) == 0 })
	r := cmds.Check()
	t.Logf("requests: %d ok, %d failed %v; commands: %s", reqs.ok.Load(), reqs.failed.Load(), reqs.errs, r)
	if reqs.failed.Load() != 0 {
		t.Errorf("got %d failed requests during the rotation, want 0: %v", reqs.failed.Load(), reqs.errs)
	}
	if r.Acked < 300 || !r.Valid() {
		t.Errorf("commands: %d acknowledged; lost %d, unmarked duplicates %d, unexpected %d; want >= 300 acknowledged and 0 of the others:\n%s",
			r.Acked, len(r.Lost), len(r.DupUnmarked), len(r.Unexpected), r)
	}
	for _, l := range loads {
		if _, refused, noAnswer := l.Answers(); len(refused) > 0 || len(noAnswer) > 0 {
			t.Errorf("submissions: %s; want every one accepted", l.Summary())
		}
	}
	for _, n := range names {
		if got := m.generations(t, n); !slices.Equal(got, []int{2}) {
			t.Errorf("%s's broker users: generations %v, want [2] (generation 1 revoked)", n, got)
		}
		st := waitIdentity(t, procs[n].HTTPURL(), n+" on generation 2 with no rotation left", func(s appliance.Status) bool {
			return s.Identity.Generation == 2 && s.Identity.Rotation == ""
		})
		if st.Identity.State != "in use" || st.Identity.BrokerUser != "node."+n+".g2" {
			t.Errorf("%s: identity %+v, want node.%s.g2 in use", n, *st.Identity, n)
		}
	}

	// The database side: the roles of the join tokens are gone, and the
	// nodes follow the bindings live under their new roles.
	for _, n := range names {
		if !strings.Contains(out, "node "+n+": generation 1 revoked (broker user deleted, database role meshbox_node_"+n+"_") {
			t.Errorf("rotate output does not say %s's first database role was dropped", n)
		}
		if code, _, _ := cliEnv(t, []string{"MESHBOX_DB=" + envValue(t, m.envs[n], "MESHBOX_DB")}, "mesh", "revision"); code == 0 {
			t.Errorf("%s's join-token role still logs in after the rotation", n)
		}
	}
	mesh(t, m.db, "setting", "set", "rotation.check", "done")
	for _, n := range names {
		meshtest.WaitStatus(t, procs[n].HTTPURL(), 15*time.Second, n+" follows a change under its new role", func(s appliance.Status) bool {
			return s.Bindings.DB == "connected" && hasChange(s, "setting", "added", "rotation.check")
		})
	}

	// meshbox nodes shows each node's generation (its peers' as their
	// heartbeats came, validated by the broker); meshbox status the node's.
	var out2 string
	if !meshtest.Poll(30*time.Second, func() bool {
		_, out2, _ = cli(t, "nodes", "--server", procs["ant"].NATSURL(), "--creds", filepath.Join(m.data["ant"], programs.AdminFile))
		return strings.Contains(out2, "broker user node.ant.g2, credential generation 2") &&
			peerRow(out2, "bee", "g2") && peerRow(out2, "cat", "g2")
	}) {
		t.Errorf("meshbox nodes on ant: got\n%s\nwant its own generation 2 and g2 for bee and cat", out2)
	}
	_, out2, _ = cli(t, "status", "--server", procs["ant"].NATSURL(), "--creds", filepath.Join(m.data["ant"], programs.AdminFile))
	if !strings.Contains(out2, "broker user node.ant.g2, generation 2, in use, age ") {
		t.Errorf("meshbox status on ant: got\n%s\nwant its identity row", out2)
	}
}

// peerRow reports whether the table of meshbox nodes has a row for node
// that shows cred.
func peerRow(out, node, cred string) bool {
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && f[0] == node && slices.Contains(f, cred) {
			return true
		}
	}
	return false
}

// TestRotateWaitsForOfflineNode rotates while one node is stopped: rotate
// revokes the running node's old credential, waits for the stopped one
// (bounded), names it and fails, leaving its old credential valid; once
// the node is back it switches, and a second rotate finishes.
func TestRotateWaitsForOfflineNode(t *testing.T) {
	t.Parallel()
	m := newIdentityMesh(t, "ant", "bee")
	ant := m.start(t, "ant")
	bee := m.start(t, "bee")
	waitIdentity(t, bee.HTTPURL(), "bee on generation 1", func(s appliance.Status) bool { return s.Identity.Generation == 1 })
	// Its public key in the mesh database first: rotate seals the new
	// credential to it (CI stopped bee before it had published it).
	waitKeysInStep(t, bee)
	bee.Signal(syscall.SIGTERM)
	if code := bee.Wait(); code != 0 {
		t.Fatalf("bee stopped with exit %d", code)
	}

	code, out, errOut := m.rotate(t, "--all", "--wait", "3s")
	t.Logf("first rotate:\n%s%s", out, errOut)
	if code == 0 {
		t.Fatal("rotate with a node offline: exit 0, want a failure naming it")
	}
	for _, want := range []string{"waiting for ", "bee (since ", "node ant: generation 1 revoked"} {
		if !strings.Contains(out, want) {
			t.Errorf("rotate output lacks %q", want)
		}
	}
	if !strings.Contains(errOut, "bee (generation 2 waiting since ") || !strings.Contains(errOut, "did not switch") {
		t.Errorf("rotate error: got %q, want it to name bee, its generation and since when", errOut)
	}
	if got := m.generations(t, "bee"); !slices.Equal(got, []int{1, 2}) {
		t.Errorf("bee's broker users while it is offline: %v, want [1 2] (its old credential stays valid)", got)
	}
	if out := mesh(t, m.db, "node", "list"); !strings.Contains(out, "g2 (not switched yet; g1 still valid)") {
		t.Errorf("mesh node list while bee is offline: got\n%s\nwant bee's pending generation", out)
	}
	if got := m.generations(t, "ant"); !slices.Equal(got, []int{2}) {
		t.Errorf("ant's broker users: %v, want [2]", got)
	}
	waitIdentity(t, ant.HTTPURL(), "ant on generation 2", func(s appliance.Status) bool {
		return s.Identity.Generation == 2 && s.Identity.State == "in use"
	})
	// Restarted, ant logs in to the database with its new role from the
	// cache: the role in its env file is gone.
	ant.Signal(syscall.SIGTERM)
	if code := ant.Wait(); code != 0 {
		t.Fatalf("ant stopped with exit %d", code)
	}
	ant = m.start(t, "ant")
	meshtest.WaitStatus(t, ant.HTTPURL(), 15*time.Second, "ant restarted, bindings from the database", func(s appliance.Status) bool {
		return s.Bindings.Source == "db" && s.Bindings.DB == "connected"
	})

	bee = m.start(t, "bee")
	waitIdentity(t, bee.HTTPURL(), "bee back, on generation 2, the old one not revoked yet", func(s appliance.Status) bool {
		return s.Identity.Generation == 2 && s.Identity.State == "in use" && strings.Contains(s.Identity.Rotation, "older generations [1]")
	})
	// The rotation in progress shows on the status page and in meshbox
	// status.
	page := renderPage(t, bee.HTTPURL()+"/")
	if got := page.text(t, "identity-user"); got != "node.bee.g2" {
		t.Errorf("status page: broker user %q, want node.bee.g2", got)
	}
	if got := page.text(t, "identity-credential"); !strings.HasPrefix(got, "generation 2 · in use · age ") {
		t.Errorf("status page: credential %q, want generation 2 · in use · age ...", got)
	}
	if got := page.text(t, "identity-rotation"); !strings.HasPrefix(got, "Rotation in progress: ") || !strings.Contains(got, "older generations [1]") {
		t.Errorf("status page: rotation %q, want the rotation in progress with older generations [1]", got)
	}
	if _, st, _ := cli(t, "status", "--server", bee.NATSURL(), "--creds", filepath.Join(m.data["bee"], programs.AdminFile)); !strings.Contains(st, "older generations [1]") {
		t.Errorf("meshbox status on bee: got\n%s\nwant the rotation in progress", st)
	}
	code, out, errOut = m.rotate(t, "--all", "--wait", "20s")
	t.Logf("second rotate:\n%s%s", out, errOut)
	if code != 0 {
		t.Fatalf("second rotate: exit %d", code)
	}
	for _, want := range []string{"node bee: finishing the rotation to generation 2", "node bee: generation 1 revoked", "rotation complete"} {
		if !strings.Contains(out, want) {
			t.Errorf("second rotate output lacks %q", want)
		}
	}
	if strings.Contains(out, "node ant: generation 3") || !strings.Contains(out, "node ant: no rotation pending; not rotated now") {
		t.Errorf("the second rotate should only finish bee's pending rotation, not rotate ant again:\n%s", out)
	}
	if got := m.generations(t, "bee"); !slices.Equal(got, []int{2}) {
		t.Errorf("bee's broker users after the second rotate: %v, want [2]", got)
	}
	waitIdentity(t, bee.HTTPURL(), "bee with no rotation left", func(s appliance.Status) bool { return s.Identity.Rotation == "" })

	// doctor on the stopped bee: its credential (from its cached bindings)
	// works and is its own, without the admin's rights.
	nats := natsListen(t, bee.NATSURL())
	bee.Signal(syscall.SIGTERM)
	if code := bee.Wait(); code != 0 {
		t.Fatalf("bee stopped with exit %d", code)
	}
	code, rep := doctor(t, "--env-file", m.envs["bee"], "--data", m.data["bee"], "--nats", nats)
	if code != 0 {
		t.Errorf("doctor on bee: exit %d, failed: %v", code, rep.failed())
	}
	wantCheck(t, rep, "broker", "ok", "node.bee.g2:xxxxx@", "credentials accepted")
	wantCheck(t, rep, "broker credential", "ok", "own broker user node.bee.g2 (generation 2)", "no admin rights")
}

// TestRotateBadInput: rotate and the other admin commands on a node's
// identity refuse bad input with errors that say what is wrong.
func TestRotateBadInput(t *testing.T) {
	t.Parallel()
	m := newIdentityMesh(t, "ant")
	mgmt := m.rmq.ManagementURL()
	port := strings.TrimPrefix(mgmt, "http://127.0.0.1:")
	notAPI := httptest.NewServer(http.NotFoundHandler())
	defer notAPI.Close()
	withAdmin := func(u string) []string { return []string{"MESHBOX_DB=" + m.db, "MESHBOX_BROKER_ADMIN=" + u} }
	bad := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"unknown node", m.admin, []string{"node", "rotate", "nobody"}, `node "nobody" not found`},
		{"node without identity", m.admin, []string{"node", "rotate", "hub"}, `node "hub" has no broker credential`},
		{"name and --all", m.admin, []string{"node", "rotate", "ant", "--all"}, "not both"},
		{"no name", m.admin, []string{"node", "rotate"}, "give one node NAME, or --all"},
		{"unbounded wait", m.admin, []string{"node", "rotate", "ant", "--wait", "0s"}, "--wait 0s: must be more than 0"},
		{"no admin credential", []string{"MESHBOX_DB=" + m.db}, []string{"node", "rotate", "ant"}, "--broker-admin is required"},
		{"wrong admin password", withAdmin("http://guest:wrong@127.0.0.1:" + port), []string{"node", "rotate", "ant"}, "401: wrong admin user or password"},
		{"admin URL not http", withAdmin("amqp://guest:guest@127.0.0.1:" + port), []string{"node", "rotate", "ant"}, "scheme must be http or https"},
		{"admin URL without password", withAdmin("http://127.0.0.1:" + port), []string{"node", "rotate", "ant"}, "needs the admin's user and password"},
		{"management plugin not listening", withAdmin("http://guest:guest@" + meshtest.ClosedAddr(t)),
			[]string{"node", "rotate", "ant"}, "rabbitmq_management plugin"},
		{"not the management API", withAdmin(strings.Replace(notAPI.URL, "http://", "http://guest:guest@", 1)),
			[]string{"node", "rotate", "ant"}, "no management API"},
		{"existing node", m.admin, []string{"node", "add", "ant"}, `node "ant" already exists`},
		{"set-stages of an unknown node", m.admin, []string{"node", "set-stages", "nobody", "x"}, `node "nobody" not found`},
		{"set-stages bad stage", m.admin, []string{"node", "set-stages", "ant", "a b"}, "stage name"},
		{"remove without admin credential", []string{"MESHBOX_DB=" + m.db}, []string{"node", "remove", "ant"}, "--broker-admin is required"},
	}
	for _, b := range bad {
		code, _, errOut := cliEnv(t, b.env, append([]string{"mesh"}, b.args...)...)
		if code == 0 || !strings.Contains(errOut, b.want) {
			t.Errorf("%s: exit %d, stderr %q; want a failure saying %q", b.name, code, errOut, b.want)
		}
		if strings.Contains(errOut, "guest:wrong") || strings.Contains(errOut, "guest:guest") {
			t.Errorf("%s: the error repeats the admin password: %s", b.name, errOut)
		}
	}
	// Nothing changed: ant still has generation 1 only.
	if got := m.generations(t, "ant"); !slices.Equal(got, []int{1}) {
		t.Errorf("ant's broker users after refused commands: %v, want [1]", got)
	}
}

// TestSetStagesAndRemove: set-stages updates the permissions of the node's
// broker user (the node may consume only the allowed stages), and remove
// deletes its broker users and database role.
func TestSetStagesAndRemove(t *testing.T) {
	t.Parallel()
	m := newIdentityMesh(t, "ant")
	code, out, errOut := cliEnv(t, m.admin, "mesh", "node", "set-stages", "ant", "resize", "thumbs")
	if code != 0 || !strings.Contains(out, "permissions of broker user node.ant.g1 updated") {
		t.Fatalf("set-stages: exit %d: %s%s", code, out, errOut)
	}
	perms := m.permissions(t, "node.ant.g1")
	if !strings.Contains(perms, "resize") || !strings.Contains(perms, "thumbs") {
		t.Errorf("node.ant.g1's permissions after set-stages: %s; want them to name resize and thumbs", perms)
	}
	code, out, errOut = cliEnv(t, m.admin, "mesh", "node", "remove", "ant")
	if code != 0 || !strings.Contains(out, "broker user of generation 1 deleted") {
		t.Fatalf("remove: exit %d: %s%s", code, out, errOut)
	}
	if got := m.generations(t, "ant"); len(got) != 0 {
		t.Errorf("ant's broker users after remove: %v, want none", got)
	}
}

// permissions returns the read permission pattern of user on the mesh's
// vhost, from the management API.
func (m *identityMesh) permissions(t *testing.T, user string) string {
	t.Helper()
	u, err := url.Parse(m.vhost)
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		Read string `json:"read"`
	}
	getJSON(t, m.rmq.ManagementURL()+"/api/permissions/"+strings.TrimPrefix(u.Path, "/")+"/"+url.PathEscape(user), "guest", &p)
	return p.Read
}

// envValue returns a variable of an env file written by meshbox join.
func envValue(t *testing.T, file, name string) string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, name+"="); ok {
			return strings.Trim(v, `"'`)
		}
	}
	t.Fatalf("%s: no %s", file, name)
	return ""
}
