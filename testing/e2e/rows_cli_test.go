package e2e

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v2"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/testio"
)

// onNode is the environment of a client command run on node p's machine.
func onNode(p *meshtest.Process) []string {
	return []string{"MESHBOX_SERVER=" + p.NATSURL(), "MESHBOX_DATA=" + p.DataDir(), "MESHBOX_CREDS="}
}

// rowsCLI runs `meshbox rows ARGS` on node p.
func rowsCLI(t *testing.T, p *meshtest.Process, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return cliEnv(t, onNode(p), append([]string{"rows"}, args...)...)
}

// waitRows runs `meshbox rows ARGS` on p until it exits with code and
// prints want (trimmed; "" for any output), and returns what it printed.
func waitRows(t *testing.T, p *meshtest.Process, d time.Duration, code int, want string, args ...string) string {
	t.Helper()
	var got, errOut string
	var c int
	if !meshtest.Poll(d, func() bool {
		c, got, errOut = rowsCLI(t, p, args...)
		return c == code && (want == "" || strings.TrimSpace(got) == want)
	}) {
		t.Fatalf("meshbox rows %s on %s: exit %d, printed %q (stderr %q); want exit %d printing %q within %s\n%s",
			strings.Join(args, " "), p.Node(), c, got, errOut, code, want, d, p.Output())
	}
	return got
}

// startWatch starts `meshbox rows watch ARGS` on p; its output is the
// buffer returned. It is killed when the test ends.
func startWatch(t *testing.T, p *meshtest.Process, args ...string) (*testio.Buffer, *testio.Buffer) {
	t.Helper()
	cmd := exec.Command(meshtest.Binary(t), append([]string{"rows", "watch"}, args...)...)
	cmd.Env = append(os.Environ(), onNode(p)...)
	out, errOut := &testio.Buffer{}, &testio.Buffer{}
	cmd.Stdout, cmd.Stderr = out, errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	meshtest.WaitFor(t, 10*time.Second, "rows watch subscribed", func() bool { return strings.Contains(errOut.String(), "watching ") })
	return out, errOut
}

