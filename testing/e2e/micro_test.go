package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// runNATS runs the official nats CLI against a node's server and
// returns its exit code and combined output.
func runNATS(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, natsCLI(t), args...).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatalf("nats %v: %v", args, err)
	}
	return 0, string(out)
}

// TestMicroDiscoveryAcrossTheMesh: `nats micro ls` and `nats micro info`
// (the official nats CLI) on node alpha list a nats.go micro service
// running on node beta beside alpha's own, its instance marked with
// beta's name; the service is callable from alpha. Refused: a program's
// credential asks nothing of the mesh (its rights give no discovery
// request), while the administrator's does.
func TestMicroDiscoveryAcrossTheMesh(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a broker, a database and two nodes")
	}
	alpha, beta, _ := twoNodeMesh(t)

	// A micro service on beta, run by a program with the right to.
	lamps := programs.Program{Name: "lamps", Host: []string{"lamps.set"}, Service: []string{"lamps"}}
	bnc := meshtest.ProgramConn(t, beta.NATSURL(), meshtest.AddProgram(t, beta.NATSURL(), beta.DataDir(), lamps), lamps)
	svc, err := micro.AddService(bnc, micro.Config{Name: "lamps", Version: "1.2.0", Description: "the lamps of the attic",
		Endpoint: &micro.EndpointConfig{Subject: wire.CapPrefix + "lamps.set", Handler: micro.HandlerFunc(func(r micro.Request) { _ = r.Respond([]byte("on")) })}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	// And one on alpha itself.
	anc := natsConn(t, alpha)
	local, err := micro.AddService(anc, micro.Config{Name: "clock", Version: "0.1.0",
		Endpoint: &micro.EndpointConfig{Subject: wire.CapPrefix + "clock.now", Handler: micro.HandlerFunc(func(r micro.Request) { _ = r.Respond([]byte("noon")) })}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = local.Stop() })
	waitCallable(t, anc, wire.CapPrefix+"lamps.set", nil, func(m *nats.Msg) bool { return string(m.Data) == "on" })

	admin := []string{"--server", alpha.NATSURL(), "--nkey", filepath.Join(alpha.DataDir(), programs.AdminFile)}
	code, out := runNATS(t, append(admin, "micro", "ls")...)
	if code != 0 || !strings.Contains(out, "lamps") || !strings.Contains(out, "clock") || !strings.Contains(out, "the lamps of the attic") {
		t.Fatalf("nats micro ls on alpha: exit %d, want lamps (on beta) and clock (on alpha):\n%s", code, out)
	}
	code, out = runNATS(t, append(admin, "micro", "info", "lamps", "--json")...)
	var shown struct {
		Info  micro.Info  `json:"info"`
		Stats micro.Stats `json:"stats"`
	}
	if err := json.Unmarshal([]byte(out), &shown); code != 0 || err != nil {
		t.Fatalf("nats micro info lamps --json on alpha: exit %d (%v):\n%s", code, err, out)
	}
	info := shown.Info
	if info.Metadata["meshbox_node"] != "beta" || info.Version != "1.2.0" || len(info.Endpoints) != 1 || info.Endpoints[0].Subject != wire.CapPrefix+"lamps.set" {
		t.Errorf("nats micro info lamps on alpha: %+v, want version 1.2.0, cap.lamps.set, meshbox_node beta", info)
	}
	code, out = runNATS(t, append(admin, "micro", "stats", "lamps", "--json")...)
	if code != 0 || !strings.Contains(out, `"num_requests"`) || !strings.Contains(out, `"meshbox_node": "beta"`) {
		t.Errorf("nats micro stats lamps on alpha: exit %d:\n%s", code, out)
	}

	// Refused: a program's credential, even one that may call the service.
	caller := programs.Program{Name: "caller", Call: []string{"lamps.set"}}
	creds := meshtest.AddProgram(t, alpha.NATSURL(), alpha.DataDir(), caller)
	code, out = runNATS(t, "--server", alpha.NATSURL(), "--nkey", creds, "--inbox-prefix", caller.InboxPrefix(), "--timeout", "2s", "micro", "ls")
	if strings.Contains(out, "lamps") || !strings.Contains(strings.ToLower(out), "permissions violation for publish to \"$srv.info\"") {
		t.Errorf("nats micro ls with a program's credential: exit %d, want a permissions violation and no service:\n%s", code, out)
	}
	// Its control: the program calls what it may.
	pnc := meshtest.ProgramConn(t, alpha.NATSURL(), creds, caller)
	if resp, err := pnc.Request(wire.CapPrefix+"lamps.set", nil, 5*time.Second); err != nil || string(resp.Data) != "on" {
		t.Errorf("the caller program calls lamps.set: %v", err)
	}

	// Refused: a program that may call everything asks micro discovery's
	// capability by a node's name, its own node's and beta's; the control
	// is the administrator asking the same.
	everything := programs.Program{Name: "everything", Call: []string{">"}}
	enc := meshtest.ProgramConn(t, alpha.NATSURL(), meshtest.AddProgram(t, alpha.NATSURL(), alpha.DataDir(), everything), everything)
	ping := []byte(`{"verb":"PING"}`)
	for _, node := range []string{"alpha", "beta"} {
		subj := wire.NodePrefix + node + ".cap.meshbox.micro"
		resp, err := enc.Request(subj, ping, 5*time.Second)
		if err != nil {
			t.Errorf("program everything asks %s: %v, want a refusal", subj, err)
			continue
		}
		if code, _, _ := wire.ReadError(resp.Header); code != strconv.Itoa(wire.CodeForbidden) || bytes.Contains(resp.Data, []byte("lamps")) || bytes.Contains(resp.Data, []byte("clock")) {
			t.Errorf("program everything asks %s: code %q, body %.200q; want %d and no service", subj, code, resp.Data, wire.CodeForbidden)
		}
		aresp, err := anc.Request(subj, ping, 5*time.Second)
		if err != nil || !bytes.Contains(aresp.Data, []byte("io.nats.micro.v1.ping_response")) {
			t.Errorf("the administrator asks %s: %v %.200q, want the node's services", subj, err, aresp.Data)
		}
	}

	// A capability no node hosts, as docs/programs.md's error table says:
	// by its plain name, the NATS server's own no responders (a 503
	// status, no Nats-Service-Error); on a named node, that node's 503.
	code, out = runNATS(t, append(admin, "request", "--timeout", "5s", "cap.nothing.here", "x")...)
	if !strings.Contains(out, "No responders are available") {
		t.Errorf("nats request cap.nothing.here: exit %d, want no responders:\n%s", code, out)
	}
	if _, err := anc.Request("cap.nothing.here", nil, 5*time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("nats.go request cap.nothing.here: %v, want %v", err, nats.ErrNoResponders)
	}
	resp, err := anc.Request(wire.NodePrefix+"beta.cap.nothing.here", nil, 5*time.Second)
	if err != nil {
		t.Fatalf("node.beta.cap.nothing.here: %v, want a 503", err)
	}
	if code, text, _ := wire.ReadError(resp.Header); code != "503" || !strings.Contains(text, "nothing.here") {
		t.Errorf("node.beta.cap.nothing.here: code %q %q, want 503 naming the capability", code, text)
	}
}
