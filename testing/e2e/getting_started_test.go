package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// gsBlock is a shell block of docs/getting-started.md with what its
// <!-- test: ... --> comment says of it: "skip ...", "sql", "rabbitmqctl"
// or "on MACHINE".
type gsBlock struct {
	how   string
	lines []string
}

// gettingStartedBlocks returns the page's shell blocks, each with its test
// comment; a block without one fails the test.
func gettingStartedBlocks(t *testing.T, page string) []gsBlock {
	t.Helper()
	var blocks []gsBlock
	lines := strings.Split(page, "\n")
	how := ""
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if m := regexp.MustCompile(`^<!-- test: (.+) -->$`).FindStringSubmatch(l); m != nil {
			how = m[1]
			continue
		}
		if l != "```sh" {
			continue
		}
		if how == "" {
			t.Fatalf("docs/getting-started.md line %d: a shell block without a <!-- test: ... --> comment", i+1)
		}
		b := gsBlock{how: how}
		for i++; i < len(lines) && lines[i] != "```"; i++ {
			b.lines = append(b.lines, lines[i])
		}
		blocks = append(blocks, b)
		how = ""
	}
	return blocks
}

// gsMachine is one of the page's machines, played by a data directory,
// ports and an env file of its own.
type gsMachine struct {
	name, data, env, home, nats, http string
	exported                          []string
	proc                              *meshtest.Process
}

