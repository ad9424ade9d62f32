package nodecred_test

import (
	"context"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/cache/meshdb/nodecred"
)

// TestRotateAll: every node gets generation 2, Rotate reports whom it
// waits for and each switch, and revokes generation 1 of each once it
// switched, dropping its old exchange.
func TestRotateAll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMesh(t)
		m.node("ant", time.Second, 1)
		m.node("bee", 3*time.Second, 1)
		rotated, err := m.r.Rotate(t.Context(), nodecred.RotateOptions{Wait: 25 * time.Second})
		if err != nil {
			t.Fatalf("Rotate: %v", err)
		}
		if !slices.Equal(rotated, []string{"ant", "bee"}) {
			t.Errorf("rotated: got %v, want [ant bee]", rotated)
		}
		m.wantSteps(t,
			"create ant g2 (node.ant.g2, role_ant_2) rev 1",
			"create bee g2 (node.bee.g2, role_bee_2) rev 2",
			"waiting at +0s for ant g2 since +0s, bee g2 since +0s, 25s left",
			"switched ant g2 at +1s",
			"switched bee g2 at +3s",
			"revoke ant g1 roles [role_ant_1]",
			"revoke bee g1 roles [role_bee_1]",
		)
		m.wantUsers(t, "ant", 2)
		m.wantUsers(t, "bee", 2)
		if !slices.Equal(m.broker.dropped, []string{"ant", "bee"}) {
			t.Errorf("old exchanges dropped: got %v, want [ant bee]", m.broker.dropped)
		}
		if time.Since(m.start) > 4*time.Second {
			t.Errorf("Rotate took %s after the last switch at 3s, want less than one more second", time.Since(m.start))
		}
	})
}

// TestRotateNotSwitched: a node that does not switch in time keeps both
// generations, the others are finished, and the error names it with since
// when it is waited for.
func TestRotateNotSwitched(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMesh(t)
		m.node("ant", time.Second, 1)
		m.node("bee", 0, 1) // offline: never switches
		_, err := m.r.Rotate(t.Context(), nodecred.RotateOptions{Wait: 25 * time.Second})
		if !errors.Is(err, nodecred.ErrNotSwitched) {
			t.Fatalf("Rotate: got %v, want ErrNotSwitched", err)
		}
		var ns *nodecred.NotSwitchedError
		if !errors.As(err, &ns) || len(ns.Nodes) != 1 || ns.Nodes[0] != (nodecred.Pending{Node: "bee", Generation: 2, Since: m.start}) {
			t.Errorf("Rotate: got %#v, want bee's generation 2 pending since the start", err)
		}
		want := "nodes did not switch to their new credential in time: bee (generation 2 waiting since " + m.start.UTC().Format(time.RFC3339) + ")"
		if err.Error() != want {
			t.Errorf("error: got %q, want %q", err, want)
		}
		m.wantSteps(t,
			"create ant g2 (node.ant.g2, role_ant_2) rev 1",
			"create bee g2 (node.bee.g2, role_bee_2) rev 2",
			"waiting at +0s for ant g2 since +0s, bee g2 since +0s, 25s left",
			"switched ant g2 at +1s",
			"waiting at +10s for bee g2 since +0s, 15s left",
			"waiting at +20s for bee g2 since +0s, 5s left",
			"revoke ant g1 roles [role_ant_1]",
		)
		m.wantUsers(t, "ant", 2)
		m.wantUsers(t, "bee", 1, 2)
		if !slices.Equal(m.broker.dropped, []string{"ant"}) {
			t.Errorf("old exchanges dropped: got %v, want [ant] (bee may still route through its own)", m.broker.dropped)
		}
	})
}

