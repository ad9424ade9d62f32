package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/nats-io/nats.go"
)

func TestMain(m *testing.M) {
	os.Exit(meshtest.Main(m, meshtest.SharedRabbitMQ, meshtest.SharedPostgres))
}

// cli runs the meshbox binary with args and returns its exit code, stdout
// and stderr.
func cli(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return cliEnv(t, nil, args...)
}

// cliEnv is cli with extra environment variables (NAME=value).
func cliEnv(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	bin := meshtest.Binary(t) // built before the command's own timeout starts
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(os.Environ(), "MESHBOX_SERVER=", "MESHBOX_DB=", "MESHBOX_BROKER=")
	cmd.Env = append(cmd.Env, env...)
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run meshbox %v: %v", args, err)
	}
	if code == 0 && len(args) >= 3 && args[0] == "mesh" && args[1] == "node" && (args[2] == "add" || args[2] == "rejoin") {
		rememberJoin(env, stdout.String()) // what the node will know (nodelogins_test.go)
	}
	return code, stdout.String(), stderr.String()
}

func TestStandaloneNode(t *testing.T) {
	p := meshtest.StartProcess(t, "--node", "solo")

	// Two ordinary NATS clients talk through the node: request/reply and pub/sub.
	host, err := nats.Connect(p.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	caller, err := nats.Connect(p.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer caller.Close()
	if _, err := host.Subscribe("cap.echo", func(m *nats.Msg) { _ = m.Respond(append([]byte("echo:"), m.Data...)) }); err != nil {
		t.Fatal(err)
	}
	events, err := host.SubscribeSync("evt.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := host.Flush(); err != nil {
		t.Fatal(err)
	}
	reply, err := caller.Request("cap.echo", []byte("hi"), 2*time.Second)
	if err != nil {
		t.Fatalf("request through the node: %v", err)
	}
	if got := string(reply.Data); got != "echo:hi" {
		t.Fatalf("reply: got %q, want %q", got, "echo:hi")
	}
	if err := caller.Publish("evt.door.opened", []byte("front")); err != nil {
		t.Fatal(err)
	}
	ev, err := events.NextMsg(2 * time.Second)
	if err != nil {
		t.Fatalf("event through the node: %v", err)
	}
	if ev.Subject != "evt.door.opened" || string(ev.Data) != "front" {
		t.Fatalf("event: got %s %q, want evt.door.opened front", ev.Subject, ev.Data)
	}

	// meshbox status --json reaches the node through its NATS server.
	code, out, errOut := cli(t, "status", "--json", "--server", p.NATSURL())
	if code != 0 {
		t.Fatalf("status: exit %d, stderr %s", code, errOut)
	}
	var st appliance.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status is not JSON: %v\n%s", err, out)
	}
	if st.Node != "solo" || st.Version == "" || st.StartedAt.IsZero() {
		t.Errorf("status: got node %q version %q started %v, want solo, a version, a time", st.Node, st.Version, st.StartedAt)
	}
	if st.Broker.State != "none" && st.Broker.State != "offline" {
		t.Errorf("broker.state: got %q, want none or offline", st.Broker.State)
	}
	if st.Bindings.Source != "none" {
		t.Errorf("bindings.source: got %q, want none", st.Bindings.Source)
	}
	if st.NATS.URL != p.NATSURL() || st.HTTP.URL != p.HTTPURL() {
		t.Errorf("urls: got %s %s, want %s %s", st.NATS.URL, st.HTTP.URL, p.NATSURL(), p.HTTPURL())
	}

	// The human form names the node too.
	code, out, _ = cli(t, "status", "--server", p.NATSURL())
	if code != 0 || !strings.Contains(out, "solo") {
		t.Errorf("status: exit %d, output %q; want 0 and the node name", code, out)
	}

	resp, err := http.Get(p.HTTPURL() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz: got %d, want 200", resp.StatusCode)
	}

	// SIGTERM: a graceful stop with exit 0, within a few seconds.
	start := time.Now()
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(); code != 0 {
		t.Fatalf("exit after SIGTERM: got %d, want 0\n%s", code, p.Output())
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("stop took %s, want under 5s", d)
	}
	if !strings.Contains(p.Output(), `msg=stopped`) {
		t.Errorf("output: want a stopped line, got\n%s", p.Output())
	}
}

func TestSecondProcessOnSameDataDirIsRefused(t *testing.T) {
	dir := t.TempDir()
	meshtest.StartProcess(t, "--node", "first", "--data", dir)
	start := time.Now()
	code, out := meshtest.StartProcessExpectFailure(t, "--node", "second", "--data", dir)
	if code == 0 {
		t.Fatalf("second process: exit 0, want a refusal\n%s", out)
	}
	if !strings.Contains(out, "in use by another meshbox process") {
		t.Errorf("second process output: want the in-use error, got\n%s", out)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("refusal took %s, want it at once", d)
	}
}

func TestStatusOfUnreachableNode(t *testing.T) {
	t.Parallel()
	port := meshtest.ClosedPort(t)
	code, out, errOut := cli(t, "status", "--server", "nats://127.0.0.1:"+strconv.Itoa(port))
	if code == 0 {
		t.Fatalf("status of no node: exit 0, want non-zero (stdout %q)", out)
	}
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "cannot reach the node") {
		t.Errorf("stderr: got %q, want one line saying the node cannot be reached", errOut)
	}
}

func TestRunRejectsBadInput(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"run", "--nats", "nope"}, "config: nats:"},
		{[]string{"run", "--node", "bad name"}, "config: node:"},
		{[]string{"run", "--db", "mysql://x/y"}, "config: db:"},
		{[]string{"run", "--no-such-flag"}, "flag provided but not defined"},
		{[]string{"run", "extra"}, "run takes no arguments"},
		{[]string{"frobnicate"}, "unknown command"},
	}
	for _, tt := range tests {
		code, _, errOut := cli(t, append(tt.args, "--data", t.TempDir())...)
		if code == 0 || !strings.Contains(errOut, tt.want) {
			t.Errorf("meshbox %v: exit %d, stderr %q; want non-zero and %q", tt.args, code, errOut, tt.want)
		}
	}
}

// TestNATSPortInUseSaidAtOnce: a node whose NATS address another program
// listens on says so at once (not after waiting for its server), naming
// the address and how to choose another.
func TestNATSPortInUseSaidAtOnce(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	addr := l.Addr().String()
	start := time.Now()
	code, _, errOut := cli(t, "run", "--data", t.TempDir(), "--nats", addr, "--http", "127.0.0.1:0")
	took := time.Since(start)
	if code == 0 || !strings.Contains(errOut, "nats address "+addr+" is in use by another program") || !strings.Contains(errOut, "--nats or MESHBOX_NATS") {
		t.Errorf("run on a NATS address in use: exit %d, %q; want it named in use, and how to choose another", code, errOut)
	}
	if took > 3*time.Second {
		t.Errorf("run on a NATS address in use took %v to say so, want at once", took)
	}
}
