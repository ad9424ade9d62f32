package doctor

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/internal/wire"
)

// TestDoctorTakesTheRunningNodesWord: while the node runs and holds its
// cache, doctor has neither the bindings nor a broker connection of its
// own; the node's status says what it uses, and doctor reports that
// instead of "not checked" or "no cached bindings".
func TestDoctorTakesTheRunningNodesWord(t *testing.T) {
	d := newDoctor(t, t.TempDir())
	connected := bridge.BrokerStatus{LinkStatus: bridge.LinkStatus{State: wire.StateConnected, URL: "amqp://node.attic.g2:xxxxx@broker.example.org:5672/mesh",
		Credential: &bridge.CredentialStatus{User: "node.attic.g2", Generation: 2, State: "in use"}}}
	d.status = &appliance.Status{Node: "attic", PublicName: "attic.example.org", Broker: connected,
		Bindings: cache.Status{Source: cache.SourceDB, DB: cache.DBConnected}}
	if err := os.WriteFile(d.hostsFile, []byte("127.0.0.1 localhost\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		check  func(context.Context) Check
		status string
		want   string
	}{
		{d.checkCredential, OK, "the running node connects as its own broker user node.attic.g2 (generation 2)"},
		{d.checkHostsFile, OK, "public name attic.example.org is not pinned"},
		{d.checkMeshNames, OK, "broker.example.org"},
	} {
		c := tc.check(context.Background())
		if c.Status != tc.status || !strings.Contains(c.Message, tc.want) {
			t.Errorf("%s: got %s %q, want %s saying %q", c.Name, c.Status, c.Message, tc.status, tc.want)
		}
	}
	if err := os.WriteFile(d.hostsFile, []byte("127.0.1.1 attic.example.org attic\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if c := d.checkHostsFile(context.Background()); c.Status != Fail || !strings.Contains(c.Message, "from the running node's record") {
		t.Errorf("hosts file pinning the node's public name: got %s %q, want fail", c.Status, c.Message)
	}

	// Another node's user, a refused credential, a shared user.
	d.status.Broker.Credential = &bridge.CredentialStatus{User: "node.garage.g1", Generation: 1, State: "in use"}
	if c := d.checkCredential(context.Background()); c.Status != Fail || !strings.Contains(c.Message, "node garage's") {
		t.Errorf("another node's user: got %s %q, want fail naming garage", c.Status, c.Message)
	}
	d.status.Broker.Credential = &bridge.CredentialStatus{User: "node.attic.g2", State: bridge.CredentialRevoked, Reason: "403"}
	if c := d.checkCredential(context.Background()); c.Status != Fail || !strings.Contains(c.Message, bridge.CredentialRevoked) {
		t.Errorf("revoked: got %s %q, want fail", c.Status, c.Message)
	}
	d.status.Broker.Credential = nil
	d.status.Broker.URL = "amqp://broker.example.org:5672/mesh"
	if c := d.checkCredential(context.Background()); c.Status != Warn || !strings.Contains(c.Message, `connects as "guest"`) {
		t.Errorf("no user of its own: got %s %q, want warn naming guest", c.Status, c.Message)
	}

	// The database: doctor cannot log in with the configured URL, the
	// node is connected with its own login.
	d.cfg.DB = "postgres://mesh@127.0.0.1:1/mesh"
	if c := d.checkDatabase(context.Background()); c.Status != Warn || !strings.Contains(c.Message, "the running node is connected to the mesh database") {
		t.Errorf("database: got %s %q, want warn with the node's word", c.Status, c.Message)
	}
	d.status = nil
	if c := d.checkDatabase(context.Background()); c.Status != Fail {
		t.Errorf("database, no node: got %s %q, want fail", c.Status, c.Message)
	}
	if c := d.checkCredential(context.Background()); c.Status != OK || !strings.Contains(c.Message, "not checked") {
		t.Errorf("credential, no node and no connection: got %s %q, want not checked", c.Status, c.Message)
	}
}
