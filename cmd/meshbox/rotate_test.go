package main

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/cache/meshdb/nodecred"
)

// TestPrintCredentialStep: each step of rotate and rejoin prints as the
// lines the e2e tests and the manual read.
func TestPrintCredentialStep(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.FixedZone("CET", 3600))
	token := meshdb.JoinToken{DB: "postgres://role:pw@db/mesh", Node: "bee", ID: "id", Secret: "secret", Expires: at.Add(24 * time.Hour)}
	for _, c := range []struct {
		e    nodecred.Event
		want string
	}{
		{nodecred.Skipped{Node: "ant"}, "node ant: no rotation pending; not rotated now (run rotate again once the pending ones are finished)\n"},
		{nodecred.Resumed{Node: "bee", Generation: 2, User: "node.bee.g2", Older: []int{1}},
			"node bee: finishing the rotation to generation 2 (node.bee.g2); older generations [1] still valid\n"},
		{nodecred.NotRotated{Node: "cat", Err: errors.New("add credential generation: no public key yet")},
			"node cat: not rotated: add credential generation: no public key yet\n"},
		{nodecred.Created{Node: "ant", Generation: 2, User: "node.ant.g2", Role: "meshbox_node_ant_2", Revision: 7},
			"node ant: generation 2 (broker user node.ant.g2, database role meshbox_node_ant_2) created (mesh revision 7); the node takes it from its bindings\n"},
		{nodecred.Created{Node: "bee", Generation: 4, User: "node.bee.g4", Role: "meshbox_node_bee_4", Revision: 9, Token: &token},
			"node bee: generation 4 (broker user node.bee.g4, database role meshbox_node_bee_4) created (mesh revision 9)\n" +
				"join token for node bee (one use, expires 2026-03-02T11:00:00Z); on the node's machine run: meshbox join TOKEN --force\n" +
				token.Encode() + "\n"},
		{nodecred.ReadError{Err: errors.New("connection refused")}, "cannot read the credential generations (retrying): connection refused\n"},
		{nodecred.Switched{Node: "ant", Generation: 2, At: at}, "node ant: switched to generation 2 at 2026-03-01T11:00:00Z\n"},
		{nodecred.Waiting{Nodes: []nodecred.Pending{{Node: "ant", Generation: 2, Since: at}, {Node: "bee", Generation: 3, Since: at.Add(-time.Hour)}},
			At: at.Add(10*time.Second + 400*time.Millisecond), Left: 14*time.Second + 600*time.Millisecond},
			"waiting for ant (since 2026-03-01T11:00:00Z, 10s), bee (since 2026-03-01T10:00:00Z, 1h0m10s) to switch (at most 15s more)\n"},
		{nodecred.Forced{Node: "bee", Generation: 2}, "node bee: has not switched to generation 2; revoking its older generations anyway (--force)\n"},
		{nodecred.Revoked{Node: "ant", Generation: 1}, "node ant: generation 1 revoked (broker user deleted)\n"},
		{nodecred.Revoked{Node: "ant", Generation: 1, Database: meshdb.Revoked{Roles: []string{"r1", "r2"}, Lingering: 2}},
			"node ant: generation 1 revoked (broker user deleted, database role r1, r2 dropped; 2 of its sessions still run (ending them needs a superuser or pg_signal_backend))\n"},
		{nodecred.Revoked{Node: "ant", Generation: 1, Database: meshdb.Revoked{Roles: []string{"r1"}, Lingering: 1, EndErr: errors.New("permission denied")}},
			"node ant: generation 1 revoked (broker user deleted, database role r1 dropped; its sessions could not be ended: permission denied)\n"},
	} {
		var out strings.Builder
		printCredentialStep(&out, c.e)
		if out.String() != c.want {
			t.Errorf("%T:\ngot  %q\nwant %q", c.e, out.String(), c.want)
		}
	}
}
