package e2e

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/nats-io/nats.go"
)

// TestLocalAdversary runs a two-node mesh on the real broker and database
// and lets a program on node alpha, whose credential allows it to host and
// call "lamp" and publish "door.opened", try everything else: it cannot
// subscribe to work.> or _INBOX.>, cannot answer $MESH.status, cannot host
// a capability or serve a stage it was not given, and the Meshbox-Origin it
// forges is ignored. A client without a credential is refused.
func TestLocalAdversary(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, RabbitMQ and two nodes")
	}
	alpha, beta, _ := twoNodeMesh(t)

	// No credential: refused.
	if nc, err := nats.Connect(alpha.NATSURL(), nats.NoReconnect()); !errors.Is(err, nats.ErrAuthorization) {
		if nc != nil {
			nc.Close()
		}
		t.Fatalf("anonymous connection to a mesh node: got %v, want an authorization violation", err)
	}

	narrow := programs.Program{Name: "narrow", Host: []string{"lamp"}, Call: []string{"lamp"}, Publish: []string{"door.opened"}}
	creds := meshtest.AddProgram(t, alpha.NATSURL(), alpha.DataDir(), narrow)
	violations := make(chan error, 32)
	prog := meshtest.ProgramConn(t, alpha.NATSURL(), creds, narrow, nats.NoReconnect(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case violations <- err:
			default:
			}
		}))
	refused := func(subject string) {
		t.Helper()
		select {
		case err := <-violations:
			if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), `"`+subject+`"`) {
				t.Fatalf("got %v, want the permissions violation for %s", err, subject)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no permissions violation within 10s", subject)
		}
	}

	// What it was given works: it hosts lamp, the mesh sees it, a caller
	// on beta reaches it, and it calls lamp itself through its own inbox.
	if _, err := prog.Subscribe("cap.lamp", func(m *nats.Msg) { _ = m.Respond([]byte("on")) }); err != nil {
		t.Fatal(err)
	}
	if err := prog.Flush(); err != nil {
		t.Fatal(err)
	}
	waitView(t, beta.HTTPURL(), 20*time.Second, "lamp on alpha seen from beta", func(v meshView) bool {
		return slices.Contains(v.Capabilities.Remote["lamp"], "alpha")
	})
	onBeta := beta.Connect(t)
	if r, err := onBeta.Request("cap.lamp", nil, 10*time.Second); err != nil || string(r.Data) != "on" {
		t.Fatalf("call lamp from beta: got %v %v, want on", r, err)
	}
	if r, err := prog.Request("cap.lamp", nil, 10*time.Second); err != nil || string(r.Data) != "on" {
		t.Fatalf("the program calls lamp: got %v %v, want on", r, err)
	}

	// What it was not given is refused by alpha's NATS server.
	for _, subj := range []string{"work.>", "_INBOX.>", appliance.SubjectStatus, "$MESH.>", "cap.safe", "work.chores", "cap.>"} {
		if _, err := prog.Subscribe(subj, func(m *nats.Msg) { _ = m.Respond([]byte(`{"node":"forged"}`)) }); err != nil {
			t.Fatal(err)
		}
		refused(subj)
	}
	if _, err := prog.QueueSubscribe("work.chores", "handlers", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	refused("work.chores")
	for _, subj := range []string{"cmd.chores", "evt.alarm.off", appliance.SubjectReloadPrograms, "_INBOX.other.x"} {
		if err := prog.Publish(subj, nil); err != nil {
			t.Fatal(err)
		}
		refused(subj)
	}
	// The node's status still comes from the node, and the mesh never
	// hears of the capability it tried to host.
	onAlpha := alpha.Connect(t)
	for range 3 {
		r, err := onAlpha.Request(appliance.SubjectStatus, nil, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var st appliance.Status
		if err := json.Unmarshal(r.Data, &st); err != nil || st.Node != "alpha" {
			t.Fatalf("status answer %q (%v): want alpha's own", r.Data, err)
		}
	}
	if v := getView(t, beta.HTTPURL()); len(v.Capabilities.Remote["safe"]) > 0 || len(v.Capabilities.Remote["chores"]) > 0 {
		t.Errorf("beta sees capabilities the program was refused: %v", v.Capabilities.Remote)
	}

	// A forged origin is ignored: the event reaches beta from alpha.
	events, err := onBeta.SubscribeSync("evt.door.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := onBeta.Flush(); err != nil {
		t.Fatal(err)
	}
	forged := &nats.Msg{Subject: "evt.door.opened", Data: []byte("front"),
		Header: nats.Header{bridge.HeaderOrigin: {"beta"}, bridge.HeaderRedelivered: {"true"}}}
	if err := prog.PublishMsg(forged); err != nil {
		t.Fatal(err)
	}
	m, err := events.NextMsg(15 * time.Second)
	if err != nil {
		t.Fatalf("the program's event did not reach beta: %v", err)
	}
	if o := m.Header.Get(bridge.HeaderOrigin); o != "alpha" || string(m.Data) != "front" {
		t.Errorf("event on beta: origin %q data %q, want origin alpha (the forged beta ignored) and front", o, m.Data)
	}
	if m.Header.Get(bridge.HeaderRedelivered) != "" {
		t.Errorf("event on beta carries the program's Meshbox-Redelivered: %v", m.Header)
	}

	// Removed, the program is cut off, and its key no longer gets in.
	key, err := programs.LoadKey(creds)
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	prog.SetClosedHandler(func(*nats.Conn) { close(closed) })
	if code, out, errOut := cli(t, "program", "remove", "narrow", "--data", alpha.DataDir(), "--server", alpha.NATSURL()); code != 0 {
		t.Fatalf("program remove: exit %d: %s %s", code, out, errOut)
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("a removed program stays connected")
	}
	if nc, err := nats.Connect(alpha.NATSURL(), nats.NoReconnect(), nats.Nkey(key.Public(), key.Sign)); !errors.Is(err, nats.ErrAuthorization) {
		if nc != nil {
			nc.Close()
		}
		t.Errorf("a removed program's key: got %v, want an authorization violation", err)
	}
}