// TestRotateForce: with Force, a node that does not switch in time loses
// its older generations all the same, but keeps its old exchange.
func TestRotateForce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMesh(t)
		m.node("bee", 0, 1)
		rotated, err := m.r.Rotate(t.Context(), nodecred.RotateOptions{Node: "bee", Wait: 2 * time.Second, Force: true})
		if err != nil {
			t.Fatalf("Rotate: %v", err)
		}
		if !slices.Equal(rotated, []string{"bee"}) {
			t.Errorf("rotated: got %v, want [bee]", rotated)
		}
		m.wantSteps(t,
			"create bee g2 (node.bee.g2, role_bee_2) rev 1",
			"waiting at +0s for bee g2 since +0s, 2s left",
			"force bee g2",
			"revoke bee g1 roles [role_bee_1]",
		)
		m.wantUsers(t, "bee", 2)
		if len(m.broker.dropped) != 0 {
			t.Errorf("old exchanges dropped: got %v, want none", m.broker.dropped)
		}
	})
}

// TestRotateFinishesPending: when a rotation is pending, Rotate finishes
// it and starts no other: the other nodes are left for the next run.
func TestRotateFinishesPending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMesh(t)
		m.node("ant", time.Second, 1)
		bee := m.node("bee", time.Hour+2*time.Second, 1)
		// bee's generation 2, made an hour ago by a rotation that waited in vain.
		bee.gens = append(bee.gens, meshdb.CredentialGeneration{Node: "bee", Generation: 2, User: "node.bee.g2", CreatedAt: m.start.Add(-time.Hour)})
		m.broker.users["bee"] = []int{1, 2}
		m.node("cat", 0, 1, 2) // switched to 2, 1 not revoked yet

		rotated, err := m.r.Rotate(t.Context(), nodecred.RotateOptions{Wait: time.Minute})
		if err != nil {
			t.Fatalf("Rotate: %v", err)
		}
		if !slices.Equal(rotated, []string{"bee", "cat"}) {
			t.Errorf("rotated: got %v, want [bee cat]", rotated)
		}
		m.wantSteps(t,
			"skip ant",
			"resume bee g2 (node.bee.g2) older [1]",
			"resume cat g2 (node.cat.g2) older [1]",
			"waiting at +0s for bee g2 since +-1h0m0s, 1m0s left",
			"switched bee g2 at +2s",
			"revoke bee g1 roles [role_bee_1]",
			"revoke cat g1 roles [role_cat_1]",
		)
		m.wantUsers(t, "ant", 1)
		m.wantUsers(t, "bee", 2)
		m.wantUsers(t, "cat", 2)
	})
}

// TestRotateWithoutPublicKey: a node without a public key is not rotated
// (its new broker user is deleted again); the others are, and then Rotate
// fails naming it.
func TestRotateWithoutPublicKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMesh(t)
		m.node("ant", time.Second, 1)
		m.node("cat", time.Second, 1).hasKey = false
		_, err := m.r.Rotate(t.Context(), nodecred.RotateOptions{Wait: time.Minute})
		var keyless *nodecred.NoPublicKeyError
		if !errors.As(err, &keyless) || !slices.Equal(keyless.Nodes, []string{"cat"}) || !errors.Is(err, meshdb.ErrNoPublicKey) {
			t.Fatalf("Rotate: got %v, want a *NoPublicKeyError naming cat", err)
		}
		if want := "no public key yet: cat"; err.Error() != want {
			t.Errorf("error: got %q, want %q", err, want)
		}
		m.wantSteps(t,
			"create ant g2 (node.ant.g2, role_ant_2) rev 1",
			"not rotated cat: add credential generation: no public key yet",
			"waiting at +0s for ant g2 since +0s, 1m0s left",
			"switched ant g2 at +1s",
			"revoke ant g1 roles [role_ant_1]",
		)
		m.wantUsers(t, "ant", 2)
		m.wantUsers(t, "cat", 1)
	})
}

