package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/node"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/nats-io/nats.go"
)

// Discovery timing for these tests: heartbeats every 300ms, a peer gone
// after 3 missed, a full re-query every 3s.
const (
	discHeartbeat = 300 * time.Millisecond
	discMissed    = 3
	discInterval  = 3 * time.Second
)

// discoveryNode runs node name as a child process on the broker at amqpURL
// with fast discovery timings, and waits for its broker link.
func discoveryNode(t *testing.T, name, amqpURL string, extra ...string) *meshtest.Process {
	t.Helper()
	cfg := map[string]any{"mesh": map[string]any{
		"heartbeat_interval": discHeartbeat.String(),
		"missed_heartbeats":  discMissed,
		"discovery_interval": discInterval.String(),
	}}
	data, _ := json.Marshal(cfg)
	file := filepath.Join(t.TempDir(), name+"-mesh.json")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--node", name, "--config", file}, extra...)
	if amqpURL != "" {
		args = append(args, "--broker", amqpURL)
	}
	p := meshtest.StartProcess(t, args...)
	meshtest.WaitStatus(t, p.HTTPURL(), 30*time.Second, name+" connected to the broker", func(s appliance.Status) bool { return s.Broker.State == "connected" })
	return p
}

// peer returns what st says of the peer named name (its zero value, and
// State "", if st does not list it).
func peer(st appliance.Status, name string) node.Peer {
	for _, p := range st.Peers {
		if p.Name == name {
			return p
		}
	}
	return node.Peer{}
}

// dialNode connects a client with the node's administrative credential,
// closed in cleanup.
func dialNode(t *testing.T, p *meshtest.Process) *nats.Conn {
	t.Helper()
	return p.Connect(t)
}

// natsCLI is the path of the official nats CLI, which make test installs.
func natsCLI(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("nats"); err == nil {
		return p
	}
	out, err := exec.Command("go", "env", "GOPATH").Output()
	if err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), "bin", "nats")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatal("the nats CLI is not installed (testing/services.sh installs it; make test runs that)")
	return ""
}

// natsReply runs `nats reply SUBJECT --echo` against the server at url until
// the test ends.
//
// It runs as a local program allowed to host the capability, with its
// credential file (nats --nkey) and its own inbox prefix.
func natsReply(t *testing.T, p *meshtest.Process, subject string) *exec.Cmd {
	t.Helper()
	prog := programs.Program{Name: "echo-host", Host: []string{strings.TrimPrefix(subject, "cap.")}}
	creds := meshtest.AddProgram(t, p.NATSURL(), p.DataDir(), prog)
	cmd := exec.Command(natsCLI(t), "--server", p.NATSURL(), "--nkey", creds, "--inbox-prefix", prog.InboxPrefix(), "reply", subject, "--echo")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

// natsRequest runs `nats request SUBJECT BODY` against the server at url.
//
// It runs as a local program allowed to call the capability.
func natsRequest(t *testing.T, p *meshtest.Process, subject, body string) (string, error) {
	t.Helper()
	prog := programs.Program{Name: "echo-caller", Call: []string{strings.TrimPrefix(subject, "cap.")}}
	creds := meshtest.AddProgram(t, p.NATSURL(), p.DataDir(), prog)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, natsCLI(t), "--server", p.NATSURL(), "--nkey", creds, "--inbox-prefix", prog.InboxPrefix(),
		"request", subject, body, "--timeout", "3s", "--raw").CombinedOutput()
	return string(out), err
}

// hostCapability hosts capability name on the node at url, answering with
// the node's name, until the returned connection is closed.
func hostCapability(t *testing.T, p *meshtest.Process, name, answer string) *nats.Conn {
	t.Helper()
	nc := p.Connect(t, nats.Name("host-"+answer))
	if _, err := nc.QueueSubscribe("cap."+name, "hosts", func(m *nats.Msg) { _ = m.Respond([]byte(answer)) }); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return nc
}