// TestGettingStarted runs docs/getting-started.md as written, against a
// real PostgreSQL and RabbitMQ: its SQL as the database's superuser, its
// rabbitmqctl lines against the broker, and each machine's commands on a
// node of its own (the page's hub.home.arpa is the test's services; /etc/
// meshbox/meshbox.env, /var/lib/meshbox and ~ are each machine's own; sudo
// is dropped; systemctl starts the node). The page's three nodes make a
// mesh, and a program on cellar answers shed's call as the page says.
func TestGettingStarted(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, RabbitMQ and three nodes")
	}
	t.Parallel()
	bin := meshtest.Binary(t)
	natsBin := natsCLI(t)
	raw, err := os.ReadFile(filepath.Join("..", "..", "docs", "getting-started.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := gettingStartedBlocks(t, string(raw))

	rmq := meshtest.LeaseRabbitMQ(t)
	pg := meshtest.Postgres(t)
	suffix := strings.ToLower(rand.Text()[:8])
	role, dbName, vhost, adminUser := "meshbox_gs_"+suffix, "mesh_gs_"+suffix, "gs-"+suffix, "meshbox-admin-"+suffix
	mgmt := strings.TrimPrefix(rmq.ManagementURL(), "http://")
	services := strings.NewReplacer(
		"meshbox:DB-PASSWORD@hub.home.arpa/mesh", fmt.Sprintf("%s:DB-PASSWORD@127.0.0.1:%d/%s?sslmode=disable", role, pg.Port(), dbName),
		"meshbox-admin:ADMIN-PASSWORD@hub.home.arpa:15672", adminUser+":ADMIN-PASSWORD@"+mgmt,
		"amqp://hub.home.arpa/mesh", fmt.Sprintf("amqp://127.0.0.1:%d/%s", rmq.Port(), vhost),
	)
	machines := map[string]*gsMachine{}
	machine := func(name string) *gsMachine {
		if m := machines[name]; m != nil {
			return m
		}
		m := &gsMachine{name: name, data: t.TempDir(), home: t.TempDir(),
			env:  filepath.Join(t.TempDir(), "meshbox.env"),
			nats: fmt.Sprintf("127.0.0.1:%d", meshtest.FreePort(t)),
			http: fmt.Sprintf("127.0.0.1:%d", meshtest.FreePort(t))}
		machines[name] = m
		return m
	}
	t.Cleanup(func() {
		// Node roles are the server's; the broker's users and vhost too.
		env := []string{"MESHBOX_DB=" + services.Replace("postgres://meshbox:DB-PASSWORD@hub.home.arpa/mesh"),
			"MESHBOX_BROKER_ADMIN=" + services.Replace("http://meshbox-admin:ADMIN-PASSWORD@hub.home.arpa:15672")}
		for _, m := range machines {
			if m.proc != nil {
				m.proc.Signal(syscall.SIGTERM)
				m.proc.Wait()
			}
		}
		for _, n := range []string{"attic", "cellar", "shed"} {
			_, _, _ = cliEnv(t, env, "mesh", "node", "remove", n, "--force")
		}
		if err := pgExecQuiet(pg, "DROP DATABASE IF EXISTS "+dbName+" WITH (FORCE)"); err == nil {
			_ = pgExecQuiet(pg, "DROP ROLE IF EXISTS "+role)
		}
		_, _ = rmqCtlQuiet(rmq, "delete_vhost", vhost)
		_, _ = rmqCtlQuiet(rmq, "delete_user", adminUser)
	})

	tokens := map[string]string{} // node -> its newest join token
	for _, b := range blocks {
		switch {
		case strings.HasPrefix(b.how, "skip"):
			continue
		case b.how == "sql":
			body := strings.Join(b.lines, "\n")
			body, _, _ = strings.Cut(body[strings.Index(body, "\n")+1:], "\nSQL")
			body = regexp.MustCompile(`\bmeshbox\b`).ReplaceAllString(body, role)
			body = regexp.MustCompile(`\bmesh\b`).ReplaceAllString(body, dbName)
			for _, stmt := range strings.Split(body, ";") {
				if stmt = strings.TrimSpace(stmt); stmt != "" {
					pg.Exec(t, stmt)
				}
			}
		case b.how == "rabbitmqctl":
			for _, l := range b.lines {
				args := shellWords(t, strings.TrimPrefix(l, "sudo "))
				switch args[0] {
				case "rabbitmq-plugins": // the test's broker runs with the management plugin
					continue
				case "rabbitmqctl":
					for i := range args {
						args[i] = strings.ReplaceAll(args[i], "meshbox-admin", adminUser)
					}
					rmq.Ctl(t, args[1:]...)
				default:
					t.Fatalf("docs/getting-started.md: %q in a rabbitmqctl block", l)
				}
			}
		case strings.HasPrefix(b.how, "on "):
			m := machine(strings.TrimPrefix(b.how, "on "))
			for _, l := range b.lines {
				gsRun(t, bin, natsBin, m, services, tokens, l)
			}
		default:
			t.Fatalf("docs/getting-started.md: unknown test comment %q", b.how)
		}
	}
	for _, n := range []string{"attic", "cellar", "shed"} {
		if m := machines[n]; m == nil || m.proc == nil {
			t.Errorf("the page never started node %s", n)
		}
	}
}

// gsRun runs one line of a machine's block.
func gsRun(t *testing.T, bin, natsBin string, m *gsMachine, services *strings.Replacer, tokens map[string]string, line string) {
	t.Helper()
	cmdLine, comment, _ := strings.Cut(line, "#")
	cmdLine = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(cmdLine), "sudo "))
	want, wants := strings.CutPrefix(strings.TrimSpace(comment), "prints: ")
	cmdLine = strings.ReplaceAll(services.Replace(cmdLine), "/var/lib/meshbox", m.data)
	if cmdLine == "" {
		return
	}
	env := append(append([]string{}, m.exported...), "MESHBOX_DATA="+m.data, "MESHBOX_NATS="+m.nats,
		"MESHBOX_SERVER=", "HOME="+m.home, "NATS_URL=nats://"+m.nats,
		"PATH="+filepath.Dir(natsBin)+string(os.PathListSeparator)+os.Getenv("PATH"))
	switch {
	case strings.HasPrefix(cmdLine, "export "):
		k, v, _ := strings.Cut(strings.TrimPrefix(cmdLine, "export "), "=")
		m.exported = append(m.exported, k+"="+strings.Trim(v, "'"))
	case cmdLine == "meshbox join TOKEN":
		tok := tokens[m.name]
		if tok == "" {
			t.Fatalf("%s: meshbox join TOKEN, but no join token was printed for %s", m.name, m.name)
		}
		if code, out, errOut := cliEnv(t, nil, "join", tok, "--env-file", m.env); code != 0 {
			t.Fatalf("%s: meshbox join: exit %d: %s%s", m.name, code, out, errOut)
		}
		f, err := os.OpenFile(m.env, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		// What makes this machine's node its own: its directory and ports.
		fmt.Fprintf(f, "MESHBOX_DATA=%s\nMESHBOX_NATS=%s\nMESHBOX_HTTP=%s\n", m.data, m.nats, m.http)
		f.Close()
	case cmdLine == "systemctl enable --now meshbox":
		m.proc = meshtest.StartProcess(t, "--env-file", m.env, "--data", m.data, "--nats", m.nats, "--http", m.http)
		meshtest.WaitStatus(t, m.proc.HTTPURL(), 30*time.Second, m.name+" connected to the broker",
			func(s appliance.Status) bool { return s.Broker.State == "connected" })
	case strings.HasPrefix(cmdLine, "meshbox "):
		args := shellWords(t, cmdLine)[1:]
		var code int
		var out, errOut string
		meshtest.Poll(30*time.Second, func() bool {
			code, out, errOut = cliEnv(t, env, args...)
			return !wants || strings.TrimSpace(out) == want
		})
		if code != 0 {
			t.Fatalf("%s: %s: exit %d:\n%s%s", m.name, line, code, out, errOut)
		}
		if wants && strings.TrimSpace(out) != want {
			t.Fatalf("%s: %s: printed %q, want %q", m.name, line, strings.TrimSpace(out), want)
		}
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "meshbox-join-v1.") {
				tokens[tokenNode(t, args)] = l
			}
		}
	default: // a shell line: install, nats, ...
		cmd := exec.Command("bash", "-c", cmdLine)
		cmd.Env = append(os.Environ(), env...)
		cmd.Env = append(cmd.Env, "USER="+currentUser())
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		// A file, not a pipe: a program the line leaves running in the
		// background (&) keeps its output open.
		logPath := filepath.Join(t.TempDir(), "out")
		out, err := os.Create(logPath)
		if err != nil {
			t.Fatal(err)
		}
		defer out.Close()
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) })
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				got, _ := os.ReadFile(logPath)
				t.Fatalf("%s: %s: %v\n%s", m.name, line, err, got)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: %s: still running after 30s", m.name, line)
		}
		if strings.HasSuffix(cmdLine, "&") {
			time.Sleep(300 * time.Millisecond) // real time: room for a background command's early error, whose absence cannot be signalled
			if got, _ := os.ReadFile(logPath); bytes.Contains(got, []byte("nats: error")) {
				t.Fatalf("%s: %s: %s", m.name, line, got)
			}
		}
	}
}

