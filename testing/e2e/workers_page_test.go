package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshbox/meshbox/testing/meshtest"
)

// TestWorkersPage runs the walk of docs/workers.md, "Your first worker",
// as written, on a mesh of the page's two nodes, attic and cellar, each
// with a broker user of its own that consumes only the stages the mesh
// grants it. The admin's lines run with the mesh database and the
// broker's administrator, each node's in a shell of its own (pageShell).
// Every line must succeed; one that says "# prints: X" must print X, one
// that says "# shows: X" a line with X in it (within 20 s: commands
// cross the broker); a line ending in & must leave a handler listening.
// The handlers then must have got what the page says they get.
func TestWorkersPage(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, RabbitMQ and two nodes")
	}
	natsBin := natsCLI(t)
	blocks := pageBlocks(t, "workers.md")

	// The page's mesh: attic made by init, cellar by node add, neither
	// granted a stage.
	rmq := meshtest.LeaseRabbitMQ(t)
	m := &identityMesh{rmq: rmq, vhost: rmq.Vhost(t), db: meshtest.Postgres(t).Database(t), envs: map[string]string{}, data: map[string]string{}}
	m.admin = []string{"MESHBOX_DB=" + m.db, "MESHBOX_BROKER_ADMIN=" + rmq.AdminURL()}
	t.Cleanup(func() { // node roles and broker users outlive the test's database and vhost
		for _, n := range []string{"attic", "cellar"} {
			_, _, _ = cliEnv(t, m.admin, "mesh", "node", "remove", n, "--force")
		}
	})
	for _, n := range []string{"attic", "cellar"} {
		args := []string{"mesh", "node", "add", n}
		if n == "attic" {
			args = []string{"init", "--node", n, "--broker", meshtest.NoCredential(m.vhost)}
		}
		code, out, errOut := cliEnv(t, m.admin, args...)
		if code != 0 {
			t.Fatalf("meshbox %s: exit %d: %s%s", strings.Join(args, " "), code, out, errOut)
		}
		m.envs[n] = filepath.Join(t.TempDir(), n+".env")
		m.data[n] = filepath.Join(t.TempDir(), "data")
		rememberDataDir(m.db, n, m.data[n])
		if code, out, errOut := cli(t, "join", joinToken(t, out), "--env-file", m.envs[n]); code != 0 {
			t.Fatalf("join %s: exit %d: %s%s", n, code, out, errOut)
		}
	}
	nodes := map[string]*meshtest.Process{"attic": m.start(t, "attic"), "cellar": m.start(t, "cellar")}
	for _, p := range nodes {
		waitKeysInStep(t, p)
	}

	path := "PATH=" + filepath.Dir(natsBin) + string(os.PathListSeparator) + filepath.Dir(meshtest.Binary(t)) + string(os.PathListSeparator) + os.Getenv("PATH")
	shells := map[string]*pageShell{"admin": startPageShell(t, "admin", append([]string{path, "MESHBOX_SERVER="}, m.admin...))}
	for n, p := range nodes {
		shells[n] = startPageShell(t, n, append(onNode(p), path, "HOME="+t.TempDir(), "USER="+currentUser(),
			"NATS_URL="+p.NATSURL(), "MESHBOX_DB=", "MESHBOX_BROKER="))
	}
	// What each handler the page starts on cellar prints, in its order: the
	// first made cat.jpg's thumbnail, the second refused notes.txt, the
	// third got it replayed. A reader stops a handler once it printed its
	// command (the page says what it prints): so does the walk, before a
	// kill of it.
	handled := [][]string{
		{"Meshbox-Msg-Id: cat-1", "cat.jpg"},
		{"Meshbox-Msg-Id: notes-1", "notes.txt"},
		{"Meshbox-Msg-Id: notes-1", "Meshbox-Replayed: ", "notes.txt"},
	}
	waitHandler := func(i int) {
		t.Helper()
		jobs := shells["cellar"].jobs
		if i >= len(jobs) || i >= len(handled) {
			t.Fatalf("the page starts %d handlers on cellar; handler %d has no expectation", len(jobs), i+1)
		}
		for _, w := range handled[i] {
			meshtest.WaitFor(t, 20*time.Second, fmt.Sprintf("handler %d printing %q", i+1, w), func() bool {
				return strings.Contains(jobs[i].output(), w)
			})
		}
	}
	for _, b := range blocks {
		var sh *pageShell
		switch {
		case strings.HasPrefix(b.how, "skip"):
			continue
		case b.how == "admin":
			sh = shells["admin"]
		case strings.HasPrefix(b.how, "on ") && nodes[strings.TrimPrefix(b.how, "on ")] != nil:
			sh = shells[strings.TrimPrefix(b.how, "on ")]
		default:
			t.Fatalf("docs/workers.md: unknown test comment %q", b.how)
		}
		for _, line := range b.lines {
			cmdLine, comment, _ := strings.Cut(line, "#")
			cmdLine = strings.TrimSpace(cmdLine)
			if cmdLine == "" {
				continue
			}
			if p := nodes[sh.name]; p != nil {
				cmdLine = strings.ReplaceAll(cmdLine, "/var/lib/meshbox", p.DataDir())
			}
			comment = strings.TrimSpace(comment)
			if cmdLine == "kill $!" && sh.name == "cellar" && len(sh.jobs) > 0 {
				waitHandler(len(sh.jobs) - 1)
			}
			if strings.HasSuffix(cmdLine, "&") {
				sh.background(t, cmdLine)
				continue
			}
			prints, exact := strings.CutPrefix(comment, "prints: ")
			shows, contains := strings.CutPrefix(comment, "shows: ")
			var r lineRun
			if !meshtest.Poll(20*time.Second, func() bool {
				r = sh.run(t, cmdLine)
				switch {
				case r.code != 0:
					return false
				case exact:
					return strings.TrimSpace(r.out) == prints
				case contains:
					return strings.Contains(r.out, shows)
				}
				return true
			}) {
				t.Fatalf("docs/workers.md, %s: %s\nexit %d\nstdout: %s\nstderr: %s\n%s's log:\n%s", b.how, line, r.code, r.out, r.errOut,
					sh.name, nodeLog(nodes[sh.name]))
			}
		}
	}

	// The handlers on cellar, in the page's order.
	handlers := shells["cellar"].jobs
	if len(handlers) != 3 {
		t.Fatalf("the page starts %d handlers on cellar, want 3", len(handlers))
	}
	for i := range handlers {
		waitHandler(i)
	}
}

