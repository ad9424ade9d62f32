package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshbox/meshbox/testing/meshtest"
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
