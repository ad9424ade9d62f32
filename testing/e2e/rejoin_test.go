package e2e

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRejoinAfterRemove follows the README's way back for a node locked
// out by `rotate --force`: remove it, add it again and join with the new
// token on the same machine (the same data directory). The node had
// rotated before, so its cache holds a database role of a later
// generation, dropped since: it tries that role, is refused, says so
// once, and comes back on the new join's role and broker user.
func TestRejoinAfterRemove(t *testing.T) {
	m := newIdentityMesh(t, "bee")
	bee := m.start(t, "bee")
	if code, out, errOut := m.rotate(t, "bee", "--wait", "1m"); code != 0 {
		t.Fatalf("rotate bee: exit %d: %s%s", code, out, errOut)
	}
	waitIdentity(t, bee.HTTPURL(), "bee on generation 2", func(s identityStatus) bool {
		return s.Identity.Generation == 2 && s.Identity.State == "in use"
	})
	bee.Signal(syscall.SIGTERM)
	if code := bee.Wait(); code != 0 {
		t.Fatalf("bee stopped with exit %d", code)
	}
	if code, out, errOut := m.rotate(t, "bee", "--wait", "2s", "--force"); code != 0 {
		t.Fatalf("rotate --force with bee offline: exit %d: %s%s", code, out, errOut)
	}

	// The way back: remove, add, join again with the same env file.
	if code, out, errOut := cliEnv(t, m.admin, "mesh", "node", "remove", "bee", "--force"); code != 0 {
		t.Fatalf("remove bee: exit %d: %s%s", code, out, errOut)
	}
	code, out, errOut := cliEnv(t, m.admin, "mesh", "node", "add", "bee")
	if code != 0 {
		t.Fatalf("add bee again: exit %d: %s%s", code, out, errOut)
	}
	if code, out, errOut := cli(t, "join", joinToken(t, out), "--env-file", m.envs["bee"], "--force"); code != 0 {
		t.Fatalf("join bee again: exit %d: %s%s", code, out, errOut)
	}

	bee = m.start(t, "bee")
	waitIdentity(t, bee.HTTPURL(), "bee on the new join's generation 1", func(s identityStatus) bool {
		return s.Identity.Generation == 1 && s.Identity.State == "in use"
	})
	var st nodeStatus
	if !waitFor(30*time.Second, func() bool {
		st = getStatus(t, bee.HTTPURL())
		return st.Bindings.DB == "connected" && st.Bindings.Source == "db"
	}) {
		t.Fatalf("bee after joining again: bindings from %q, database %q; want them from the database:\n%s",
			st.Bindings.Source, st.Bindings.DB, bee.Output())
	}
	// It tried its cached role once, was refused, and said so once.
	if n := strings.Count(bee.Output(), "the database refused the login this node had cached"); n != 1 {
		t.Errorf("bee logged %d lines about its refused cached database login, want 1:\n%s", n, bee.Output())
	}
}

// TestNodeRejoin gives a node locked out by `rotate --force` a new join
// token with `mesh node rejoin`: its older generations are revoked, its
// bindings (here an override) stay, and the node joined again on the same
// machine comes back on the new generation. Bad input is refused with a
// clear error.
func TestNodeRejoin(t *testing.T) {
	m := newIdentityMesh(t, "bee")
	if code, out, errOut := cliEnv(t, m.admin, "mesh", "override", "set", "bee", "thumbs", "size", "64"); code != 0 {
		t.Fatalf("override set: exit %d: %s%s", code, out, errOut)
	}
	bee := m.start(t, "bee")
	if code, out, errOut := m.rotate(t, "bee", "--wait", "1m"); code != 0 {
		t.Fatalf("rotate bee: exit %d: %s%s", code, out, errOut)
	}
	waitIdentity(t, bee.HTTPURL(), "bee on generation 2", func(s identityStatus) bool {
		return s.Identity.Generation == 2 && s.Identity.State == "in use"
	})
	bee.Signal(syscall.SIGTERM)
	if code := bee.Wait(); code != 0 {
		t.Fatalf("bee stopped with exit %d", code)
	}
	if code, out, errOut := m.rotate(t, "bee", "--wait", "2s", "--force"); code != 0 {
		t.Fatalf("rotate --force with bee offline: exit %d: %s%s", code, out, errOut)
	}

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
	bee = m.start(t, "bee")
	waitIdentity(t, bee.HTTPURL(), "bee on generation 4", func(s identityStatus) bool {
		return s.Identity.Generation == 4 && s.Identity.State == "in use"
	})
	var st nodeStatus
	if !waitFor(30*time.Second, func() bool {
		st = getStatus(t, bee.HTTPURL())
		return st.Bindings.DB == "connected" && st.Bindings.Source == "db"
	}) {
		t.Fatalf("bee after rejoin: bindings from %q, database %q; want them from the database", st.Bindings.Source, st.Bindings.DB)
	}
	if code, out, errOut := cliEnv(t, m.admin, "mesh", "override", "list", "--node", "bee"); code != 0 || !strings.Contains(out, "size") {
		t.Errorf("bee's overrides after rejoin: exit %d: %s%s; want the override kept", code, out, errOut)
	}
}