func nodeLog(p *meshtest.Process) string {
	if p == nil {
		return "(not a node)"
	}
	return p.Output()
}

// pageShell is a bash of one of a page's machines that runs the page's
// lines one after another, as a terminal does: a directory, a variable
// or a background job (kill $!) lasts from one line to the next. sudo
// runs its command as is. It is killed, with its jobs, when the test
// ends.
type pageShell struct {
	name string
	cmd  *exec.Cmd
	in   *os.File
	dir  string    // the output of each line: N.out, N.err, N.rc
	n    int       // lines run
	jobs []lineRun // the lines that left a job running, in order
}

// lineRun is one line run by a pageShell: its exit code and output, or,
// for a line that left a job running, where the job writes.
type lineRun struct {
	code        int
	out, errOut string
	base        string
}

// output returns what a job wrote so far.
func (r lineRun) output() string {
	out, _ := os.ReadFile(r.base + ".out")
	errOut, _ := os.ReadFile(r.base + ".err")
	return string(out) + string(errOut)
}

// startPageShell starts the shell of machine name with env added to the
// test's environment; its lines run in its HOME when env sets one.
func startPageShell(t *testing.T, name string, env []string) *pageShell {
	t.Helper()
	s := &pageShell{name: name, dir: t.TempDir()}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	s.in = w
	s.cmd = exec.Command("bash", "--noprofile", "--norc")
	s.cmd.Env = append(os.Environ(), env...)
	for _, e := range env {
		if home, ok := strings.CutPrefix(e, "HOME="); ok {
			s.cmd.Dir = home
		}
	}
	s.cmd.Stdin = r
	log, err := os.Create(filepath.Join(s.dir, "shell.log")) // the shell's own complaints
	if err != nil {
		t.Fatal(err)
	}
	s.cmd.Stdout, s.cmd.Stderr = log, log
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	log.Close()
	t.Cleanup(func() {
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
		w.Close()
		_ = s.cmd.Wait()
	})
	s.send(t, `sudo() { "$@"; }`)
	return s
}

func (s *pageShell) send(t *testing.T, script string) {
	t.Helper()
	if _, err := s.in.WriteString(script + "\n"); err != nil {
		t.Fatalf("%s's shell: %v", s.name, err)
	}
}

// start has the shell run line with its output in files of its own, and
// returns where.
func (s *pageShell) start(t *testing.T, line string) string {
	t.Helper()
	s.n++
	base := filepath.Join(s.dir, strconv.Itoa(s.n))
	s.send(t, fmt.Sprintf("{ %s\n} >%s.out 2>%s.err </dev/null; echo $? >%s.tmp; mv %[4]s.tmp %[4]s.rc", line, base, base, base))
	return base
}

// run runs line and waits for it to end.
func (s *pageShell) run(t *testing.T, line string) lineRun {
	t.Helper()
	base := s.start(t, line)
	var rc []byte
	if !meshtest.Poll(70*time.Second, func() bool {
		var err error
		rc, err = os.ReadFile(base + ".rc")
		return err == nil
	}) {
		shell, _ := os.ReadFile(filepath.Join(s.dir, "shell.log"))
		t.Fatalf("%s: %s: still running after 70s\n%s", s.name, line, shell)
	}
	r := lineRun{base: base}
	r.code, _ = strconv.Atoi(strings.TrimSpace(string(rc)))
	out, _ := os.ReadFile(base + ".out")
	errOut, _ := os.ReadFile(base + ".err")
	r.out, r.errOut = string(out), string(errOut)
	return r
}

// background runs line, which leaves a job running (it ends in &), and
// waits until the job, a nats CLI handler, listens.
func (s *pageShell) background(t *testing.T, line string) {
	t.Helper()
	r := s.run(t, line)
	if r.code != 0 {
		t.Fatalf("%s: %s: exit %d: %s%s", s.name, line, r.code, r.out, r.errOut)
	}
	meshtest.WaitFor(t, 10*time.Second, s.name+": "+line+" listening", func() bool {
		out := r.output()
		if strings.Contains(out, "error") {
			t.Fatalf("%s: %s:\n%s", s.name, line, out)
		}
		return strings.Contains(out, "Listening on ")
	})
	s.jobs = append(s.jobs, r)
}
