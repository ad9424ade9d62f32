package rows_test

import (
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// ringOf is a keyring holding the mesh's key and, for a member, scope
// vault's key; members are the scope's members.
func ringOf(t *testing.T, mesh, vault seal.ContentKey, member bool, members ...string) *seal.Keyring {
	t.Helper()
	keys := []seal.ContentKey{mesh}
	sc := seal.Scopes{Current: map[string]string{}, Member: map[string]bool{}, Members: map[string][]string{"vault": members}}
	if member {
		keys = append(keys, vault)
		sc.Current["vault"], sc.Member["vault"] = vault.ID, true
	}
	r, err := seal.NewKeyring(nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetScoped(keys, mesh.ID, sc); err != nil {
		t.Fatal(err)
	}
	return r
}

// gamma, a member of scope vault, writes a row of the scoped table and is
// removed from the mesh. beta, joining after, applies it with alpha's:
// a removed node's broker users are revoked, so what its validated user
// published in the log it published as a member. The attack beside it:
// delta, for which gamma is still a node of the mesh but outside the
// scope (one removed from a scope keeps its older keys), refuses the
// same change as wrong_scope.
func TestARemovedMembersChangesConverge(t *testing.T) {
	if testing.Short() {
		t.Skip("uses RabbitMQ")
	}
	t.Parallel()
	rmq := meshtest.LeaseRabbitMQ(t)
	vhost := rmq.Vhost(t)
	urls := nodeUsers(t, rmq, vhost, "alpha", "beta", "gamma", "delta")
	meshKey, vault := seal.NewContentKey(), seal.NewContentKey()
	vault.Scope = "vault"
	vaultOnly := map[string]rows.TableSpec{"vault": {Scope: "vault"}}

	a := startNode(t, "alpha", urls["alpha"], ringOf(t, meshKey, vault, true, "alpha", "beta", "gamma"), t.TempDir(), 1000)
	defer a.e.Close()
	a.e.SetNodes([]string{"alpha", "beta", "gamma", "delta"})
	a.e.SetTables(vaultOnly)
	if _, err := a.e.Put("vault", "by-alpha", map[string][]byte{"n": []byte("alpha")}, nil); err != nil {
		t.Fatal(err)
	}
	waitSynced(t, a, "vault", "alpha's write in the log")
	vs, err := ringOf(t, meshKey, vault, true, "alpha", "beta", "gamma").SealerFor("vault")
	if err != nil {
		t.Fatal(err)
	}
	publishLog(t, urls["gamma"], "vault", vs.ID(), wire.BrokerUser("gamma", 1),
		rows.SealedBatch(vs, "vault", "gamma", "", 0, 0, []rows.Change{change("vault", "by-gamma", "gamma", "gamma", 0)}))
	meshtest.WaitFor(t, 30*time.Second, "alpha applying gamma's change, a member's", func() bool {
		return string(cellOf(t, a.e, "vault", "by-gamma").Value) == "gamma"
	})

	// gamma is removed: beta, joining, holds both rows and refuses nothing.
	b := startNode(t, "beta", urls["beta"], ringOf(t, meshKey, vault, true, "alpha", "beta"), t.TempDir(), 1000)
	defer b.e.Close()
	b.e.SetNodes([]string{"alpha", "beta", "delta"})
	b.e.SetTables(vaultOnly)
	meshtest.WaitFor(t, 30*time.Second, "beta holding alpha's rows", func() bool {
		return same(stateOf(t, b.e, "vault"), stateOf(t, a.e, "vault"))
	})
	if st := tableStatus(t, b.e, "vault"); len(st.Refused) > 0 || st.Alarm != "" {
		t.Errorf("beta refused %v (%s), want nothing", st.Refused, st.Alarm)
	}

	// delta sees gamma in the mesh, outside the scope: refused.
	d := startNode(t, "delta", urls["delta"], ringOf(t, meshKey, vault, true, "alpha", "beta", "delta"), t.TempDir(), 1000)
	defer d.e.Close()
	d.e.SetNodes([]string{"alpha", "beta", "gamma", "delta"})
	d.e.SetTables(vaultOnly)
	meshtest.WaitFor(t, 30*time.Second, "delta refusing gamma's change and holding alpha's", func() bool {
		return tableStatus(t, d.e, "vault").Refused["wrong_scope"] == 1 && string(cellOf(t, d.e, "vault", "by-alpha").Value) == "alpha"
	})
	if c := cellOf(t, d.e, "vault", "by-gamma"); c.Value != nil {
		t.Errorf("delta holds gamma's row: %+v", c)
	}
}
