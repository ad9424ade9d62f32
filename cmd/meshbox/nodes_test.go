package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/node"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
	"github.com/nats-io/nats.go"
)

// fakeMeshAPI serves $MESH.peers and $MESH.caps with fixed answers on an
// embedded NATS server and returns its URL.
func fakeMeshAPI(t *testing.T, peers node.PeersReply, caps node.CapsReply) string {
	t.Helper()
	srv := natstest.Start(t)
	nc := natstest.ConnectTCP(t, srv)
	for subj, v := range map[string]any{node.SubjectPeers: peers, node.SubjectCaps: caps} {
		data, _ := json.Marshal(v)
		if _, err := nc.Subscribe(subj, func(m *nats.Msg) { _ = m.Respond(data) }); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return srv.ClientURL()
}

func TestNodesAndCapsCommands(t *testing.T) {
	now := time.Now().UTC()
	peers := node.PeersReply{Node: "A", Peers: []node.Peer{
		{Name: "B", State: node.StateUp, Expected: true, Since: now.Add(-time.Minute), LastSeen: now.Add(-2 * time.Second),
			Version: "1.2.0", Revision: 7, StartedAt: now.Add(-time.Hour), Capabilities: []string{"echo", "x"}, Stages: []string{"thumb"}},
		{Name: "C", State: node.StateGone, Since: now.Add(-30 * time.Second), LastSeen: now.Add(-45 * time.Second),
			Reason: "missed 3 heartbeats", Capabilities: []string{}, Stages: []string{}},
		{Name: "D", State: node.StateAbsent, Expected: true, Since: now.Add(-time.Hour), Capabilities: []string{}, Stages: []string{}},
	}}
	caps := node.CapsReply{Node: "A", Capabilities: node.Capabilities{
		Local: []string{"echo"}, Remote: map[string][]string{"echo": {"B"}, "x": {"B"}},
		LocalStages: []string{}, RemoteStages: map[string][]string{"thumb": {"B"}},
	}}
	url := fakeMeshAPI(t, peers, caps)
	c := cli{env: map[string]string{"MESHBOX_SERVER": url}}

	out := c.ok(t, "nodes")
	for _, want := range []string{
		"node A: 3 peers (1 up, 1 gone, 1 expected-but-absent)",
		"NODE", "LAST SEEN",
		"B", "up", "2s ago", "1.2.0", "echo, x", "thumb",
		"gone (missed 3 heartbeats)", "45s ago",
		"expected-but-absent", "never",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("meshbox nodes: output lacks %q:\n%s", want, out)
		}
	}

	// Every peer's version, so a half-upgraded mesh shows; a peer that
	// advertised none (older than version advertising) shows "unknown".
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		want := map[string]string{"B": "1.2.0", "C": "unknown", "D": "unknown"}[f[0]]
		if want != "" && !slices.Contains(f, want) {
			t.Errorf("meshbox nodes: line of %s lacks version %q: %q", f[0], want, l)
		}
	}

	out = c.ok(t, "nodes", "--json")
	var gotPeers node.PeersReply
	if err := json.Unmarshal([]byte(out), &gotPeers); err != nil {
		t.Fatalf("meshbox nodes --json: %v\n%s", err, out)
	}
	if gotPeers.Node != "A" || len(gotPeers.Peers) != 3 || gotPeers.Peers[2].State != node.StateAbsent {
		t.Fatalf("meshbox nodes --json: got %+v", gotPeers)
	}

	out = c.ok(t, "caps", "--server", url)
	for _, want := range []string{"CAPABILITY", "LOCAL", "REMOTE", "STAGE", "thumb"} {
		if !strings.Contains(out, want) {
			t.Errorf("meshbox caps: output lacks %q:\n%s", want, out)
		}
	}
	lines := strings.Split(out, "\n")
	row := func(name string) []string {
		for _, l := range lines {
			if f := strings.Fields(l); len(f) > 0 && f[0] == name {
				return f
			}
		}
		t.Fatalf("meshbox caps: no row for %s:\n%s", name, out)
		return nil
	}
	if f := row("echo"); strings.Join(f[1:], " ") != "yes B" {
		t.Errorf("echo row: got %v, want local yes, remote B", f)
	}
	if f := row("x"); strings.Join(f[1:], " ") != "- B" {
		t.Errorf("x row: got %v, want local -, remote B", f)
	}

	out = c.ok(t, "caps", "--json")
	var gotCaps node.CapsReply
	if err := json.Unmarshal([]byte(out), &gotCaps); err != nil {
		t.Fatalf("meshbox caps --json: %v\n%s", err, out)
	}
	if len(gotCaps.Remote["x"]) != 1 || gotCaps.Local[0] != "echo" {
		t.Fatalf("meshbox caps --json: got %+v", gotCaps)
	}

	c.fails(t, "takes no arguments", "nodes", "extra")
	c.fails(t, "cannot reach the node", "caps", "--server", "nats://127.0.0.1:1")
}

func TestNodesWithoutPeers(t *testing.T) {
	url := fakeMeshAPI(t, node.PeersReply{Node: "solo", Peers: []node.Peer{}},
		node.CapsReply{Node: "solo", Capabilities: node.Capabilities{Local: []string{}, Remote: map[string][]string{}}})
	c := cli{env: map[string]string{"MESHBOX_SERVER": url}}
	if out := c.ok(t, "nodes"); !strings.Contains(out, "node solo has no peers") {
		t.Fatalf("meshbox nodes: got %q", out)
	}
	if out := c.ok(t, "caps"); !strings.Contains(out, "no capabilities hosted on node solo") {
		t.Fatalf("meshbox caps: got %q", out)
	}
}

func TestAgo(t *testing.T) {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		t    time.Time
		want string
	}{
		{time.Time{}, "never"},
		{now, "0s ago"},
		{now.Add(-1500 * time.Millisecond), "2s ago"},
		{now.Add(-90 * time.Minute), "2h0m0s ago"},
		{now.Add(5 * time.Second), "0s ago"},
	}
	for _, tt := range tests {
		if got := ago(now, tt.t); got != tt.want {
			t.Errorf("ago(%v): got %q, want %q", tt.t, got, tt.want)
		}
	}
}