// TestRowsAcrossTheMesh: a table defined with mesh table add, written on
// one node with the CLI and read on the other; a change the other node
// makes reaches a watch; history, list and delete; bad input is refused
// with a clear error and a non-zero exit.
func TestRowsAcrossTheMesh(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, RabbitMQ and two nodes")
	}
	alpha, beta, db := twoNodeMesh(t)

	// Refused before the table exists.
	code, _, errOut := rowsCLI(t, alpha, "get", "jobs", "42")
	if code != 3 || !strings.Contains(errOut, `no such table: "jobs" (meshbox mesh table add jobs makes it)`) {
		t.Errorf("rows get before the table exists: exit %d, %q; want exit 3 and the command that makes it", code, errOut)
	}
	out := mesh(t, db, "table", "add", "jobs")
	if !strings.Contains(out, "table jobs added, sealed with the mesh's key") || !strings.Contains(out, "the nodes make its log") {
		t.Errorf("mesh table add jobs:\n%s", out)
	}
	if out := mesh(t, db, "table", "list"); !strings.Contains(out, "jobs   the mesh's key  rows.jobs") {
		t.Errorf("mesh table list:\n%s", out)
	}

	// The nodes follow the mesh database: the table is there once they
	// read its new revision.
	waitRows(t, alpha, 20*time.Second, 0, "", "put", "jobs", "42", "status=queued")
	watch, _ := startWatch(t, alpha, "jobs")
	start := time.Now()
	waitRows(t, beta, 20*time.Second, 0, "queued", "get", "jobs", "42", "--field", "status")
	t.Logf("a write on alpha read on beta after %s", time.Since(start).Round(time.Millisecond))
	out = waitRows(t, beta, 5*time.Second, 0, "", "list", "jobs")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 || lines[1] != "42   status=queued" {
		t.Errorf("rows list jobs on beta: %q, want one row 42 status=queued", out)
	}

	// beta's change, printed by alpha's watch.
	if code, out, errOut := rowsCLI(t, beta, "put", "jobs", "42", "status=done", "worker=beta"); code != 0 || !strings.HasPrefix(out, "written jobs/42 on node beta") {
		t.Fatalf("rows put on beta: exit %d: %s%s", code, out, errOut)
	}
	meshtest.WaitFor(t, 20*time.Second, "alpha's watch printing beta's change", func() bool {
		return strings.Contains(watch.String(), "42: status=done, worker=beta (by beta, stamp ")
	})
	out = waitRows(t, alpha, 10*time.Second, 0, "", "history", "jobs", "42", "status")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 3 || !strings.HasSuffix(lines[1], "beta   done") || !strings.HasSuffix(lines[2], "alpha  queued") {
		t.Errorf("rows history jobs 42 status on alpha: %q, want beta's done over alpha's queued", out)
	}
	var d rows.RowDoc
	if code, out, errOut := rowsCLI(t, alpha, "get", "jobs", "42", "--json"); code != 0 || json.Unmarshal([]byte(out), &d) != nil ||
		d.Fields["worker"] != "beta" || d.Versions["status"].Node != "beta" {
		t.Errorf("rows get --json on alpha: exit %d %s%s", code, out, errOut)
	}

	// A delete is a tombstone that reaches the other node.
	if code, out, errOut := rowsCLI(t, beta, "delete", "jobs", "42"); code != 0 || !strings.HasPrefix(out, "deleted jobs/42 on node beta") {
		t.Fatalf("rows delete on beta: exit %d: %s%s", code, out, errOut)
	}
	waitRows(t, alpha, 20*time.Second, 3, "", "get", "jobs", "42")
	if code, out, _ := rowsCLI(t, alpha, "list", "jobs"); code != 0 || strings.TrimSpace(out) != "no rows in table jobs" {
		t.Errorf("rows list after the delete: exit %d %q", code, out)
	}
	meshtest.WaitFor(t, 10*time.Second, "alpha's watch printing the delete", func() bool {
		return strings.Contains(watch.String(), "42: status deleted, worker deleted (by beta")
	})

	// Bad input: a clear error and a non-zero exit.
	for _, tt := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"put", "jobs", "42", "status"}, 2, `"status" is not FIELD=VALUE: give each field with its value, as status=queued`},
		{[]string{"put", "Jobs", "42", "a=1"}, 2, `table "Jobs": a table name is`},
		{[]string{"put", "jobs", "42", "a=" + strings.Repeat("x", rows.MaxValueLen+1)}, 2, "bytes belong in a blob"},
		{[]string{"get", "jobs", "42"}, 3, "no such row: 42 in table jobs"},
		{[]string{"get", "nosuch", "1"}, 3, `no such table: "nosuch"`},
		{[]string{"history", "jobs", "42"}, 2, "usage: meshbox rows history TABLE ROW FIELD"},
	} {
		code, out, errOut := rowsCLI(t, alpha, tt.args...)
		if code != tt.code || !strings.Contains(errOut, tt.want) {
			t.Errorf("meshbox rows %s: exit %d, stdout %q, stderr %q; want exit %d saying %q", clip(strings.Join(tt.args, " "), 60), code, out, errOut, tt.code, tt.want)
		}
	}

	// The status shows the table.
	st := meshtest.Status(t, beta.HTTPURL())
	if len(st.Rows) != 1 || st.Rows[0].Table != "jobs" || !st.Rows[0].Synced || st.Rows[0].Pending != 0 || st.Rows[0].Alarm != "" {
		t.Errorf("beta's status rows: %+v, want jobs read from its log, nothing pending, no alarm", st.Rows)
	}
	if code, out, _ := cliEnv(t, onNode(beta), "status"); code != 0 || !strings.Contains(out, "table     jobs: 0 rows, 0 writes waiting for the broker, reading its log") {
		t.Errorf("meshbox status on beta: exit %d\n%s", code, out)
	}
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// TestRowsWithNodeUsers: on a mesh whose nodes log in to the broker as
// users of their own, made before tables of rows existed (their
// permissions name no table's log), mesh table add without the broker's
// admin is refused, saying why; with it, it makes the table's log and
// gives the users the permissions of this version, and a row written on
// one node reaches the other.
func TestRowsWithNodeUsers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, RabbitMQ and two nodes")
	}
	m := newIdentityMesh(t, "ant", "bee")
	u, err := url.Parse(m.vhost)
	if err != nil {
		t.Fatal(err)
	}
	vhost, _ := url.PathUnescape(strings.TrimPrefix(u.Path, "/"))
	rh, err := rabbithole.NewClient(m.rmq.ManagementURL(), "guest", "guest")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"ant", "bee"} {
		p, err := wire.NodePermissions(n, []string{wire.AllStages})
		if err != nil {
			t.Fatal(err)
		}
		old := func(s string) string { return strings.Replace(s, `|rows\.[a-z0-9_-]+`, "", 1) }
		if _, err := rh.UpdatePermissionsIn(vhost, wire.BrokerUser(n, 1), rabbithole.Permissions{Configure: p.Configure, Write: p.Write, Read: old(p.Read)}); err != nil {
			t.Fatal(err)
		}
		if _, err := rh.UpdateTopicPermissionsIn(vhost, wire.BrokerUser(n, 1), rabbithole.TopicPermissions{Exchange: p.TopicExchange, Write: old(p.TopicWrite), Read: p.TopicRead}); err != nil {
			t.Fatal(err)
		}
		if got := m.permissions(t, wire.BrokerUser(n, 1)); strings.Contains(got, "rows") {
			t.Fatalf("%s's read permission %q still names the tables' logs", n, got)
		}
	}
	ant, bee := m.start(t, "ant"), m.start(t, "bee")
	for _, p := range []*meshtest.Process{ant, bee} {
		waitKeysInStep(t, p)
	}

	noAdmin := []string{"MESHBOX_DB=" + m.db, "MESHBOX_BROKER_ADMIN="}
	code, out, errOut := cliEnv(t, noAdmin, "mesh", "table", "add", "jobs")
	if code != 2 || !strings.Contains(errOut, "stream queue rows.jobs, must be made with --broker-admin; nothing was changed") {
		t.Errorf("mesh table add without the broker's admin: exit %d: %s%s", code, out, errOut)
	}
	code, out, errOut = cliEnv(t, m.admin, "mesh", "table", "add", "jobs")
	if code != 0 {
		t.Fatalf("mesh table add jobs --broker-admin: exit %d: %s%s", code, out, errOut)
	}
	for _, want := range []string{"stream queue rows.jobs on ", "bound to exchange mesh with key rows.jobs, keeps 30 days or 1 GiB",
		"node ant: permissions of broker user node.ant.g1 updated", "node bee: permissions of broker user node.bee.g1 updated", "table jobs added"} {
		if !strings.Contains(out, want) {
			t.Errorf("mesh table add jobs --broker-admin: output lacks %q:\n%s", want, out)
		}
	}
	if got := m.permissions(t, "node.ant.g1"); !strings.Contains(got, `rows\.`) {
		t.Errorf("ant's read permission after table add: %q, want the tables' logs in it", got)
	}
	waitRows(t, ant, 20*time.Second, 0, "", "put", "jobs", "7", "status=queued", "owner=ant")
	waitRows(t, bee, 20*time.Second, 0, "queued", "get", "jobs", "7", "--field", "status")
	waitRows(t, bee, 5*time.Second, 0, "", "put", "jobs", "7", "status=done")
	waitRows(t, ant, 20*time.Second, 0, "done", "get", "jobs", "7", "--field", "status")
	for _, p := range []*meshtest.Process{ant, bee} {
		if st := meshtest.Status(t, p.HTTPURL()); len(st.Rows) != 1 || st.Rows[0].Alarm != "" || st.Rows[0].Pending != 0 {
			t.Errorf("%s's status rows: %+v", p.Node(), st.Rows)
		}
	}
}