// TestRotateChecks: the checks fail before anything changes, and without
// connecting to the broker.
func TestRotateChecks(t *testing.T) {
	for _, c := range []struct {
		name    string
		node    string
		wantErr func(error) bool
		want    string
	}{
		{"unknown node", "nobody", func(err error) bool {
			var nf *meshdb.NotFoundError
			return errors.Is(err, nodecred.ErrUnknownNode) && errors.As(err, &nf)
		}, `node "nobody" not found`},
		{"not a node name", "no.dots", func(err error) bool { return err != nil && !errors.Is(err, nodecred.ErrUnknownNode) }, "no.dots"},
		{"node without a credential", "hub", func(err error) bool { return errors.Is(err, nodecred.ErrNoCredential) }, `node "hub": no credential of its own`},
		{"no node with a credential", "", func(err error) bool { return err == nil }, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newMesh(t)
			m.node("hub", 0)
			rotated, err := m.r.Rotate(t.Context(), nodecred.RotateOptions{Node: c.node, Wait: time.Minute})
			if !c.wantErr(err) || (c.want != "" && !strings.Contains(err.Error(), c.want)) {
				t.Errorf("Rotate(%q): got %v, want an error saying %q", c.node, err, c.want)
			}
			if len(rotated) != 0 {
				t.Errorf("rotated: got %v, want none", rotated)
			}
			if m.connects != 0 || len(m.steps) != 0 {
				t.Errorf("got %d connects and steps %v, want none", m.connects, m.steps)
			}
		})
	}
}

// TestRotateConnectFails: Rotate returns the error of Connect as it is.
func TestRotateConnectFails(t *testing.T) {
	m := newMesh(t)
	m.node("ant", 0, 1)
	m.r.Connect = func(context.Context) (nodecred.Broker, error) { return nil, errBoom }
	if _, err := m.r.Rotate(t.Context(), nodecred.RotateOptions{Node: "ant"}); err != errBoom {
		t.Errorf("Rotate: got %v, want the error of Connect", err)
	}
	m.wantUsers(t, "ant", 1)
}

// TestRotateUndoesBrokerUser: a generation whose database row cannot be
// written loses its broker user again, even when ctx is done by then; a
// failure to delete it is in the error.
func TestRotateUndoesBrokerUser(t *testing.T) {
	t.Run("deleted", func(t *testing.T) {
		m := newMesh(t)
		m.node("ant", 0, 1)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		m.db.failAdd, m.db.onAdd = errBoom, cancel
		_, err := m.r.Rotate(ctx, nodecred.RotateOptions{Node: "ant", Wait: time.Minute})
		if !errors.Is(err, errBoom) || err.Error() != "node ant: boom" {
			t.Errorf("Rotate: got %v, want node ant: boom", err)
		}
		m.wantUsers(t, "ant", 1)
		m.wantSteps(t)
	})
	t.Run("delete fails", func(t *testing.T) {
		m := newMesh(t)
		m.node("ant", 0, 1)
		m.db.failAdd = errBoom
		m.broker.failDelete["ant/2"] = errors.New("no management API")
		_, err := m.r.Rotate(t.Context(), nodecred.RotateOptions{Node: "ant", Wait: time.Minute})
		if want := "node ant: boom\nalso failed to delete broker user node.ant.g2: no management API"; err == nil || err.Error() != want {
			t.Errorf("Rotate: got %v, want %q", err, want)
		}
	})
	t.Run("create fails", func(t *testing.T) {
		m := newMesh(t)
		m.node("ant", 0, 1)
		m.broker.failCreate = errBoom
		_, err := m.r.Rotate(t.Context(), nodecred.RotateOptions{Node: "ant", Wait: time.Minute})
		if err == nil || err.Error() != "node ant: boom" {
			t.Errorf("Rotate: got %v, want node ant: boom", err)
		}
		m.wantUsers(t, "ant", 1)
	})
	t.Run("stages unreadable", func(t *testing.T) {
		m := newMesh(t)
		m.node("ant", 0, 1)
		m.db.failStages = errBoom
		if _, err := m.r.Rotate(t.Context(), nodecred.RotateOptions{Node: "ant", Wait: time.Minute}); err != errBoom {
			t.Errorf("Rotate: got %v, want the error of NodeStages as it is", err)
		}
		m.wantUsers(t, "ant", 1)
	})
}

