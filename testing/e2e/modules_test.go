package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/modules"
	"github.com/meshbox/meshbox/testing/ledger"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
	"github.com/meshbox/meshbox/testing/testio"
	"github.com/nats-io/nats.go"
)

// getModules reads the modules of a node's /status, by name.
func getModules(t *testing.T, httpURL string) map[string]modules.Status {
	t.Helper()
	return modulesOf(meshtest.Status(t, httpURL))
}

func modulesOf(st appliance.Status) map[string]modules.Status {
	out := map[string]modules.Status{}
	for _, m := range st.Modules {
		out[m.Module] = m
	}
	return out
}

// waitModule waits until the node's status lists module name and ok
// accepts its status, or fails after d.
func waitModule(t *testing.T, httpURL, name string, d time.Duration, what string, ok func(modules.Status) bool) modules.Status {
	t.Helper()
	var m modules.Status
	meshtest.WaitStatus(t, httpURL, d, "module "+name+": "+what, func(st appliance.Status) bool {
		var found bool
		m, found = modulesOf(st)[name]
		return found && ok(m)
	})
	return m
}

func moduleRunning(m modules.Status) bool { return m.State == "running" && m.Pid > 0 }

// processGone reports whether pid no longer runs (a zombie of an exited
// node's child counts as gone: it runs nothing).
func processGone(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return true
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// The state follows the command name in parentheses.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] == 'Z'
}

// waitGone waits until every pid is gone, or fails after d.
func waitGone(t *testing.T, d time.Duration, what string, pids ...int) {
	t.Helper()
	if !meshtest.Poll(d, func() bool {
		for _, p := range pids {
			if !processGone(p) {
				return false
			}
		}
		return true
	}) {
		var ps []string
		for _, p := range pids {
			stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
			status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", p))
			ps = append(ps, string(stat)+"\n"+string(status))
		}
		t.Fatalf("%s: processes %v still run after %s:\n%s", what, pids, d, strings.Join(ps, "\n"))
	}
}

var testModule struct {
	once sync.Once
	path string
	err  error
}

// testModuleBinary builds ./testing/e2e/testmodule once per test process.
func testModuleBinary(t *testing.T) string {
	t.Helper()
	testModule.once.Do(func() {
		dir, err := os.MkdirTemp("", "meshbox-testmodule-")
		if err != nil {
			testModule.err = err
			return
		}
		testModule.path = filepath.Join(dir, "testmodule")
		out, err := exec.Command("go", "build", "-o", testModule.path, "./testmodule").CombinedOutput()
		if err != nil {
			testModule.err = fmt.Errorf("go build ./testmodule: %v\n%s", err, out)
		}
	})
	if testModule.err != nil {
		t.Fatal(testModule.err)
	}
	return testModule.path
}