func TestDiscoveryCapabilityAppearsOnPeer(t *testing.T) {
	vhost := meshtest.RabbitMQ(t).Vhost(t)
	a := discoveryNode(t, "alpha", vhost)
	b := discoveryNode(t, "beta", vhost)
	c := discoveryNode(t, "gamma", vhost)
	for _, p := range []string{"beta", "gamma"} {
		meshtest.WaitStatus(t, a.HTTPURL(), 10*time.Second, "alpha sees "+p+" up", func(v appliance.Status) bool { return peer(v, p).State == "up" })
	}

	// The capability appears on beta after alpha started: the official CLI hosts it.
	natsReply(t, b, "cap.echo")
	start := time.Now()
	meshtest.WaitStatus(t, a.HTTPURL(), discInterval, "alpha routes echo to beta", func(v appliance.Status) bool {
		return slices.Contains(v.Capabilities.Remote["echo"], "beta")
	})
	// Announced at once; a machine running the whole suite has taken 1.8 s.
	if took := time.Since(start); took > 2500*time.Millisecond {
		t.Errorf("echo on beta reached alpha's view after %s, want within a second or two (announced)", took)
	}
	out, err := natsRequest(t, a, "cap.echo", "hi")
	if err != nil || !strings.Contains(out, "hi") {
		t.Fatalf("nats request cap.echo on alpha: %v\n%s", err, out)
	}
	// gamma sees it as well, and beta does not route its own capability.
	meshtest.WaitStatus(t, c.HTTPURL(), 2*time.Second, "gamma routes echo to beta", func(v appliance.Status) bool {
		return slices.Contains(v.Capabilities.Remote["echo"], "beta")
	})
	if v := meshtest.Status(t, b.HTTPURL()); !slices.Contains(v.Capabilities.Local, "echo") {
		t.Errorf("beta local capabilities: got %v, want echo", v.Capabilities.Local)
	}
}

func TestDiscoveryPeerKilledAndBack(t *testing.T) {
	vhost := meshtest.RabbitMQ(t).Vhost(t)
	a := discoveryNode(t, "alpha", vhost)
	discoveryNode(t, "beta", vhost)
	cData := t.TempDir()
	c := discoveryNode(t, "gamma", vhost, "--data", cData)
	hostCapability(t, c, "x", "gamma")
	meshtest.WaitStatus(t, a.HTTPURL(), 5*time.Second, "alpha routes x to gamma", func(v appliance.Status) bool {
		return slices.Contains(v.Capabilities.Remote["x"], "gamma")
	})
	caller := dialNode(t, a)
	if m, err := caller.Request("node.gamma.cap.x", nil, 3*time.Second); err != nil || string(m.Data) != "gamma" {
		t.Fatalf("node.gamma.cap.x before the kill: %v %v", err, m)
	}

	c.Kill()
	window := time.Duration(discMissed+2) * discHeartbeat
	start := time.Now()
	meshtest.WaitStatus(t, a.HTTPURL(), window+2*time.Second, "alpha marks gamma gone and withdraws x", func(v appliance.Status) bool {
		return peer(v, "gamma").State == "gone" && len(v.Capabilities.Remote["x"]) == 0
	})
	if took := time.Since(start); took > window+time.Second {
		t.Errorf("gamma marked gone after %s, want within the heartbeat window (%s)", took, window)
	}

	// A call addressed to the gone node fails at once, naming it.
	for _, subject := range []string{"node.gamma.cap.x", "cap.x"} {
		start := time.Now()
		m, err := caller.Request(subject, nil, 5*time.Second)
		d := time.Since(start)
		if d > 500*time.Millisecond {
			t.Errorf("%s after gamma is gone: answered after %s, want at once", subject, d)
		}
		var desc string
		if err == nil {
			desc = m.Header.Get("Nats-Service-Error")
			if code := m.Header.Get("Nats-Service-Error-Code"); code != "503" {
				t.Errorf("%s: error code %q, want 503 (%q)", subject, code, desc)
			}
		} else {
			desc = err.Error()
		}
		if subject == "cap.x" {
			// Nobody hosts x any more and its stand-in is withdrawn: the
			// NATS server answers "no responders" (a 503 status) at once,
			// as for any subject nobody serves; meshbox call names the
			// capability when it reports it.
			if !errors.Is(err, nats.ErrNoResponders) {
				t.Errorf("%s: got %v (%q), want no responders", subject, err, desc)
			}
			continue
		}
		if want := "gamma"; !strings.Contains(desc, want) {
			t.Errorf("%s: error %q, want it to name %q", subject, desc, want)
		}
	}

	// gamma comes back and is callable again, with nobody restarted.
	c = discoveryNode(t, "gamma", vhost, "--data", cData)
	hostCapability(t, c, "x", "gamma")
	meshtest.WaitStatus(t, a.HTTPURL(), 5*time.Second, "alpha sees gamma again", func(v appliance.Status) bool {
		return peer(v, "gamma").State == "up" && slices.Contains(v.Capabilities.Remote["x"], "gamma")
	})
	if m, err := caller.Request("node.gamma.cap.x", nil, 3*time.Second); err != nil || string(m.Data) != "gamma" {
		t.Fatalf("node.gamma.cap.x after gamma returned: %v %v", err, m)
	}
}

