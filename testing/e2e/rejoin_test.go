package e2e

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// TestNodeRejoin gives a node locked out by `rotate --force` a new join
// token with `mesh node rejoin`: its older generations are revoked, its
// bindings (here an override) stay, and the node joined again on the same
// machine comes back on the new generation. Its cache holds the database
// role of generation 2, dropped since: it tries that role, is refused,
// says so once and logs in as the new join's role. Bad input is refused
// with a clear error.
func TestNodeRejoin(t *testing.T) {
	t.Parallel()
	m := newIdentityMesh(t, "bee")
	if code, out, errOut := cliEnv(t, m.admin, "mesh", "override", "set", "bee", "thumbs", "size", "64"); code != 0 {
		t.Fatalf("override set: exit %d: %s%s", code, out, errOut)
	}
	m.lockOut(t, "bee")

	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"nobody"}, `node "nobody"`},
		{[]string{"bee", "--ttl", "0s"}, "--ttl 0s: must be more than 0"},
		{[]string{"no.dots"}, "no.dots"},
		{[]string{"hub"}, "--record-only"}, // init's node: a record without an identity
	} {
		code, out, errOut := cliEnv(t, m.admin, append([]string{"mesh", "node", "rejoin"}, bad.args...)...)
		if code == 0 || !strings.Contains(errOut, bad.want) {
			t.Errorf("rejoin %v: exit %d, stderr %q; want an error naming %q", bad.args, code, errOut, bad.want)
		}
		if strings.Contains(out, "join token") {
			t.Errorf("rejoin %v printed a join token:\n%s", bad.args, out)
		}
	}
	if got := m.generations(t, "bee"); len(got) != 1 || got[0] != 3 {
		t.Fatalf("bee's broker users after the refused rejoins: %v, want [3]", got)
	}

	code, out, errOut := cliEnv(t, m.admin, "mesh", "node", "rejoin", "bee")
	t.Logf("rejoin:\n%s%s", out, errOut)
	if code != 0 {
		t.Fatalf("rejoin bee: exit %d", code)
	}
	for _, want := range []string{"node bee: generation 4", "node bee: generation 3 revoked", "rejoin complete"} {
		if !strings.Contains(out, want) {
			t.Errorf("rejoin output lacks %q", want)
		}
	}
	if got := m.generations(t, "bee"); len(got) != 1 || got[0] != 4 {
		t.Errorf("bee's broker users after rejoin: %v, want [4]", got)
	}
	if code, out, errOut := cli(t, "join", joinToken(t, out), "--env-file", m.envs["bee"], "--force"); code != 0 {
		t.Fatalf("join bee again: exit %d: %s%s", code, out, errOut)
	}
	bee := m.start(t, "bee")
	waitIdentity(t, bee.HTTPURL(), "bee on generation 4", func(s appliance.Status) bool {
		return s.Identity.Generation == 4 && s.Identity.State == "in use"
	})
	var st appliance.Status
	if !meshtest.Poll(30*time.Second, func() bool {
		st = meshtest.Status(t, bee.HTTPURL())
		return st.Bindings.DB == "connected" && st.Bindings.Source == "db"
	}) {
		t.Fatalf("bee after rejoin: bindings from %q, database %q; want them from the database", st.Bindings.Source, st.Bindings.DB)
	}
	if n := strings.Count(bee.Output(), "the database refused the login this node had cached"); n != 1 {
		t.Errorf("bee logged %d lines about its refused cached database login, want 1:\n%s", n, bee.Output())
	}
	if code, out, errOut := cliEnv(t, m.admin, "mesh", "override", "list", "--node", "bee"); code != 0 || !strings.Contains(out, "size") {
		t.Errorf("bee's overrides after rejoin: exit %d: %s%s; want the override kept", code, out, errOut)
	}
}

// lockOut runs node, rotates its credential while it runs (its cache then
// holds generation 2 with a database role of its own), stops it, and
// rotates again with --force: generation 2 is revoked, its role dropped,
// and the node is locked out.
func (m *identityMesh) lockOut(t *testing.T, node string) {
	t.Helper()
	p := m.start(t, node)
	if code, out, errOut := m.rotate(t, node, "--wait", "1m"); code != 0 {
		t.Fatalf("rotate %s: exit %d: %s%s", node, code, out, errOut)
	}
	waitIdentity(t, p.HTTPURL(), node+" on generation 2", func(s appliance.Status) bool {
		return s.Identity.Generation == 2 && s.Identity.State == "in use"
	})
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(); code != 0 {
		t.Fatalf("%s stopped with exit %d", node, code)
	}
	if code, out, errOut := m.rotate(t, node, "--wait", "2s", "--force"); code != 0 {
		t.Fatalf("rotate --force with %s offline: exit %d: %s%s", node, code, out, errOut)
	}
}
