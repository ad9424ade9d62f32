package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/nats-io/nats.go"
)

// TestClientCommandsFindTheirNode: a node set up as `meshbox join` sets
// one up, its NATS address and data directory in its env file, is found
// by the client commands from that file (--env-file) or from --data and
// the environment, as `meshbox run` finds its configuration; the data
// directory's credential goes to that node and no other, and a refused
// credential is named.
func TestClientCommandsFindTheirNode(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	data := t.TempDir()
	port := meshtest.FreePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	envFile := filepath.Join(t.TempDir(), "meshbox.env")
	if err := os.WriteFile(envFile, []byte("MESHBOX_DATA="+data+"\nMESHBOX_NATS="+addr+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A program before the node starts: the node then wants credentials.
	if code, out, errOut := cli(t, "program", "add", "sensor", "--publish", "temp", "--env-file", envFile); code != 0 {
		t.Fatalf("program add before the node runs: exit %d: %s%s", code, out, errOut)
	} else if !strings.Contains(out, "no node listens at nats://"+addr) {
		t.Errorf("program add before the node runs: %q, want it to say no node listens at nats://%s", out, addr)
	}
	attic := meshtest.StartProcess(t, "--node", "attic", "--env-file", envFile, "--data", data, "--nats", addr)
	other := meshtest.StartProcess(t, "--node", "shed") // open: no program, no credential

	for _, args := range [][]string{
		{"status", "--env-file", envFile},
		{"nodes", "--env-file", envFile},
		{"modules", "--env-file", envFile},
		{"blob", "list", "--env-file", envFile},
		{"program", "list", "--env-file", envFile},
		{"cache", "history", "--env-file", envFile},
	} {
		code, out, errOut := cli(t, args...)
		if strings.Contains(errOut, "flag provided but not defined") || strings.Contains(errOut, "cannot reach the node") {
			t.Errorf("meshbox %s: exit %d: %s", strings.Join(args, " "), code, errOut)
		}
		if args[0] == "status" && (code != 0 || !strings.Contains(out, "attic")) {
			t.Errorf("meshbox status --env-file: exit %d, %q %q, want attic's status", code, out, errOut)
		}
	}
	env := []string{"MESHBOX_NATS=" + addr}
	if code, out, errOut := cliEnv(t, env, "status", "--data", data); code != 0 || !strings.Contains(out, "attic") {
		t.Errorf("meshbox status --data (MESHBOX_NATS set): exit %d, %q %q, want attic's status", code, out, errOut)
	}
	if code, out, errOut := cliEnv(t, env, "call", "--data", data, "nothing", "x"); strings.Contains(errOut, "flag provided") || strings.Contains(errOut, "cannot reach") {
		t.Errorf("meshbox call --data: exit %d, %q %q", code, out, errOut)
	}

	// Another node: the data directory's credential is attic's, not shed's.
	env = []string{"MESHBOX_DATA=" + data, "MESHBOX_NATS=" + addr}
	if code, out, errOut := cliEnv(t, env, "status", "--server", other.NATSURL()); code != 0 || !strings.Contains(out, "shed") {
		t.Errorf("meshbox status --server <shed> with attic's MESHBOX_DATA: exit %d, %q %q, want shed's status", code, out, errOut)
	}
	// A credential the node refuses is named, with its public key.
	admin := filepath.Join(data, "admin.nk")
	code, _, errOut := cliEnv(t, nil, "status", "--server", other.NATSURL(), "--creds", admin)
	if code == 0 {
		t.Logf("shed, open to programs without a credential, let attic's credential in too")
	} else if !strings.Contains(errOut, "it refused the credential "+admin) || !strings.Contains(errOut, "public key U") {
		t.Errorf("status with a credential shed refuses: exit %d, %q, want it to name %s and its public key", code, errOut, admin)
	}

	// program add tells the running node, and prints where to connect.
	code, out, errOut := cli(t, "program", "add", "cam", "--publish", "motion", "--env-file", envFile)
	if code != 0 || !strings.Contains(out, "the running node applied it") || !strings.Contains(out, "--server nats://"+addr) {
		t.Errorf("program add with the node running: exit %d: %q %q, want it applied and --server nats://%s", code, out, errOut, addr)
	}
	_ = attic
}

// TestCallErrorsSayWhatToDo: meshbox call's refusals say what to do: a
// near name for an unknown capability, "no node" for --to a node the mesh
// does not have (not "not connected"), and the limit and blobs for data
// over the node's message size. The controls: the right name and node
// answer.
func TestCallErrorsSayWhatToDo(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	_, _, _, alpha, beta, _ := replayMesh(t)
	host := natsConn(t, beta)
	if _, err := host.Subscribe("cap.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		t.Fatal(err)
	}
	flush(t, host)
	waitRoute(t, alpha.HTTPURL(), "echo", "beta")
	onAlpha := []string{"MESHBOX_SERVER=" + alpha.NATSURL(), "MESHBOX_DATA=" + alpha.DataDir()}

	if code, out, errOut := cliEnv(t, onAlpha, "call", "echo", "hi", "--to", "beta"); code != 0 || out != "hi" {
		t.Fatalf("call echo --to beta (control): exit %d: %q %q", code, out, errOut)
	}
	if code, _, errOut := cliEnv(t, onAlpha, "call", "ehco", "hi"); code == 0 || !strings.Contains(errOut, "did you mean echo?") {
		t.Errorf("call ehco: exit %d: %q, want a suggestion of echo", code, errOut)
	}
	if code, _, errOut := cliEnv(t, onAlpha, "call", "echo", "hi", "--to", "ghost"); code == 0 ||
		!strings.Contains(errOut, "no node ghost in this mesh") || strings.Contains(errOut, "not connected") {
		t.Errorf("call --to ghost: exit %d: %q, want no node ghost in this mesh", code, errOut)
	}
	big := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(big, make([]byte, 2<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(big)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(meshtest.Binary(t), "call", "echo")
	cmd.Env = append(os.Environ(), onAlpha...)
	cmd.Stdin = f
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "max_payload") || !strings.Contains(string(out), "meshbox blob put FILE") {
		t.Errorf("call echo < 2 MiB: %v: %s, want the limit and blobs", err, out)
	}
}
