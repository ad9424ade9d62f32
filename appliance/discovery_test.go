package appliance

import (
	"context"
	"testing"
	"time"

	"github.com/meshbox/meshbox/testing/wait"
)

// A standalone node (no broker) fails the discovery messages of its start
// and then sends nothing until a link connects: it does not wake at every
// heartbeat and probe to fail a publish.
func TestStandaloneDiscoveryWaitsForTheLink(t *testing.T) {
	cfg := localConfig("alpha", t.TempDir())
	cfg.Mesh.HeartbeatInterval = Duration(10 * time.Millisecond)
	cfg.Mesh.DiscoveryInterval = Duration(10 * time.Millisecond)
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	failed := func() float64 {
		t.Helper()
		mfs, err := a.tel.registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "meshbox_discovery_errors_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "op" && l.GetValue() == "publish" {
						return m.GetCounter().GetValue()
					}
				}
			}
		}
		return 0
	}
	wait.For(t, 10*time.Second, "the hello's failed discovery publish", func() bool { return failed() > 0 })
	// Real time is the thing under test: 50 heartbeat intervals pass.
	time.Sleep(500 * time.Millisecond)
	if got := failed(); got > 4 {
		t.Fatalf("failed discovery publishes after 50 heartbeat intervals without a broker: got %v, want the start's few (at most 4)", got)
	}
}
