package e2e

import (
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// TestRotateForceRevokesOfflineNode rotates a stopped node with --force:
// rotate does not wait for it, revokes its old credential and finishes.
// Started again on what it knew (its cached bindings: the revoked
// generation), the node says its credential was revoked — in its status,
// a metric and one log line — and keeps serving local work.
func TestRotateForceRevokesOfflineNode(t *testing.T) {
	t.Parallel()
	m := newIdentityMesh(t, "bee")
	bee := m.start(t, "bee")
	waitIdentity(t, bee.HTTPURL(), "bee on generation 1", func(s appliance.Status) bool {
		return s.Identity.Generation == 1 && s.Identity.State == "in use"
	})
	// Only bindings that record its switch tell bee, when it comes back,
	// that the broker accepted generation 1 before.
	m.waitSwitchKnown(t, bee, "bee", 1)
	bee.Signal(syscall.SIGTERM)
	if code := bee.Wait(); code != 0 {
		t.Fatalf("bee stopped with exit %d", code)
	}

	code, out, errOut := m.rotate(t, "bee", "--wait", "2s", "--force")
	t.Logf("rotate --force:\n%s%s", out, errOut)
	if code != 0 {
		t.Fatalf("rotate --force with bee offline: exit %d, want 0", code)
	}
	for _, want := range []string{"node bee: has not switched to generation 2; revoking its older generations anyway (--force)",
		"node bee: generation 1 revoked", "rotation complete"} {
		if !strings.Contains(out, want) {
			t.Errorf("rotate --force output lacks %q", want)
		}
	}
	if got := m.generations(t, "bee"); !slices.Equal(got, []int{2}) {
		t.Errorf("bee's broker users after rotate --force: %v, want [2]", got)
	}

	// bee comes back with the credential it had: refused by the broker,
	// and it says so.
	bee = meshtest.StartProcess(t, "--env-file", m.envs["bee"], "--data", m.data["bee"])
	nc := natsConn(t, bee)
	if _, err := nc.Subscribe("cap.local", func(msg *nats.Msg) { _ = msg.Respond([]byte("here")) }); err != nil {
		t.Fatal(err)
	}
	flush(t, nc)
	st := waitIdentity(t, bee.HTTPURL(), "bee says its credential was revoked", func(s appliance.Status) bool {
		return s.Identity.State == "credential revoked"
	})
	if st.Identity.BrokerUser != "node.bee.g1" {
		t.Errorf("revoked identity: broker user %q, want node.bee.g1 (the one it had)", st.Identity.BrokerUser)
	}
	if v, _ := scrape(t, bee.HTTPURL()).value("meshbox_broker_credential_revoked"); v != 1 {
		t.Errorf("meshbox_broker_credential_revoked: got %v, want 1", v)
	}
	resp, err := nc.Request("cap.local", nil, 5*time.Second)
	if err != nil || string(resp.Data) != "here" {
		t.Errorf("local call while the credential is revoked: got %v, %v; want here", resp, err)
	}
	// The link keeps trying; the revocation is logged once.
	failures := func() float64 { v, _ := scrape(t, bee.HTTPURL()).value("meshbox_errors_total", "kind=link"); return v }
	f0 := failures()
	if !meshtest.Poll(30*time.Second, func() bool { return failures() >= f0+2 }) {
		t.Errorf("link failures: %v, want at least %v (the link keeps trying)", failures(), f0+2)
	}
	if n := strings.Count(bee.Output(), "broker credential revoked"); n != 1 {
		t.Errorf("got %d log lines about the revoked credential, want 1:\n%s", n, bee.Output())
	}
}