// TestRotateRevokeFails: what cannot be revoked is a *RevokeError naming
// each node and step; the rest is revoked all the same.
func TestRotateRevokeFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMesh(t)
		m.node("ant", time.Second, 1)
		m.node("bee", time.Second, 1)
		m.node("cat", time.Second, 1)
		m.broker.failDelete["ant/1"] = errors.New("user busy")
		m.db.failDelete["bee/1"] = errors.New("database gone")
		m.broker.failDrop = errors.New("exchange busy")
		_, err := m.r.Rotate(t.Context(), nodecred.RotateOptions{Wait: time.Minute})
		var re *nodecred.RevokeError
		if !errors.As(err, &re) {
			t.Fatalf("Rotate: got %v, want a *RevokeError", err)
		}
		want := strings.Join([]string{
			"node ant: revoke generation 1: user busy",
			"node ant: exchange busy",
			"node bee: revoke generation 1 in the database: database gone",
			"node bee: exchange busy",
			"node cat: exchange busy",
		}, "\n")
		if err.Error() != want {
			t.Errorf("error:\ngot  %s\nwant %s", err, want)
		}
		m.wantUsers(t, "cat", 2)
		if got := m.broker.users["bee"]; !slices.Equal(got, []int{2}) {
			t.Errorf("bee's broker users: got %v, want [2]", got)
		}
		if got := m.db.generations("bee"); !slices.Equal(got, []int{1, 2}) {
			t.Errorf("bee's generations in the database: got %v, want [1 2] (the next run revokes 1 again)", got)
		}
	})
}

// TestRotateReadError: a failed look while waiting is reported, and the
// next look finds the switch.
func TestRotateReadError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMesh(t)
		m.node("ant", 100*time.Millisecond, 1)
		m.db.failRead[2] = errBoom // 1 is reading the targets, 2 the first look
		if _, err := m.r.Rotate(t.Context(), nodecred.RotateOptions{Node: "ant", Wait: time.Minute}); err != nil {
			t.Fatalf("Rotate: %v", err)
		}
		m.wantSteps(t,
			"create ant g2 (node.ant.g2, role_ant_2) rev 1",
			"read error: boom",
			"waiting at +0s for ant g2 since +0s, 1m0s left",
			"switched ant g2 at +100ms",
			"revoke ant g1 roles [role_ant_1]",
		)
	})
}

// TestRotateCancelled: a cancelled wait ends at once, and the nodes that
// did not switch keep their older generations.
func TestRotateCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMesh(t)
		m.node("bee", 0, 1)
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		_, err := m.r.Rotate(ctx, nodecred.RotateOptions{Node: "bee", Wait: time.Hour})
		if !errors.Is(err, nodecred.ErrNotSwitched) {
			t.Errorf("Rotate: got %v, want ErrNotSwitched", err)
		}
		if d := time.Since(m.start); d != 3*time.Second {
			t.Errorf("Rotate returned after %s, want 3s (when ctx was done)", d)
		}
		m.wantUsers(t, "bee", 1, 2)
	})
}

// TestNeedsNoRuntime: the package is an admin tool: it does not import the
// runtime (bridge, appliance, node).
func TestNeedsNoRuntime(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	for _, runtime := range []string{"bridge", "appliance", "node"} {
		if slices.Contains(deps, "github.com/meshbox/meshbox/"+runtime) {
			t.Errorf("nodecred imports the runtime (%s)", runtime)
		}
	}
	for _, want := range []string{"bridge/brokeradmin", "cache/meshdb"} {
		if !slices.Contains(deps, "github.com/meshbox/meshbox/"+want) {
			t.Errorf("nodecred does not import %s:\n%s", want, out)
		}
	}
}
