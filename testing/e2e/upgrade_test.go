package e2e

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/testing/ledger"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/nats-io/nats.go"
)

// upVersion is the version st reports of peer name while it is up ("" if
// it is not).
func upVersion(st appliance.Status, name string) string {
	if p := peer(st, name); p.State == "up" {
		return p.Version
	}
	return ""
}

// TestUpgradeWithFullOutbox upgrades a node in place the way the package
// does: with the broker out of its reach, node alpha accepts commands and events into
// its outbox; it is stopped (SIGTERM, as systemctl restart does), its
// binary replaced by a newer build, and started on the same data
// directory. The new binary opens the old outbox with every message in
// it; once the broker is back, every command and event reaches beta —
// none lost, none duplicated unmarked. Meanwhile beta, still on the old
// build, shows alpha's new version: a half-upgraded mesh is visible.
func TestUpgradeWithFullOutbox(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	const (
		n          = 600 // commands, and as many events
		newVersion = "v99.0.0-upgraded"
	)
	oldBin := meshtest.Binary(t)
	newBin := meshtest.BinaryVersion(t, newVersion)
	t.Parallel()
	// The broker goes away for alpha: alpha reaches it through a proxy
	// that is closed (connections refused) and opened again.
	rmq, amqpURL, alphaURL, px := vhostBehindProxy(t)

	beta := startMeshNode(t, "beta", amqpURL, bridgeConfig{})
	alphaData := t.TempDir()
	alpha := startMeshNode(t, "alpha", alphaURL, bridgeConfig{}, "--data", alphaData)
	oldVersion := meshtest.Status(t, alpha.HTTPURL()).Version
	if oldVersion == newVersion {
		t.Fatalf("the old build already reports %s", newVersion)
	}

	cmds, evts := ledger.NewHistory(), ledger.NewHistory()
	hnc := natsConn(t, beta)
	csub, err := hnc.QueueSubscribe("work.upgrade", "handlers", func(m *nats.Msg) {
		cmds.Delivered(ledger.DeliveryOf("beta", m))
		_ = m.Respond(nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	esub, err := hnc.Subscribe("evt.upgrade", func(m *nats.Msg) { evts.Delivered(ledger.DeliveryOf("beta", m)) })
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*nats.Subscription{csub, esub} {
		_ = s.SetPendingLimits(-1, -1)
	}
	flush(t, hnc)
	waitListening(t, beta, "evt.upgrade", alpha)
	waitConsumers(t, rmq, amqpURL, "cmd.upgrade", 1)
	meshtest.WaitStatus(t, beta.HTTPURL(), 30*time.Second, "beta sees alpha at the old version", func(s appliance.Status) bool {
		return upVersion(s, "alpha") == oldVersion
	})

	// The broker goes away; alpha takes everything into its outbox.
	px.Cut(t)
	meshtest.WaitStatus(t, alpha.HTTPURL(), 30*time.Second, "alpha's link down", func(s appliance.Status) bool { return s.Broker.State != "connected" })
	nc := natsConn(t, alpha)
	stop := make(chan struct{})
	close(stop) // submit exactly n of each
	cl := &ledger.Load{NC: nc, Subject: "cmd.upgrade", Origin: "alpha", History: cmds}
	el := &ledger.Load{NC: nc, Subject: "evt.upgrade", Origin: "alpha", History: evts}
	cl.Run(8, 2000, n, n, stop)
	el.Run(8, 2000, n, n, stop)
	for _, l := range []*ledger.Load{cl, el} {
		if accepted, _, _ := l.Answers(); accepted["outbox"] != n {
			t.Fatalf("broker down: want all %d accepted into the outbox; %s", n, l.Summary())
		}
	}
	st := meshtest.Status(t, alpha.HTTPURL())
	if st.Outbox.Depth != 2*n {
		t.Fatalf("outbox before the upgrade: got depth %d, want %d", st.Outbox.Depth, 2*n)
	}
	nc.Close()

	// The upgrade: stop gracefully, replace the binary, start on the same data.
	alpha.Signal(syscall.SIGTERM)
	if code := alpha.Wait(); code != 0 {
		t.Fatalf("alpha stopped for the upgrade with exit code %d, want 0", code)
	}
	alpha = meshtest.StartBinary(t, newBin, nil, meshNodeArgs(t, "alpha", alphaURL, bridgeConfig{}, "--data", alphaData)...)
	st = meshtest.Status(t, alpha.HTTPURL())
	if st.Version != newVersion || st.Outbox.Depth != 2*n {
		t.Fatalf("after the upgrade: got version %q outbox depth %d, want %q and %d", st.Version, st.Outbox.Depth, newVersion, 2*n)
	}

	// The broker returns: the outbox drains, nothing lost.
	px.Restore(t)
	if !meshtest.Poll(3*time.Minute, func() bool { return len(cmds.Check().Lost) == 0 && len(evts.Check().Lost) == 0 }) {
		t.Fatalf("after 3m: %d commands and %d events not delivered", len(cmds.Check().Lost), len(evts.Check().Lost))
	}
	meshtest.WaitStatus(t, alpha.HTTPURL(), time.Minute, "upgraded alpha's outbox empty", func(s appliance.Status) bool {
		return s.Broker.State == "connected" && s.Outbox.Depth == 0
	})
	time.Sleep(time.Second) // real time is the thing under test: room for duplicates to arrive
	for kind, h := range map[string]*ledger.History{"commands": cmds, "events": evts} {
		r := h.Check()
		if !r.Valid() {
			t.Errorf("%s: lost %d, unmarked duplicates %d, unexpected %d; want 0 each:\n%s",
				kind, len(r.Lost), len(r.DupUnmarked), len(r.Unexpected), r)
		}
	}

	// Half upgraded: beta (old build) shows alpha's new version, in its
	// status and in meshbox nodes.
	meshtest.WaitStatus(t, beta.HTTPURL(), 30*time.Second, "beta sees alpha's new version", func(s appliance.Status) bool {
		return upVersion(s, "alpha") == newVersion && s.Version == oldVersion
	})
	nodes := exec.Command(oldBin, "nodes", "--server", beta.NATSURL())
	nodes.Env = append(os.Environ(), "MESHBOX_DATA="+beta.DataDir()) // its admin credential
	out, err := nodes.CombinedOutput()
	if err != nil {
		t.Fatalf("meshbox nodes: %v\n%s", err, out)
	}
	found := false
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == "alpha" {
			found = strings.Contains(l, newVersion)
		}
	}
	if !found {
		t.Errorf("meshbox nodes on beta: alpha's line lacks %s:\n%s", newVersion, out)
	}
}
