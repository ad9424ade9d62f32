package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/testing/ledger"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// TestRecoverEveryNodeLost runs the procedure of docs/recovery.md, its
// commands as the page writes them: a mesh
// of two nodes with a recovery kit writes a table and a table of scope
// vault, rotates the mesh's and the scope's keys (the nodes seal the new
// ones for the kit) and writes again, dead-letters a command, and leaves commands waiting in the
// broker for a stage no node runs; then both nodes stop and their data
// directories and configuration files are deleted. A new node, added
// with the kit (and into the scope), reads every row of both tables,
// lists and opens the dead letter, and handles the waiting commands once
// its program hosts their stage. Control: without the kit, a node added
// the same way reads nothing. Last, the lost nodes are removed, and that
// node, given the keys by the new one, reads both tables whole.
func TestRecoverEveryNodeLost(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, RabbitMQ and three nodes")
	}
	t.Parallel()
	m := newIdentityMesh(t, "alpha", "beta")
	t.Cleanup(func() {
		for _, n := range []string{"phoenix", "ash"} {
			_, _, _ = cliEnv(t, m.admin, "mesh", "node", "remove", n, "--force")
		}
	})
	kitFile := filepath.Join(t.TempDir(), "mesh.kit")
	if code, out, errOut := cliEnv(t, m.admin, "mesh", "kit", "--out", kitFile); code != 0 {
		t.Fatalf("mesh kit --out: exit %d: %s%s", code, out, errOut)
	}
	admin := func(args ...string) string {
		t.Helper()
		code, out, errOut := cliEnv(t, m.admin, args...)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s%s", strings.Join(args, " "), code, out, errOut)
		}
		return out
	}
	admin("mesh", "scope", "add", "vault", "--nodes", "alpha,beta")
	admin("mesh", "table", "add", "jobs")
	admin("mesh", "table", "add", "secrets", "--scope", "vault")

	alpha, beta := m.start(t, "alpha"), m.start(t, "beta")
	// beta's program fails order-1 for good (a dead letter, below). It
	// also hosts stage later, whose queue then exists on the broker.
	bprog := natsConn(t, beta)
	stageCalls(t, bprog, "orders", func(m *nats.Msg) *nats.Msg {
		r := nats.NewMsg("")
		r.Header.Set("Nats-Service-Error-Code", "422")
		r.Header.Set("Nats-Service-Error", "no such customer")
		return r
	})
	stageCalls(t, bprog, "later", func(m *nats.Msg) *nats.Msg { return nats.NewMsg("") })
	for _, p := range []*meshtest.Process{alpha, beta} {
		waitKeysInStep(t, p)
		meshtest.WaitFor(t, 30*time.Second, p.Node()+" sealing with a key of scope vault", func() bool {
			_, scopes := nodeScopes(t, p)
			return scopes["vault"] != ""
		})
	}
	jobs := map[string]string{"1": "queued", "2": "done"}
	secrets := map[string]string{"a": "s3cret", "b": "hidden"}
	for id, v := range jobs {
		waitRows(t, alpha, 20*time.Second, 0, "", "put", "jobs", id, "status="+v)
	}
	for id, v := range secrets {
		waitRows(t, beta, 20*time.Second, 0, "", "put", "secrets", id, "value="+v)
	}
	for id, v := range jobs {
		waitRows(t, beta, 20*time.Second, 0, v, "get", "jobs", id, "--field", "status")
	}
	for id, v := range secrets {
		waitRows(t, alpha, 20*time.Second, 0, v, "get", "secrets", id, "--field", "value")
	}

	// Both keys rotate: the nodes seal the new ones for the kit too, and
	// the rows written now are sealed with them.
	ctx := context.Background()
	db, err := meshdb.Open(ctx, m.db, meshdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	newKey := regexp.MustCompile(`content key (\S+) added`)
	var rotated []string
	for _, args := range [][]string{{"mesh", "key", "rotate", "--retention", "1h"}, {"mesh", "scope", "rotate", "vault", "--retention", "1h"}} {
		sub := newKey.FindStringSubmatch(admin(args...))
		if sub == nil {
			t.Fatalf("%s: no new key named", strings.Join(args, " "))
		}
		rotated = append(rotated, sub[1])
	}
	for _, p := range []*meshtest.Process{alpha, beta} {
		meshtest.WaitFor(t, 30*time.Second, p.Node()+" sealing with the rotated keys", func() bool {
			st := meshtest.Status(t, p.HTTPURL())
			return st.Keys != nil && st.Keys.Current == rotated[0] && st.Keys.Scopes["vault"] == rotated[1]
		})
	}
	meshtest.WaitFor(t, 30*time.Second, "the rotated keys sealed for the kit", func() bool {
		_, copies, err := db.RecoveryKit(ctx, "")
		return err == nil && copies[rotated[0]] != "" && copies[rotated[1]] != ""
	})
	jobs["3"], secrets["c"] = "rotated", "after-rotation"
	waitRows(t, alpha, 20*time.Second, 0, "", "put", "jobs", "3", "status=rotated")
	waitRows(t, alpha, 20*time.Second, 0, "", "put", "secrets", "c", "value=after-rotation")
	waitRows(t, beta, 20*time.Second, 0, "after-rotation", "get", "secrets", "c", "--field", "value")

	waitConsumers(t, m.rmq, m.vhost, "cmd.orders", 1)
	waitConsumers(t, m.rmq, m.vhost, "cmd.later", 1)
	aprog := natsConn(t, alpha)
	order := &nats.Msg{Subject: "cmd.orders", Data: []byte("order"), Header: nats.Header{hdrMsgID: {"order-1"}, "X-Customer": {"42"}}}
	if o, resp, err := ledger.SubmitMsg(aprog, order, 10*time.Second); o != ledger.Acked {
		t.Fatalf("submit order-1: %v %v %v", o, resp, err)
	}
	meshtest.WaitFor(t, 20*time.Second, "order-1 dead-lettered", func() bool {
		return meshtest.Status(t, beta.HTTPURL()).DeadLetters["orders"] == 1
	})
	beta.Signal(syscall.SIGTERM)
	beta.Wait()
	// Nobody runs stage later now: alpha's commands wait in its queue.
	waiting := []string{"later-1", "later-2", "later-3"}
	for _, id := range waiting {
		msg := &nats.Msg{Subject: "cmd.later", Data: []byte("body of " + id), Header: nats.Header{hdrMsgID: {id}}}
		o, resp, err := ledger.SubmitMsg(aprog, msg, 10*time.Second)
		if o != ledger.Acked || resp.Header.Get("Meshbox-Accepted") != "broker" {
			t.Fatalf("submit %s: %v %v %v, want accepted by the broker", id, o, resp, err)
		}
	}
	ch := meshtest.Channel(t, m.vhost)
	if q, err := ch.QueueDeclarePassive("cmd.later", true, false, false, false, nil); err != nil || q.Messages != len(waiting) {
		t.Fatalf("queue cmd.later: %+v %v, want %d commands waiting", q, err, len(waiting))
	}
	alpha.Signal(syscall.SIGTERM)
	alpha.Wait()

	// Every node is lost: data directories and configuration files.
	for _, n := range []string{"alpha", "beta"} {
		for _, p := range []string{m.data[n], m.envs[n]} {
			if err := os.RemoveAll(p); err != nil {
				t.Fatal(err)
			}
		}
	}

	// Control: a node added without the kit, alone, reads nothing.
	ash := m.addWithKit(t, "ash", "", "--scopes", "vault")
	meshtest.WaitFor(t, 30*time.Second, "ash in step and lacking the mesh's key", func() bool {
		st := meshtest.Status(t, ash.HTTPURL())
		return st.Keys != nil && st.Keys.InStep && len(st.Keys.Lacking) > 0 && st.Keys.Current == ""
	})
	if code, out, _ := rowsCLI(t, ash, "get", "jobs", "1", "--field", "status"); code == 0 {
		t.Errorf("ash, added without the kit, read row 1 of jobs: %q", out)
	}
	ash.Signal(syscall.SIGTERM)
	ash.Wait()

	// The recovery, as docs/recovery.md says: a new node added with the
	// kit, into the scope.
	phoenix := m.runRecoveryPage(t, kitFile)
	for id, v := range jobs {
		waitRows(t, phoenix, 30*time.Second, 0, v, "get", "jobs", id, "--field", "status")
	}
	for id, v := range secrets {
		waitRows(t, phoenix, 30*time.Second, 0, v, "get", "secrets", id, "--field", "value")
	}
	for table, rows := range map[string]map[string]string{"jobs": jobs, "secrets": secrets} {
		out := waitRows(t, phoenix, 10*time.Second, 0, "", "list", table)
		for id := range rows {
			if !strings.Contains(out, id) {
				t.Errorf("rows list %s on phoenix: no row %s in\n%s", table, id, out)
			}
		}
	}

	// Its status says that it reads both logs to their end, refusing
	// nothing.
	var status string
	if !meshtest.Poll(30*time.Second, func() bool {
		_, status, _ = cliEnv(t, onNode(phoenix), "status")
		return strings.Contains(status, "jobs: 3 rows") && strings.Contains(status, "secrets: 3 rows") &&
			strings.Count(status, "reading its log (0 behind)") >= 2 && !strings.Contains(status, "ALARM")
	}) {
		t.Errorf("meshbox status on phoenix: want jobs and secrets with 3 rows each, read to the end, no alarm:\n%s", status)
	}

	onPhoenix := onNode(phoenix)
	code, out, errOut := cliEnv(t, onPhoenix, "dlq", "list", "orders", "--json")
	var list struct {
		Letters []struct {
			ID, Reason, Origin string
			Opened             bool
		}
	}
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list.Letters) != 1 {
		t.Fatalf("dlq list orders on phoenix: exit %d\n%s\n%s", code, out, errOut)
	}
	if l := list.Letters[0]; l.ID != "order-1" || !l.Opened || l.Origin != "alpha" || !strings.Contains(l.Reason, "422 no such customer") {
		t.Errorf("dlq list orders on phoenix: got %+v, want order-1 from alpha, opened, with its reason", l)
	}
	code, out, errOut = cliEnv(t, onPhoenix, "dlq", "show", "orders", "order-1")
	if code != 0 || !strings.Contains(out, "X-Customer: 42") || !strings.Contains(out, "permanent failure") {
		t.Errorf("dlq show orders order-1 on phoenix: exit %d\n%s\n%s", code, out, errOut)
	}

	var mu sync.Mutex
	var handled []string
	pprog := natsConn(t, phoenix)
	stageCalls(t, pprog, "later", func(m *nats.Msg) *nats.Msg {
		mu.Lock()
		handled = append(handled, m.Header.Get(hdrMsgID)+"="+string(m.Data))
		mu.Unlock()
		return nats.NewMsg("")
	})
	meshtest.WaitFor(t, 30*time.Second, "the waiting commands handled on phoenix", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled) >= len(waiting)
	})
	mu.Lock()
	slices.Sort(handled)
	want := []string{"later-1=body of later-1", "later-2=body of later-2", "later-3=body of later-3"}
	if !slices.Equal(handled, want) {
		t.Errorf("commands handled on phoenix: %q, want %q", handled, want)
	}
	mu.Unlock()

	// Last, the lost nodes are removed. What they wrote stays: ash, for
	// which phoenix now seals the keys, reads both tables whole.
	for _, n := range []string{"alpha", "beta"} {
		admin("mesh", "node", "remove", n)
	}
	ash = m.start(t, "ash")
	for id, v := range jobs {
		waitRows(t, ash, 30*time.Second, 0, v, "get", "jobs", id, "--field", "status")
	}
	for id, v := range secrets {
		waitRows(t, ash, 30*time.Second, 0, v, "get", "secrets", id, "--field", "value")
	}
	if _, status, _ := cliEnv(t, onNode(ash), "status"); strings.Contains(status, "ALARM") {
		t.Errorf("meshbox status on ash, after the lost nodes' removal: want no alarm:\n%s", status)
	}
}

