package appliance_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// microAnswer is what meshbox.micro answers.
type microAnswer struct {
	Node      string            `json:"node"`
	Responses []json.RawMessage `json:"responses"`
}

// TestMicroCapabilityRights: meshbox.micro, the node's answer to a peer
// that lists its services, answers the node's administrator (and the
// bridge, for a peer) but not a program that has the right to call it
// ('>'): that program gets a refusal and no list. A service program that
// floods the node's discovery request with answers cannot crowd out the
// others or make the answer too large: the real service is in the answer,
// within the node's bounds.
func TestMicroCapabilityRights(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	cfg := meshtest.NodeConfig(t, "micro-rights")
	a := meshtest.StartNode(t, cfg)
	url, dir := a.NATSURL(), a.DataDir()

	lamps := programs.Program{Name: "lamps", Host: []string{"lamps.set"}, Service: []string{"lamps"}}
	lampsCreds := meshtest.AddProgram(t, url, dir, lamps)
	flood := programs.Program{Name: "flood", Host: []string{"flood.x"}, Service: []string{"flood"}}
	floodCreds := meshtest.AddProgram(t, url, dir, flood)
	caller := programs.Program{Name: "caller", Call: []string{">"}}
	callerCreds := meshtest.AddProgram(t, url, dir, caller)

	lnc := meshtest.ProgramConn(t, url, lampsCreds, lamps)
	if _, err := micro.AddService(lnc, micro.Config{Name: "lamps", Version: "1.0.0",
		Endpoint: &micro.EndpointConfig{Subject: "cap.lamps.set", Handler: micro.HandlerFunc(func(r micro.Request) { _ = r.Respond(nil) })}}); err != nil {
		t.Fatal(err)
	}
	// flood answers every discovery ping 300 times, 8 KiB each, claiming
	// a name of its own choosing.
	fnc := meshtest.ProgramConn(t, url, floodCreds, flood)
	pad := strings.Repeat("x", 8<<10)
	if _, err := fnc.Subscribe("$SRV.PING", func(m *nats.Msg) {
		for i := range 300 {
			_ = fnc.Publish(m.Reply, fmt.Appendf(nil, `{"name":"flood","id":"f%d","version":"1.0.0","type":"io.nats.micro.v1.ping_response","pad":%q}`, i, pad))
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := fnc.Flush(); err != nil {
		t.Fatal(err)
	}

	ask := func(nc *nats.Conn) (*nats.Msg, error) {
		return nc.Request(wire.CapPrefix+"meshbox.micro", []byte(`{"verb":"PING"}`), 5*time.Second)
	}
	// Control: the administrator's request is answered, the real service
	// among the answers, all within the node's bounds.
	resp, err := ask(meshtest.AdminConn(t, url, dir))
	if err != nil {
		t.Fatalf("administrator: %v", err)
	}
	var ans microAnswer
	if err := json.Unmarshal(resp.Data, &ans); err != nil {
		t.Fatalf("administrator: answer %.200s: %v", resp.Data, err)
	}
	names := map[string]int{}
	for _, r := range ans.Responses {
		var ping struct {
			Name string `json:"name"`
		}
		_ = json.Unmarshal(r, &ping)
		names[ping.Name]++
	}
	if names["lamps"] != 1 {
		t.Errorf("administrator: lamps answered %d times in %d answers, want once (the flood must not crowd it out)", names["lamps"], len(ans.Responses))
	}
	if len(resp.Data) > 600<<10 || len(ans.Responses) > 256 {
		t.Errorf("administrator: answer of %d bytes with %d answers, want within 512 KiB of answers and 256 answers", len(resp.Data), len(ans.Responses))
	}
	if names["flood"] == 0 {
		t.Errorf("administrator: no answer of flood's, want as many as fit (%v)", names)
	}

	// A program with the right to call everything is refused.
	resp, err = ask(meshtest.ProgramConn(t, url, callerCreds, caller))
	if err != nil {
		t.Fatalf("caller: %v, want a refusal", err)
	}
	if code, _, _ := wire.ReadError(resp.Header); code != strconv.Itoa(wire.CodeForbidden) || len(resp.Data) != 0 {
		t.Errorf("caller: code %q, body %.100q, want %d and no list", code, resp.Data, wire.CodeForbidden)
	}
}
