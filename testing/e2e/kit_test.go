package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// TestJoinAloneWithTheKit: a mesh gets a recovery kit; alpha and beta
// write a table and stop; gamma, added with the kit, starts for the first
// time with every other node offline and reads every row. Controls: delta,
// added without the kit and started alone, waits for a key; another
// mesh's kit is refused and adds nothing.
func TestJoinAloneWithTheKit(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, RabbitMQ and four nodes")
	}
	t.Parallel()
	m := newIdentityMesh(t, "alpha", "beta", "delta")
	t.Cleanup(func() { _, _, _ = cliEnv(t, m.admin, "mesh", "node", "remove", "gamma", "--force") })
	kitFile := filepath.Join(t.TempDir(), "mesh.kit")
	code, out, errOut := cliEnv(t, m.admin, "mesh", "kit", "--out", kitFile)
	if code != 0 || !strings.Contains(out, "recovery kit made") || !strings.Contains(out, "write down its secret") {
		t.Fatalf("mesh kit --out: exit %d: %s%s", code, out, errOut)
	}
	if fi, err := os.Stat(kitFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the kit's file: %v, %v; want mode 0600", fi, err)
	}
	kitText, _ := os.ReadFile(kitFile)
	if code, out, errOut := cliEnv(t, m.admin, "mesh", "kit", "--out", kitFile); code == 0 || !strings.Contains(errOut, "exists") {
		t.Errorf("mesh kit --out over an existing file: exit %d: %s%s; want a refusal", code, out, errOut)
	}
	if again, _ := os.ReadFile(kitFile); string(again) != string(kitText) {
		t.Errorf("the kit's file changed: a refused mesh kit wrote over it")
	}

	alpha, beta := m.start(t, "alpha"), m.start(t, "beta")
	for _, p := range []*meshtest.Process{alpha, beta} {
		waitKeysInStep(t, p)
	}
	if code, out, errOut := cliEnv(t, m.admin, "mesh", "table", "add", "jobs"); code != 0 {
		t.Fatalf("mesh table add jobs: exit %d: %s%s", code, out, errOut)
	}
	rowsWritten := map[string]string{"1": "queued", "2": "done", "3": "failed"}
	for id, status := range rowsWritten {
		waitRows(t, alpha, 20*time.Second, 0, "", "put", "jobs", id, "status="+status)
	}
	for id, status := range rowsWritten {
		waitRows(t, beta, 20*time.Second, 0, status, "get", "jobs", id, "--field", "status")
	}
	// The nodes sealed the mesh's key for the kit.
	ctx := context.Background()
	db, err := meshdb.Open(ctx, m.db, meshdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	meshtest.WaitFor(t, 30*time.Second, "the mesh's keys sealed for the kit", func() bool {
		_, copies, err := db.RecoveryKit(ctx, "")
		return err == nil && len(copies) > 0
	})
	for _, p := range []*meshtest.Process{alpha, beta} {
		p.Signal(syscall.SIGTERM)
		p.Wait()
	}

	// Control: without the kit, a node alone waits for a key.
	delta := m.start(t, "delta")
	meshtest.WaitFor(t, 30*time.Second, "delta in step and lacking the mesh's key", func() bool {
		st := meshtest.Status(t, delta.HTTPURL())
		return st.Keys != nil && st.Keys.InStep && len(st.Keys.Lacking) > 0 && st.Keys.Current == ""
	})
	if code, out, _ := rowsCLI(t, delta, "get", "jobs", "1", "--field", "status"); code == 0 {
		t.Errorf("delta, alone without the kit, read row 1: %q", out)
	}
	delta.Signal(syscall.SIGTERM)
	delta.Wait()

	// Another mesh's kit is refused, and nothing is added.
	other := meshtest.Postgres(t).Database(t)
	otherKit := filepath.Join(t.TempDir(), "other.kit")
	if code, out, errOut := cli(t, "init", "--db", other, "--node", "x", "--broker", meshtest.NoCredential(m.vhost), "--kit", otherKit); code != 0 || !strings.Contains(out, "recovery kit made") {
		t.Fatalf("init --kit of another mesh: exit %d: %s%s", code, out, errOut)
	}
	code, out, errOut = cliEnv(t, m.admin, "mesh", "node", "add", "gamma", "--stages", "*", "--kit", otherKit)
	if code == 0 || !strings.Contains(errOut, "it is the kit of mesh") || !strings.Contains(errOut, "nothing was changed") {
		t.Errorf("node add --kit with another mesh's kit: exit %d: %s%s; want a refusal naming the mesh", code, out, errOut)
	}
	if _, out, _ := cliEnv(t, m.admin, "mesh", "node", "list"); strings.Contains(out, "gamma") {
		t.Errorf("a refused node add recorded gamma:\n%s", out)
	}
	if _, holders, err := db.ContentKeys(ctx); err != nil {
		t.Fatal(err)
	} else {
		for _, h := range holders {
			if h.Node == "gamma" {
				t.Errorf("a refused node add sealed %s for gamma", h.KeyID)
			}
		}
	}

	// gamma, added with the kit (MESHBOX_KIT), starts alone and reads
	// every row.
	code, out, errOut = cliEnv(t, append(m.admin, "MESHBOX_KIT="+kitFile), "mesh", "node", "add", "gamma", "--stages", "*")
	if code != 0 || !strings.Contains(out, "opened with the recovery kit") {
		t.Fatalf("mesh node add gamma with the kit: exit %d: %s%s", code, out, errOut)
	}
	m.envs["gamma"] = filepath.Join(t.TempDir(), "gamma.env")
	m.data["gamma"] = filepath.Join(t.TempDir(), "data")
	rememberDataDir(m.db, "gamma", m.data["gamma"])
	if code, out, errOut := cli(t, "join", joinToken(t, out), "--env-file", m.envs["gamma"], "--data", m.data["gamma"]); code != 0 {
		t.Fatalf("join gamma: exit %d: %s%s", code, out, errOut)
	}
	gamma := m.start(t, "gamma")
	for id, status := range rowsWritten {
		waitRows(t, gamma, 30*time.Second, 0, status, "get", "jobs", id, "--field", "status")
	}
}