func TestDiscoverySpreadsCallsAndSurvivesHostLoss(t *testing.T) {
	vhost := meshtest.RabbitMQ(t).Vhost(t)
	a := discoveryNode(t, "alpha", vhost)
	b := discoveryNode(t, "beta", vhost)
	c := discoveryNode(t, "gamma", vhost)
	hostCapability(t, b, "who", "beta")
	hostCapability(t, c, "who", "gamma")
	meshtest.WaitStatus(t, a.HTTPURL(), 5*time.Second, "alpha routes who to beta and gamma", func(v appliance.Status) bool {
		return len(v.Capabilities.Remote["who"]) == 2
	})
	caller := dialNode(t, a)
	seen := map[string]int{}
	for range 40 {
		m, err := caller.Request("cap.who", nil, 3*time.Second)
		if err != nil {
			t.Fatalf("cap.who: %v", err)
		}
		seen[string(m.Data)]++
	}
	if seen["beta"] == 0 || seen["gamma"] == 0 {
		t.Fatalf("40 calls went to %v, want both beta and gamma", seen)
	}

	// Kill beta while calls flow; once alpha knows, every call succeeds via gamma.
	b.Kill()
	failures := 0
	deadline := time.Now().Add(time.Duration(discMissed+2)*discHeartbeat + 3*time.Second)
	for time.Now().Before(deadline) {
		if v := meshtest.Status(t, a.HTTPURL()); peer(v, "beta").State == "gone" {
			break
		}
		if _, err := caller.Request("cap.who", nil, time.Second); err != nil {
			failures++
		}
	}
	t.Logf("calls that failed while beta's death was being detected: %d", failures)
	if st := peer(meshtest.Status(t, a.HTTPURL()), "beta").State; st != "gone" {
		t.Fatalf("beta state: got %q, want gone", st)
	}
	for i := range 40 {
		m, err := caller.Request("cap.who", nil, 3*time.Second)
		if err != nil {
			t.Fatalf("call %d after beta is gone: %v", i, err)
		}
		if got := string(m.Data); got != "gamma" {
			t.Fatalf("call %d after beta is gone: answered by %q, want gamma", i, got)
		}
	}
}

func TestDiscoveryExpectedButAbsent(t *testing.T) {
	vhost := meshtest.RabbitMQ(t).Vhost(t)
	db := meshtest.Postgres(t).Database(t)
	if code, _, errOut := cli(t, "init", "--db", db, "--node", "alpha", "--broker", meshtest.NoCredential(vhost)); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	mesh(t, db, "node", "add", "ghost", "--record-only")
	a := discoveryNode(t, "alpha", "", "--db", db)
	meshtest.WaitStatus(t, a.HTTPURL(), 5*time.Second, "ghost listed as expected-but-absent", func(v appliance.Status) bool {
		return peer(v, "ghost").State == "expected-but-absent"
	})
}
