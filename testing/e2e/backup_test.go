package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/testing/ledger"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// TestBackupRestoreOutbox: a running node with commands in its outbox
// (its broker gone) is backed up; the broker returns and the node sends
// them; the node is killed and its data directory deleted. Restored from
// the backup into a new directory, it holds those commands again and
// sends them: every accepted command is handled, and each one handled
// twice (once before the loss, once from the restored outbox) is marked
// as a redelivery the second time. The restored node says how old its
// backup was; a restore into the now used directory is refused.
func TestBackupRestoreOutbox(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	const n = 200
	rmq, amqpURL, alphaURL, px := vhostBehindProxy(t)
	beta := startMeshNode(t, "beta", amqpURL, bridgeConfig{})
	alphaData := t.TempDir()
	alpha := startMeshNode(t, "alpha", alphaURL, bridgeConfig{}, "--data", alphaData)
	h := ledger.NewHistory()
	handleBackupStage(t, beta, h)
	waitConsumers(t, rmq, amqpURL, "cmd.backup", 1)

	px.Cut(t)
	meshtest.WaitStatus(t, alpha.HTTPURL(), 30*time.Second, "alpha's link down", func(s appliance.Status) bool { return s.Broker.State != "connected" })
	nc := natsConn(t, alpha)
	for seq := range n {
		o, resp, err := ledger.Submit(nc, "cmd.backup", ledger.Payload("alpha", seq), 10*time.Second)
		h.Submitted(ledger.Op{Origin: "alpha", Seq: seq}, o)
		if o != ledger.Acked || resp.Header.Get(hdrAccepted) != "outbox" {
			t.Fatalf("command %d: got %v (err %v), want accepted into the outbox", seq, o, err)
		}
	}

	// The backup, of the running node: its outbox holds the n commands.
	dir := t.TempDir()
	pass := filepath.Join(dir, "passphrase")
	if err := os.WriteFile(pass, []byte("correct horse battery staple\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "alpha.backup")
	start := time.Now()
	code, out, errOut := cli(t, "backup", "--data", alphaData, "--server", alpha.NATSURL(), "--out", archive, "--passphrase-file", pass)
	if code != 0 || !strings.Contains(out, "from the running node") {
		t.Fatalf("backup: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("backup of a running node with %d commands in its outbox: %s", n, time.Since(start).Round(time.Millisecond))
	if _, err := os.Stat(filepath.Join(alphaData, "backup-snapshot")); !os.IsNotExist(err) {
		t.Errorf("the copies of the files in use are left in the data directory: %v", err)
	}

	// After the backup the node goes on: the broker returns and it sends
	// every command, which beta handles once.
	px.Restore(t)
	handled := func(want int) {
		t.Helper()
		if !meshtest.Poll(30*time.Second, func() bool { return h.Count() >= want }) {
			t.Fatalf("after 30s: %d deliveries, want %d\n%s", h.Count(), want, h.Check())
		}
	}
	handled(n)
	meshtest.WaitStatus(t, alpha.HTTPURL(), 30*time.Second, "alpha's outbox empty", func(s appliance.Status) bool { return s.Outbox.Depth == 0 })

	// The node is lost. Beta is started again: it no longer remembers the
	// ids it handed to its handler (a node marks an id it handed out
	// before as a possible duplicate itself), so a mark it passes on now
	// comes from the restored outbox.
	alpha.Kill()
	beta.Kill()
	beta = startMeshNode(t, "beta", amqpURL, bridgeConfig{})
	handleBackupStage(t, beta, h)
	waitConsumers(t, rmq, amqpURL, "cmd.backup", 1)
	if err := os.RemoveAll(alphaData); err != nil {
		t.Fatal(err)
	}

	// Restored into a new directory, with the broker gone again: the
	// restored node holds the n commands.
	px.Cut(t)
	data := filepath.Join(t.TempDir(), "alpha")
	code, out, errOut = cli(t, "restore", archive, "--data", data, "--passphrase-file", pass)
	if code != 0 || !strings.Contains(out, "restored node alpha") {
		t.Fatalf("restore: exit %d\n%s%s", code, out, errOut)
	}
	restored := meshtest.StartProcess(t, meshNodeArgs(t, "alpha", alphaURL, bridgeConfig{}, "--data", data)...)
	st := meshtest.WaitStatus(t, restored.HTTPURL(), 30*time.Second, "the restored outbox", func(s appliance.Status) bool { return s.Outbox.Depth == n })
	if r := st.Restored; r == nil || r.Node != "alpha" || r.AgeSeconds <= 0 || r.Marked != n {
		t.Errorf("status restored: got %+v, want node alpha, the backup's age, %d marked", r, n)
	} else if !r.TakenAt.Before(r.RestoredAt) {
		t.Errorf("status restored: taken %s, restored %s", r.TakenAt, r.RestoredAt)
	}
	if !strings.Contains(restored.Output(), "restored from a backup") {
		t.Errorf("the restored node's log does not say it was restored:\n%s", restored.Output())
	}
	px.Restore(t)
	handled(2 * n)
	res := h.Check()
	if !res.Valid() || res.DupMarked != n {
		t.Errorf("want every command handled, and each of the %d sent again marked:\n%s", n, res)
	}

	// The directory holds a node now: a second restore into it is refused.
	code, _, errOut = cli(t, "restore", archive, "--data", data, "--passphrase-file", pass)
	if code == 0 || !strings.Contains(errOut, "new or empty directory") {
		t.Errorf("restore into a used directory: exit %d, %s; want a refusal saying what to do", code, errOut)
	}
}

// handleBackupStage serves stage backup on p: each command is recorded in h and
// answered.
func handleBackupStage(t *testing.T, p *meshtest.Process, h *ledger.History) {
	t.Helper()
	nc := natsConn(t, p)
	sub, err := nc.QueueSubscribe("work.backup", "handlers", func(m *nats.Msg) {
		h.Delivered(ledger.DeliveryOf("beta", m))
		_ = m.Respond(nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	flush(t, nc)
}