// addWithKit adds node with `mesh node add NAME --stages * --kit kitFile`
// ("": without a kit) and extra flags, joins it into a new data
// directory and starts it.
func (m *identityMesh) addWithKit(t *testing.T, node, kitFile string, extra ...string) *meshtest.Process {
	t.Helper()
	args := append([]string{"mesh", "node", "add", node, "--stages", "*"}, extra...)
	if kitFile != "" {
		args = append(args, "--kit", kitFile)
	}
	code, out, errOut := cliEnv(t, m.admin, args...)
	if code != 0 {
		t.Fatalf("%s: exit %d: %s%s", strings.Join(args, " "), code, out, errOut)
	}
	m.envs[node] = filepath.Join(t.TempDir(), node+".env")
	m.data[node] = filepath.Join(t.TempDir(), "data")
	rememberDataDir(m.db, node, m.data[node])
	if code, out, errOut := cli(t, "join", joinToken(t, out), "--env-file", m.envs[node], "--data", m.data[node]); code != 0 {
		t.Fatalf("join %s: exit %d: %s%s", node, code, out, errOut)
	}
	return m.start(t, node)
}

// runRecoveryPage runs the commands of docs/recovery.md: the admin's
// against the mesh database and the broker's administrator (the kit is
// kitFile), the new node's join and start, and its checks, each of which
// must succeed within 30 s. It returns the new node, phoenix.
func (m *identityMesh) runRecoveryPage(t *testing.T, kitFile string) *meshtest.Process {
	t.Helper()
	var p *meshtest.Process
	token := ""
	for _, b := range pageBlocks(t, "recovery.md") {
		for _, line := range b.lines {
			cmdLine, _, _ := strings.Cut(line, "#")
			cmdLine = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(cmdLine), "sudo "))
			if cmdLine == "" {
				continue
			}
			args := shellWords(t, cmdLine)
			switch {
			case b.how == "admin":
				for i, a := range args {
					if a == "mesh.kit" {
						args[i] = kitFile
					}
				}
				code, out, errOut := cliEnv(t, m.admin, args[1:]...)
				if code != 0 {
					t.Fatalf("docs/recovery.md: %s: exit %d: %s%s", line, code, out, errOut)
				}
				if strings.Contains(cmdLine, "node add") {
					token = joinToken(t, out)
				}
			case b.how != "on phoenix":
				t.Fatalf("docs/recovery.md: unknown test comment %q", b.how)
			case cmdLine == "meshbox join TOKEN":
				m.envs["phoenix"] = filepath.Join(t.TempDir(), "phoenix.env")
				m.data["phoenix"] = filepath.Join(t.TempDir(), "data")
				rememberDataDir(m.db, "phoenix", m.data["phoenix"])
				if code, out, errOut := cli(t, "join", token, "--env-file", m.envs["phoenix"], "--data", m.data["phoenix"]); code != 0 {
					t.Fatalf("docs/recovery.md: join phoenix: exit %d: %s%s", code, out, errOut)
				}
			case cmdLine == "systemctl enable --now meshbox":
				p = m.start(t, "phoenix")
			case p == nil || args[0] != "meshbox":
				t.Fatalf("docs/recovery.md: %q before the node runs, or not a meshbox command", line)
			default:
				var code int
				var out, errOut string
				if !meshtest.Poll(30*time.Second, func() bool {
					code, out, errOut = cliEnv(t, onNode(p), args[1:]...)
					return code == 0
				}) {
					t.Fatalf("docs/recovery.md: %s on phoenix: exit %d: %s%s\n%s", line, code, out, errOut, p.Output())
				}
			}
		}
	}
	if p == nil {
		t.Fatal("docs/recovery.md started no node")
	}
	return p
}