// writeModule writes catalog/name/manifest.json and, when script is not
// "", an executable catalog/name/run.sh.
func writeModule(t *testing.T, catalog, name, manifest, script string) {
	t.Helper()
	dir := filepath.Join(catalog, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	if script != "" {
		if err := os.WriteFile(filepath.Join(dir, "run.sh"), []byte("#!/bin/sh\n"+script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// scriptModule is the manifest of a module that runs run.sh.
func scriptModule(name string) string {
	return fmt.Sprintf(`{"name": %q, "selections": {"stable": {"command": "./run.sh"}}, "stop_grace": "2s"}`, name)
}

// modulesConfig writes a node config file with sub-second restart pauses
// and a crash loop after 3 failures, and returns its path.
func modulesConfig(t *testing.T) string {
	t.Helper()
	data := `{"modules": {"restart_min": "50ms", "restart_max": "200ms", "crash_loop_restarts": 3,
		"crash_loop_window": "30s", "crash_loop_retry": "10m"}}`
	file := filepath.Join(t.TempDir(), "modules.json")
	if err := os.WriteFile(file, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// readAll GETs u and returns the body.
func readAll(t *testing.T, u string) string {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestModulesFollowTheMesh runs two nodes on the real broker and database.
// alpha's catalog holds a module hosting a capability over NATS, a module
// that declares a stage it does not serve, and a plain one. It checks:
// autostart at node start; the capability called from beta; mesh assign
// and unassign acting within a second; an override restarting the module
// with its new value; a grant arriving as a 0600 file and nowhere else;
// a stage declared for an assigned module accepting commands before any
// handler serves it; the "declares but does not serve" warning; and
// SIGTERM to the node stopping every module.
func TestModulesFollowTheMesh(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, RabbitMQ and two nodes")
	}
	meshtest.Binary(t)
	prog := testModuleBinary(t)
	rmq := meshtest.RabbitMQ(t)
	vhost := rmq.Vhost(t)
	db := meshtest.Postgres(t).Database(t)
	if code, _, errOut := cli(t, "init", "--db", db, "--node", "alpha", "--broker", meshtest.NoCredential(vhost)); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	mesh(t, db, "node", "add", "beta", "--record-only")

	cat := t.TempDir()
	writeModule(t, cat, "greeter", fmt.Sprintf(`{
		"name": "greeter",
		"selections": {"stable": {"command": %q, "env": {"CAP": "greet", "COLOR": "blue"}}},
		"hosts": {"capabilities": ["greet"]},
		"uses": {"capabilities": ["clock"], "subscribes": ["greetings"]},
		"overrides": {"color": "COLOR"},
		"grants": [{"resource": "nas-storage"}],
		"stop_grace": "2s"}`, prog), "")
	writeModule(t, cat, "backups", `{"name": "backups", "selections": {"stable": {"command": "./run.sh"}},
		"hosts": {"stages": ["nightly-backup"]}, "start_grace": "500ms", "stop_grace": "2s"}`, "exec sleep 600\n")
	writeModule(t, cat, "idle", `{"name": "idle", "selections": {"stable": {"command": "./run.sh"}},
		"hosts": {"stages": ["idle-work"]}, "start_grace": "1m", "stop_grace": "2s"}`, "exec sleep 600\n")
	mesh(t, db, "assign", "alpha", "greeter", "--selection", "stable", "--autostart")
	mesh(t, db, "assign", "alpha", "backups", "--selection", "stable", "--autostart")

	alpha := meshtest.StartProcess(t, "--node", "alpha", "--db", db, "--broker", vhost, "--modules-dir", cat, "--config", modulesConfig(t))
	beta := meshtest.StartProcess(t, "--node", "beta", "--db", db, "--broker", vhost)
	for _, p := range []*meshtest.Process{alpha, beta} {
		meshtest.WaitStatus(t, p.HTTPURL(), 30*time.Second, p.Node()+" connected to the broker", func(s appliance.Status) bool { return s.Broker.State == "connected" })
	}

	// Autostart at node start.
	greeter := waitModule(t, alpha.HTTPURL(), "greeter", 10*time.Second, "greeter running", moduleRunning)
	backups := waitModule(t, alpha.HTTPURL(), "backups", 10*time.Second, "backups running", moduleRunning)

	// The module's capability, called from the other node.
	nb := natsConn(t, beta)
	waitCallable(t, nb, "cap.greet", nil, func(m *nats.Msg) bool { return string(m.Data) == "hello from greeter on alpha" })

	// A stage declared by an assigned module takes commands before any
	// handler serves it; a stage nobody is assigned is refused.
	if o, resp, err := ledger.Submit(nb, "cmd.nightly-backup", []byte("run"), 5*time.Second); o != ledger.Acked {
		t.Errorf("command for the declared stage nightly-backup: got %v %v %v, want accepted", o, err, resp)
	}
	if o, resp, _ := ledger.Submit(nb, "cmd.nobody-assigned", []byte("run"), 5*time.Second); o != ledger.Refused {
		t.Errorf("command for an unassigned stage: got %v, want refused", o)
	} else if code, _ := natstest.ServiceError(resp); code != 503 {
		t.Errorf("command for an unassigned stage: got code %d, want 503", code)
	}
	// ...and the node says the module does not serve what it declares.
	waitModule(t, alpha.HTTPURL(), "backups", 5*time.Second, "the declared-but-not-served warning", func(m modules.Status) bool {
		return len(m.Warnings) == 1 && m.Warnings[0] == "module backups declares stage `nightly-backup` but does not serve it"
	})
	if !meshtest.Poll(5*time.Second, func() bool {
		return strings.Contains(alpha.Output(), "level=WARN msg=\"module backups declares stage `nightly-backup` but does not serve it\"")
	}) {
		t.Error("the node's log does not warn that backups does not serve its stage")
	}
	if m := getModules(t, alpha.HTTPURL())["greeter"]; len(m.Warnings) != 0 {
		t.Errorf("greeter serves what it declares: got warnings %v", m.Warnings)
	}

	// mesh assign starts a module on the running node within a second, and
	// mesh unassign stops it within a second. The stage it declares takes
	// commands once it is assigned, and not before.
	if o, resp, _ := ledger.Submit(nb, "cmd.idle-work", []byte("run"), 5*time.Second); o != ledger.Refused {
		t.Errorf("command for idle-work before idle is assigned: got %v, want refused", o)
	} else if code, _ := natstest.ServiceError(resp); code != 503 {
		t.Errorf("command for idle-work before idle is assigned: got code %d, want 503", code)
	}
	start := time.Now()
	mesh(t, db, "assign", "alpha", "idle", "--selection", "stable", "--autostart")
	idle := waitModule(t, alpha.HTTPURL(), "idle", 5*time.Second, "idle running", moduleRunning)
	if d := time.Since(start); d > time.Second+300*time.Millisecond { // the CLI's own start-up included
		t.Errorf("assigned module running after %s, want within about 1s", d)
	} else {
		t.Logf("mesh assign → module running: %s (the CLI's run included)", d.Round(time.Millisecond))
	}
	if o, resp, err := ledger.Submit(nb, "cmd.idle-work", []byte("run"), 5*time.Second); o != ledger.Acked {
		t.Errorf("command for the stage of idle, assigned to the running node: got %v %v %v, want accepted", o, err, resp)
	}
	start = time.Now()
	mesh(t, db, "unassign", "alpha", "idle")
	waitGone(t, 5*time.Second, "unassigned module", idle.Pid)
	if d := time.Since(start); d > time.Second+300*time.Millisecond {
		t.Errorf("unassigned module gone after %s, want within about 1s", d)
	} else {
		t.Logf("mesh unassign → module process gone: %s (the CLI's run included)", d.Round(time.Millisecond))
	}
	if _, still := getModules(t, alpha.HTTPURL())["idle"]; still {
		t.Error("an unassigned module is still in the status")
	}

	// The module's own credential allows what its manifest declares and
	// nothing else.
	na := natsConn(t, alpha)
	for probe, allowed := range map[string]bool{
		"sub:cap.greet":                         true,
		"sub:evt.greetings":                     true,
		"pub:cap.clock":                         true,
		"sub:cap.other":                         false,
		"sub:work.nightly-backup":               false, // a stage another module declares
		"sub:evt.other":                         false,
		"pub:cap.other":                         false,
		"pub:cmd.nightly-backup":                false,
		"pub:" + appliance.SubjectModuleControl: false,
	} {
		got := call(t, na, "cap.greet", probe)
		if allowed && got != "allowed" || !allowed && !strings.HasPrefix(got, "denied: nats: permissions violation") {
			t.Errorf("greeter's credential, %s: got %q, want allowed %v", probe, got, allowed)
		}
	}

	// An override change restarts the module with the new value.
	if got := call(t, na, "cap.greet", "env:COLOR"); got != "blue" {
		t.Fatalf("COLOR before the override: got %q, want blue (the selection's env)", got)
	}
	mesh(t, db, "override", "set", "alpha", "greeter", "color", "red")
	restarted := waitModule(t, alpha.HTTPURL(), "greeter", 5*time.Second, "greeter restarted", func(m modules.Status) bool {
		return moduleRunning(m) && m.Pid != greeter.Pid
	})
	waitGone(t, 5*time.Second, "the greeter before the override", greeter.Pid)
	waitCallable(t, na, "cap.greet", nil, func(m *nats.Msg) bool { c, _ := natstest.ServiceError(m); return c == 0 })
	if got := call(t, na, "cap.greet", "env:COLOR"); got != "red" {
		t.Errorf("COLOR after the override: got %q, want red", got)
	}
	if restarted.Restarts != 0 {
		t.Errorf("a restart for a change counted as a failure: restarts %d", restarted.Restarts)
	}

	// A grant arrives as a 0600 file named in the module's environment,
	// and appears in no log, status or argument.
	const secret = "grant-secret-7f3a9c"
	credFile := filepath.Join(t.TempDir(), "cred")
	if err := os.WriteFile(credFile, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	mesh(t, db, "grant", "alpha", "nas-storage", "nas", "--credential-file", credFile)
	granted := waitModule(t, alpha.HTTPURL(), "greeter", 5*time.Second, "greeter restarted with the grant", func(m modules.Status) bool {
		return moduleRunning(m) && m.Pid != restarted.Pid
	})
	waitCallable(t, na, "cap.greet", nil, func(m *nats.Msg) bool { c, _ := natstest.ServiceError(m); return c == 0 })
	path := call(t, na, "cap.greet", "env:MESHBOX_GRANT_NAS_STORAGE")
	if path == "" {
		t.Fatal("MESHBOX_GRANT_NAS_STORAGE is not in the module's environment")
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("grant file: %v", err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("grant file mode: got %v, want 0600", fi.Mode().Perm())
	}
	if di, err := os.Stat(filepath.Dir(filepath.Dir(path))); err != nil || di.Mode().Perm() != 0o700 {
		t.Errorf("runtime directory: mode %v (%v), want 0700", di.Mode().Perm(), err)
	}
	if data, _ := os.ReadFile(path); string(data) != secret {
		t.Errorf("grant file holds %q, want the credential", data)
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", granted.Pid))
	environ, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", granted.Pid))
	onAlpha := []string{"MESHBOX_SERVER=" + alpha.NATSURL(), "MESHBOX_DATA=" + alpha.DataDir()}
	_, modulesJSON, _ := cliEnv(t, onAlpha, "modules", "--json")
	_, moduleLogs, _ := cliEnv(t, onAlpha, "module", "logs", "greeter")
	for what, text := range map[string]string{
		"the node's log":           alpha.Output(),
		"the status":               readAll(t, alpha.HTTPURL()+"/status"),
		"the metrics":              readAll(t, alpha.HTTPURL()+"/metrics"),
		"meshbox modules --json":   modulesJSON,
		"meshbox module logs":      moduleLogs,
		"the module's arguments":   string(cmdline),
		"the module's environment": string(environ),
	} {
		if strings.Contains(text, secret) {
			t.Errorf("the grant's credential is in %s", what)
		}
	}
	if !strings.Contains(modulesJSON, `"greeter"`) {
		t.Errorf("meshbox modules --json does not list greeter:\n%s", modulesJSON)
	}

	// SIGTERM to the node stops every module, then the node.
	pids := []int{granted.Pid, backups.Pid}
	alpha.Signal(syscall.SIGTERM)
	if code := alpha.Wait(); code != 0 {
		t.Errorf("node stopped with exit %d", code)
	}
	waitGone(t, time.Second, "modules after the node's SIGTERM", pids...)
	out := alpha.Output()
	if i, j := strings.Index(out, "modules stopped"), strings.Index(out, "msg=stopped"); i < 0 || j < 0 || i > j {
		t.Errorf("the node's log does not say the modules stopped before the node did")
	}
	if !strings.Contains(out, "module=greeter stream=stdout line=stopping") {
		t.Errorf("the greeter's output (stopping on SIGTERM) is not in the node's log")
	}
}

// call calls subject with body on nc and returns the answer.
func call(t *testing.T, nc *nats.Conn, subject, body string) string {
	t.Helper()
	m, err := nc.Request(subject, []byte(body), 5*time.Second)
	if err != nil {
		t.Fatalf("call %s: %v", subject, err)
	}
	return string(m.Data)
}

// TestModulesSupervision runs one node on the real database with modules
// that fail: one that exits once and is restarted, one that always exits
// and becomes crash-looping (a degraded readiness and metrics say so), and
// three that cannot run (a manifest without a command, a selection the
// manifest lacks, a program that does not exist), each a named error in
// the status and in `meshbox modules`, while the others run. It also
// drives the modules by hand with `meshbox module`.
func TestModulesSupervision(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL and a node")
	}
	t.Parallel()
	meshtest.Binary(t)
	db := meshtest.Postgres(t).Database(t)
	if code, _, errOut := cli(t, "init", "--db", db, "--node", "alpha", "--broker", "amqp://127.0.0.1:5672/"); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	cat := t.TempDir()
	writeModule(t, cat, "once", scriptModule("once"), "if [ -e ran ]; then echo second run; exec sleep 600; fi\ntouch ran\necho failing once\nexit 1\n")
	writeModule(t, cat, "flaky", scriptModule("flaky"), "echo failing again\nexit 7\n")
	writeModule(t, cat, "steady", scriptModule("steady"), "echo steady up\nexec sleep 600\n")
	writeModule(t, cat, "manual", scriptModule("manual"), "echo manual up\nexec sleep 600\n")
	writeModule(t, cat, "nocommand", `{"name": "nocommand", "selections": {"stable": {"args": ["x"]}}}`, "")
	writeModule(t, cat, "noprogram", `{"name": "noprogram", "selections": {"stable": {"command": "./not-there"}}}`, "")
	for _, m := range []string{"once", "flaky", "steady", "nocommand", "noprogram"} {
		mesh(t, db, "assign", "alpha", m, "--selection", "stable", "--autostart")
	}
	mesh(t, db, "assign", "alpha", "unknownsel", "--selection", "nightly", "--autostart")
	writeModule(t, cat, "unknownsel", scriptModule("unknownsel"), "exec sleep 600\n")
	mesh(t, db, "assign", "alpha", "manual", "--selection", "stable")

	p := meshtest.StartProcess(t, "--node", "alpha", "--db", db, "--modules-dir", cat, "--config", modulesConfig(t))
	server := []string{"MESHBOX_SERVER=" + p.NATSURL(), "MESHBOX_DATA=" + p.DataDir()}

	// A module that exits is restarted (after a pause) and then runs.
	once := waitModule(t, p.HTTPURL(), "once", 10*time.Second, "once running again", func(m modules.Status) bool {
		return moduleRunning(m) && m.Restarts == 1
	})
	if once.LastExit == nil || once.LastExit.Code != 1 {
		t.Errorf("once: last exit %+v, want status 1", once.LastExit)
	}
	// One that always exits becomes crash-looping after 3 failures.
	flaky := waitModule(t, p.HTTPURL(), "flaky", 10*time.Second, "flaky crash-looping", func(m modules.Status) bool { return m.State == "crash-looping" })
	if flaky.Restarts != 3 || flaky.LastExit == nil || flaky.LastExit.Code != 7 || !strings.Contains(flaky.Error, "failed 3 times in a row") {
		t.Errorf("flaky: got %+v, want 3 restarts, last exit 7, the reason", flaky)
	}
	// Each restart came after its pause: modulesConfig's restart_min 50ms,
	// doubling, jittered down to half.
	code, flakyLogs, errOut := cliEnv(t, server, "module", "logs", "flaky")
	var runs []time.Time
	for line := range strings.SplitSeq(strings.TrimSpace(flakyLogs), "\n") {
		at, text, _ := strings.Cut(line, " ")
		tm, err := time.ParseInLocation("15:04:05.000", at, time.Local)
		if err != nil || text != "stdout failing again" {
			t.Fatalf("module logs flaky: line %q, want a time and stdout failing again", line)
		}
		runs = append(runs, tm)
	}
	if code != 0 || len(runs) != 3 {
		t.Fatalf("module logs flaky: exit %d, %d runs, want 3:\n%s%s", code, len(runs), flakyLogs, errOut)
	}
	for i := 1; i < len(runs); i++ {
		gap := runs[i].Sub(runs[i-1])
		if gap < 0 {
			gap += 24 * time.Hour // past midnight
		}
		// The pause starts once the run's output was read; the log's times
		// are cut to the millisecond.
		if least := (50*time.Millisecond<<(i-1))/2 - time.Millisecond; gap < least {
			t.Errorf("flaky's run %d started %v after the one before, want a pause of at least %v", i+1, gap, least)
		} else {
			t.Logf("flaky's run %d started %v after the one before (pause at least %v)", i+1, gap, least)
		}
	}
	time.Sleep(300 * time.Millisecond) // real time is the thing under test: no restart during the slow retry
	if m := getModules(t, p.HTTPURL())["flaky"]; m.State != "crash-looping" || m.Restarts != 3 {
		t.Errorf("flaky while crash-looping: got %s with %d restarts, want no more restarts", m.State, m.Restarts)
	}
	var rd struct {
		Ready    bool     `json:"ready"`
		Degraded []string `json:"degraded"`
	}
	// Its broker does not answer either (init gave it one that is not
	// there): that is the other cause. A node new to the mesh lacks its
	// content key for its first tens of ms (a third cause, gone once it
	// holds the key; on a busy machine, still there when the module had
	// failed three times).
	readyz := func() bool {
		rd.Degraded = nil
		if err := json.Unmarshal([]byte(readAll(t, p.HTTPURL()+"/readyz")), &rd); err != nil {
			t.Fatal(err)
		}
		return rd.Ready && len(rd.Degraded) == 2 && anyHasPrefix(rd.Degraded, "module flaky is crash-looping") && anyHasPrefix(rd.Degraded, "broker link offline")
	}
	if !meshtest.Poll(10*time.Second, readyz) {
		t.Errorf("readyz: got %+v, want ready, degraded by module flaky and the broker offline", rd)
	}
	ms := scrape(t, p.HTTPURL())
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"meshbox_module_up", []string{"module=steady"}, 1},
		{"meshbox_module_up", []string{"module=flaky"}, 0},
		{"meshbox_module_restarts_total", []string{"module=flaky"}, 3},
		{"meshbox_module_restarts_total", []string{"module=once"}, 1},
		{"meshbox_module_state", []string{"module=flaky", "state=crash-looping"}, 1},
		{"meshbox_module_state", []string{"module=flaky", "state=running"}, 0},
		{"meshbox_module_state", []string{"module=nocommand", "state=failed"}, 1},
	} {
		if got, ok := ms.value(c.name, c.labels...); !ok || got != c.want {
			t.Errorf("%s%v: got %v (found %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}

	// Modules that cannot run: each a named error; the others run.
	for name, want := range map[string]struct{ state, err string }{
		"nocommand":  {"failed", "nocommand/manifest.json: selections.stable.command: required"},
		"noprogram":  {"failed", "noprogram/manifest.json: selections.stable.command: "},
		"unknownsel": {"failed", `selection "nightly" is not in the manifest of module unknownsel (it has stable)`},
	} {
		m := waitModule(t, p.HTTPURL(), name, 5*time.Second, want.state, func(m modules.Status) bool { return m.State == want.state })
		if !strings.Contains(m.Error, want.err) {
			t.Errorf("%s: error %q, want it to name %q", name, m.Error, want.err)
		}
	}
	steady := waitModule(t, p.HTTPURL(), "steady", 5*time.Second, "steady running", moduleRunning)
	code, table, errOut := cliEnv(t, server, "modules")
	if code != 0 {
		t.Fatalf("meshbox modules: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"MODULE", "steady", "running", "crash-looping", "not-there",
		"nocommand: error: ", "selections.stable.command: required", `unknownsel: error: selection "nightly"`, "stopped (no autostart)"} {
		if !strings.Contains(table, want) {
			t.Errorf("meshbox modules does not show %q:\n%s", want, table)
		}
	}

	// module logs -f prints the last lines, then new ones as they come.
	follow := exec.Command(meshtest.Binary(t), "module", "logs", "steady", "-f")
	follow.Env = append(os.Environ(), server...)
	followOut := &testio.Buffer{}
	follow.Stdout, follow.Stderr = followOut, followOut
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = follow.Process.Kill()
		_ = follow.Wait()
	})
	if !meshtest.Poll(5*time.Second, func() bool { return strings.Count(followOut.String(), "stdout steady up") == 1 }) {
		t.Fatalf("module logs -f: got %q, want the backlog line once", followOut.String())
	}

	// By hand: start one without autostart, stop and restart others.
	if code, _, errOut := cliEnv(t, server, "module", "start", "manual"); code != 0 {
		t.Fatalf("module start manual: exit %d: %s", code, errOut)
	}
	waitModule(t, p.HTTPURL(), "manual", 5*time.Second, "manual started by hand", moduleRunning)
	if code, _, errOut := cliEnv(t, server, "module", "stop", "steady"); code != 0 {
		t.Fatalf("module stop steady: exit %d: %s", code, errOut)
	}
	waitGone(t, 3*time.Second, "steady stopped by hand", steady.Pid)
	if m := waitModule(t, p.HTTPURL(), "steady", 3*time.Second, "steady stopped", func(m modules.Status) bool { return m.State == "stopped" }); m.Manual != "stopped" {
		t.Errorf("steady stopped by hand: manual %q, want stopped", m.Manual)
	}
	if code, _, errOut := cliEnv(t, server, "module", "restart", "steady"); code != 0 {
		t.Fatalf("module restart steady: exit %d: %s", code, errOut)
	}
	waitModule(t, p.HTTPURL(), "steady", 3*time.Second, "steady running again", moduleRunning)
	if !meshtest.Poll(5*time.Second, func() bool { return strings.Count(followOut.String(), "stdout steady up") == 2 }) {
		t.Errorf("module logs -f: got %q, want the new run's line after the backlog's", followOut.String())
	}
	if code, _, errOut := cliEnv(t, server, "module", "start", "nope"); code == 0 || !strings.Contains(errOut, "module not assigned to this node: nope") {
		t.Errorf("module start of an unassigned module: exit %d, %q", code, errOut)
	}
	if code, _, errOut := cliEnv(t, server, "module", "start", "nocommand"); code == 0 || !strings.Contains(errOut, "selections.stable.command: required") {
		t.Errorf("module start of a module that cannot run: exit %d, %q", code, errOut)
	}
	// Its output is in the node's log and in module logs.
	code, logs, errOut := cliEnv(t, server, "module", "logs", "once")
	if code != 0 || !strings.Contains(logs, "stdout failing once") || !strings.Contains(logs, "stdout second run") {
		t.Errorf("module logs once: exit %d, %q %q", code, logs, errOut)
	}
	if !strings.Contains(p.Output(), "module=steady stream=stdout line=\"steady up\"") {
		t.Error("steady's output is not in the node's log")
	}
}

// TestModulesWithoutTheDatabase checks that modules outlive the database
// and never outlive their node: with the database stopped they keep
// running, and its return restarts nothing; a node killed with SIGKILL
// leaves no module process behind; a node started again from its cache
// (the database still away) starts them again.
func TestModulesWithoutTheDatabase(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL and a node")
	}
	t.Parallel()
	meshtest.Binary(t)
	pg := meshtest.NewPostgres(t) // private: this test stops it
	db := pg.Database(t)
	if code, _, errOut := cli(t, "init", "--db", db, "--node", "alpha", "--broker", "amqp://127.0.0.1:5672/"); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	cat := t.TempDir()
	// sticky starts a child of its own and waits for it, as a shell script
	// that does not exec does: SIGKILL to the node must take both.
	writeModule(t, cat, "sticky", scriptModule("sticky"), "sleep 600 &\necho child $!\nwait\n")
	writeModule(t, cat, "plain", scriptModule("plain"), "exec sleep 600\n")
	mesh(t, db, "assign", "alpha", "sticky", "--selection", "stable", "--autostart")
	mesh(t, db, "assign", "alpha", "plain", "--selection", "stable", "--autostart")
	data := t.TempDir()
	args := []string{"--node", "alpha", "--db", db, "--data", data, "--modules-dir", cat, "--config", modulesConfig(t)}
	p := meshtest.StartProcess(t, args...)
	sticky := waitModule(t, p.HTTPURL(), "sticky", 10*time.Second, "sticky running", moduleRunning)
	plain := waitModule(t, p.HTTPURL(), "plain", 10*time.Second, "plain running", moduleRunning)

	// The database goes away: the modules keep running.
	pg.Stop(t)
	meshtest.WaitStatus(t, p.HTTPURL(), 20*time.Second, "the node noticing the database is away", func(s appliance.Status) bool { return s.Bindings.DB == "disconnected" })
	// And it comes back: nothing restarts.
	pg.Start(t)
	meshtest.WaitStatus(t, p.HTTPURL(), 30*time.Second, "the node reconnecting to the database", func(s appliance.Status) bool {
		return s.Bindings.DB == "connected" && s.Bindings.Source == "db"
	})
	ms := getModules(t, p.HTTPURL())
	for _, m := range []modules.Status{sticky, plain} {
		if got := ms[m.Module]; got.Pid != m.Pid || got.State != "running" || got.Restarts != 0 || processGone(m.Pid) {
			t.Errorf("%s across the database's absence: got %+v, want the same process (pid %d) running", m.Module, got, m.Pid)
		}
	}

	// SIGKILL to the node: no module process is left, the child of sticky
	// included.
	var child int
	for _, line := range strings.Split(p.Output(), "\n") {
		if i := strings.Index(line, `module=sticky stream=stdout line="child `); i >= 0 {
			fmt.Sscanf(line[i+len(`module=sticky stream=stdout line="child `):], "%d", &child)
		}
	}
	if child == 0 || processGone(child) {
		t.Fatalf("sticky's child is not running (pid %d)", child)
	}
	start := time.Now()
	p.Kill()
	waitGone(t, 2*time.Second, "modules after SIGKILL to the node", sticky.Pid, plain.Pid, child)
	t.Logf("SIGKILL to the node → every module process gone: %s", time.Since(start).Round(time.Millisecond))

	// Started again from its cache while the database is away: the modules
	// start again.
	pg.Stop(t)
	p = meshtest.StartProcess(t, args...)
	if st := meshtest.Status(t, p.HTTPURL()); st.Bindings.Source != "cache" {
		t.Fatalf("restart without the database: bindings source %q, want cache", st.Bindings.Source)
	}
	for _, name := range []string{"sticky", "plain"} {
		waitModule(t, p.HTTPURL(), name, 10*time.Second, name+" running from the cached bindings", moduleRunning)
	}
}