// pageBlock is a shell block of a docs page with what its <!-- test: ...
// --> comment says of it.
type pageBlock struct {
	how   string
	lines []string
}

// pageBlocks returns the shell blocks of docs page name, each with its
// test comment; a block without one fails the test.
func pageBlocks(t *testing.T, name string) []pageBlock {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "docs", name))
	if err != nil {
		t.Fatal(err)
	}
	var blocks []pageBlock
	lines := strings.Split(string(raw), "\n")
	how := ""
	for i := 0; i < len(lines); i++ {
		if m := regexp.MustCompile(`^<!-- test: (.+) -->$`).FindStringSubmatch(lines[i]); m != nil {
			how = m[1]
			continue
		}
		if lines[i] != "```sh" {
			continue
		}
		if how == "" {
			t.Fatalf("docs/%s line %d: a shell block without a <!-- test: ... --> comment", name, i+1)
		}
		b := pageBlock{how: how}
		for i++; i < len(lines) && lines[i] != "```"; i++ {
			b.lines = append(b.lines, lines[i])
		}
		blocks = append(blocks, b)
		how = ""
	}
	return blocks
}

// TestRowsPage runs the commands of docs/rows.md as written on a mesh of
// the page's two nodes, attic and cellar: its admin commands against the
// mesh database, each node's meshbox rows commands and the nats CLI's
// requests of the rows API with a program's credential. A line that says
// "# prints: X" must print X (within 20 s: rows converge), one that says
// "# error: CODE" must get that error; every other must succeed.
func TestRowsPage(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, RabbitMQ and two nodes")
	}
	natsBin := natsCLI(t)
	blocks := pageBlocks(t, "rows.md")
	vhost := meshtest.RabbitMQ(t).Vhost(t)
	db := meshtest.Postgres(t).Database(t)
	if code, _, errOut := cli(t, "init", "--db", db, "--node", "attic", "--broker", meshtest.NoCredential(vhost)); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	mesh(t, db, "node", "add", "cellar", "--record-only")
	nodes := map[string]*meshtest.Process{}
	homes := map[string]string{}
	for _, n := range []string{"attic", "cellar"} {
		nodes[n] = meshtest.StartProcess(t, "--node", n, "--db", db)
		homes[n] = t.TempDir()
	}
	for _, p := range nodes {
		meshtest.WaitStatus(t, p.HTTPURL(), 20*time.Second, p.Node()+" connected to the broker", func(s appliance.Status) bool { return s.Broker.State == "connected" })
		waitKeysInStep(t, p)
	}
	exports := map[string][]string{}
	for _, b := range blocks {
		var p *meshtest.Process
		switch {
		case strings.HasPrefix(b.how, "skip"):
			continue
		case b.how == "admin":
		case strings.HasPrefix(b.how, "on "):
			if p = nodes[strings.TrimPrefix(b.how, "on ")]; p == nil {
				t.Fatalf("docs/rows.md: a block on %q, which is not one of the page's nodes", b.how)
			}
		default:
			t.Fatalf("docs/rows.md: unknown test comment %q", b.how)
		}
		for _, line := range b.lines {
			cmdLine, comment, _ := strings.Cut(line, "#")
			cmdLine = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(cmdLine), "sudo "))
			if cmdLine == "" {
				continue
			}
			comment = strings.TrimSpace(comment)
			want, wantsOut := strings.CutPrefix(comment, "prints: ")
			wantErr, wantsErr := strings.CutPrefix(comment, "error: ")
			if p != nil {
				cmdLine = strings.ReplaceAll(cmdLine, "/var/lib/meshbox", p.DataDir())
			}
			var code int
			var out, errOut string
			var run func()
			switch {
			case strings.HasPrefix(cmdLine, "meshbox "):
				env := []string{"MESHBOX_DB=" + db}
				if p != nil {
					env = onNode(p)
				}
				args := shellWords(t, cmdLine)[1:]
				run = func() { code, out, errOut = cliEnv(t, env, args...) }
			case p == nil:
				t.Fatalf("docs/rows.md: %q in the admin's block", line)
			case strings.HasPrefix(cmdLine, "export "):
				exports[p.Node()] = append(exports[p.Node()], cmdLine)
				continue
			default:
				script := strings.Join(append(slices.Clone(exports[p.Node()]), cmdLine), "\n")
				run = func() {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					defer cancel()
					cmd := exec.CommandContext(ctx, "bash", "-c", script)
					// meshbox too, on the node, for a line that pipes into it.
					cmd.Env = append(append(os.Environ(), onNode(p)...), "HOME="+homes[p.Node()], "USER="+currentUser(), "NATS_URL="+p.NATSURL(),
						"PATH="+filepath.Dir(natsBin)+string(os.PathListSeparator)+filepath.Dir(meshtest.Binary(t))+string(os.PathListSeparator)+os.Getenv("PATH"))
					var o, e strings.Builder
					cmd.Stdout, cmd.Stderr = &o, &e
					err := cmd.Run()
					code, out, errOut = 0, o.String(), e.String()
					if ee, ok := err.(*exec.ExitError); ok {
						code = ee.ExitCode()
					} else if err != nil {
						code, errOut = -1, err.Error()
					}
				}
			}
			ok := func() bool {
				run()
				serviceErr := regexp.MustCompile(`Nats-Service-Error-Code: (\d+)`).FindStringSubmatch(errOut)
				switch {
				case code != 0:
					return false
				case wantsErr:
					return serviceErr != nil && serviceErr[1] == wantErr
				case serviceErr != nil:
					return false
				}
				return !wantsOut || strings.TrimSpace(out) == want
			}
			if !meshtest.Poll(20*time.Second, ok) {
				t.Fatalf("docs/rows.md, %s: %s\nexit %d\nstdout: %s\nstderr: %s", b.how, line, code, out, errOut)
			}
		}
	}
	// Both rows of the page are deleted, on both nodes.
	for _, p := range nodes {
		waitRows(t, p, 20*time.Second, 0, "no rows in table jobs", "list", "jobs")
	}
}
