package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/modules"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// readmeHeredoc returns the body of the here-document the README opens
// with the line start and closes with a line end.
func readmeHeredoc(t *testing.T, readme, start, end string) string {
	t.Helper()
	_, rest, ok := strings.Cut(readme, "\n"+start+"\n")
	if !ok {
		t.Fatalf("docs/modules.md: no line %q", start)
	}
	body, _, ok := strings.Cut(rest, "\n"+end+"\n")
	if !ok {
		t.Fatalf("docs/modules.md: the here-document after %q does not end with %q", start, end)
	}
	return body + "\n"
}

// readmeCommand returns the arguments after "meshbox" of the README's
// command line that starts with prefix (its comment cut off).
func readmeCommand(t *testing.T, readme, prefix string) []string {
	t.Helper()
	for line := range strings.SplitSeq(readme, "\n") {
		if strings.HasPrefix(line, prefix) {
			cmd, _, _ := strings.Cut(line, "#")
			return strings.Fields(cmd)[1:]
		}
	}
	t.Fatalf("docs/modules.md: no command line starting %q", prefix)
	return nil
}

// TestREADMEModule runs the manual's small module (docs/modules.md) as it is written
// (its manifest, its script with the nats CLI, its commands): assigned
// with --autostart, the node starts it; `meshbox modules` lists it
// running; another node calls its capability with `meshbox call`; the
// manual's override changes the answer.
func TestREADMEModule(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, RabbitMQ and two nodes")
	}
	t.Parallel()
	meshtest.Binary(t)
	natsBin := natsCLI(t)
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "modules.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(data)
	const catalogDir = "/etc/meshbox/modules/greeter/"
	manifest := readmeHeredoc(t, readme, "cat > "+catalogDir+"manifest.json <<'JSON'", "JSON")
	script := readmeHeredoc(t, readme, "cat > "+catalogDir+"greet.sh <<'SH'", "SH")
	assign := readmeCommand(t, readme, "meshbox mesh assign attic greeter ")
	override := readmeCommand(t, readme, "meshbox mesh override set attic greeter ")

	rmq := meshtest.RabbitMQ(t)
	vhost := rmq.Vhost(t)
	db := meshtest.Postgres(t).Database(t)
	if code, _, errOut := cli(t, "init", "--db", db, "--node", "attic", "--broker", meshtest.NoCredential(vhost)); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	mesh(t, db, "node", "add", "cellar", "--record-only")
	cat := t.TempDir()
	dir := filepath.Join(cat, "greeter")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "greet.sh"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}

	// The module finds nats in the node's PATH, as on a server where it is
	// installed.
	path := []string{"PATH=" + filepath.Dir(natsBin) + string(os.PathListSeparator) + os.Getenv("PATH")}
	attic := meshtest.StartProcessEnv(t, path, "--node", "attic", "--db", db, "--broker", vhost, "--modules-dir", cat)
	cellar := meshtest.StartProcess(t, "--node", "cellar", "--db", db, "--broker", vhost)
	for _, p := range []*meshtest.Process{attic, cellar} {
		meshtest.WaitStatus(t, p.HTTPURL(), 30*time.Second, p.Node()+" connected to the broker", func(s appliance.Status) bool { return s.Broker.State == "connected" })
	}

	mesh(t, db, assign[1:]...)
	first := waitModule(t, attic.HTTPURL(), "greeter", 10*time.Second, "greeter running", moduleRunning)
	code, table, errOut := cliEnv(t, []string{"MESHBOX_SERVER=" + attic.NATSURL(), "MESHBOX_DATA=" + attic.DataDir()}, "modules")
	if code != 0 {
		t.Fatalf("meshbox modules: exit %d: %s", code, errOut)
	}
	if f := strings.Fields(strings.Split(table, "\n")[1]); len(f) < 3 || f[0] != "greeter" || f[1] != "stable" || f[2] != "running" {
		t.Errorf("meshbox modules: got\n%s\nwant greeter  stable  running", table)
	}

	onCellar := []string{"MESHBOX_SERVER=" + cellar.NATSURL(), "MESHBOX_DATA=" + cellar.DataDir()}
	callGreet := func(want string) {
		t.Helper()
		var got string
		if !meshtest.Poll(15*time.Second, func() bool {
			code, out, errOut := cliEnv(t, onCellar, "call", "greet")
			got = strings.TrimSpace(out + errOut)
			return code == 0 && strings.TrimSpace(out) == want
		}) {
			t.Fatalf("meshbox call greet on cellar: got %q, want %q; attic's log:\n%s", got, want, attic.Output())
		}
	}
	callGreet("hello from attic")

	mesh(t, db, override[1:]...)
	waitModule(t, attic.HTTPURL(), "greeter", 10*time.Second, "greeter restarted by the override", func(m modules.Status) bool {
		return moduleRunning(m) && m.Pid != first.Pid
	})
	callGreet("howdy from attic")
}