// tokenNode is the node a command that printed a join token made it for:
// init --node NAME, mesh node add NAME.
func tokenNode(t *testing.T, args []string) string {
	t.Helper()
	for i, a := range args {
		if a == "--node" && i+1 < len(args) {
			return args[i+1]
		}
		if a == "add" && i+1 < len(args) {
			return args[i+1]
		}
	}
	t.Fatalf("meshbox %s printed a join token for no node this test knows", strings.Join(args, " "))
	return ""
}

// shellWords splits a command line as sh would for the page's simple
// lines: words, and single- or double-quoted strings.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	cmd := exec.Command("bash", "-c", "set -f; eval \"set -- $1\"; for a in \"$@\"; do printf '%s\\0' \"$a\"; done", "bash", line)
	words, err := cmd.Output()
	if err != nil {
		t.Fatalf("split %q: %v", line, err)
	}
	return strings.Split(strings.TrimSuffix(string(words), "\x00"), "\x00")
}

func currentUser() string {
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	out, err := exec.Command("id", "-un").Output()
	if err != nil {
		return "root"
	}
	return strings.TrimSpace(string(out))
}

// pgExecQuiet runs sql as the superuser, for a cleanup that must not fail
// the test.
func pgExecQuiet(pg *meshtest.PG, sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return pg.ExecContext(ctx, sql)
}

// rmqCtlQuiet runs rabbitmqctl for a cleanup that must not fail the test.
func rmqCtlQuiet(r *meshtest.Rabbit, args ...string) (string, error) { return r.CtlOutput(args...) }
