package bridge_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
	"github.com/nats-io/nats.go"
)

func TestOutboxWhileLinkDownThenDrainedInOrder(t *testing.T) {
	t.Parallel()
	vhost := testVhost(t)
	px, proxied := brokerProxy(t, vhost)
	a := newNode(t, "alpha", proxied, nil)
	b := newNode(t, "beta", vhost, func(c *bridge.Config) { c.Prefetch = 1 })
	a.waitConnected(t)
	b.waitConnected(t)
	var h handler
	serveStage(t, b, "ordered", &h)
	events := subscribeEvents(t, b, "evt.seq")

	px.Cut(t)
	meshtest.WaitFor(t, 10*time.Second, "alpha offline", func() bool { return a.b.Status().Broker.State == bridge.StateOffline })

	const n = 300
	for i := 0; i < n; i++ {
		m := a.submit(t, "ordered", []byte(strconv.Itoa(i)), nil)
		if got := m.Header.Get(codec.HeaderAccepted); got != "outbox" {
			t.Fatalf("command %d accepted as %q, want outbox", i, got)
		}
		if err := a.client.Publish("evt.seq", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.client.Flush(); err != nil {
		t.Fatal(err)
	}
	meshtest.WaitFor(t, 5*time.Second, "events in the outbox", func() bool { return a.b.Status().Outbox.Depth == 2*n })
	st := a.b.Status()
	if st.Outbox.Bytes <= 0 || st.Outbox.OldestAgeSeconds <= 0 {
		t.Errorf("outbox status: got %+v, want bytes and an age", st.Outbox)
	}
	// The outbox holds them all (depth above): nothing went out.
	if got := len(h.msgs()); got != 0 {
		t.Fatalf("beta handled %d commands while alpha was offline, want 0", got)
	}

	px.Restore(t)
	meshtest.WaitFor(t, 30*time.Second, "every command and event delivered", func() bool {
		return len(h.msgs()) >= n && events.len() >= n
	})
	meshtest.WaitFor(t, 10*time.Second, "outbox empty", func() bool { return a.b.Status().Outbox.Depth == 0 })
	time.Sleep(500 * time.Millisecond) // room for a duplicate: its absence cannot be signalled
	for i, m := range h.msgs() {
		if string(m.Data) != strconv.Itoa(i) {
			t.Fatalf("command %d is %s: want the order alpha accepted them in", i, m.Data)
		}
	}
	for i, m := range events.all() {
		if string(m.Data) != strconv.Itoa(i) {
			t.Fatalf("event %d is %s: want the order alpha accepted them in", i, m.Data)
		}
	}
	if len(h.msgs()) != n || events.len() != n {
		t.Errorf("delivered %d commands and %d events, want %d each", len(h.msgs()), events.len(), n)
	}
	// The link is up and the outbox empty: straight to the broker again.
	if m := a.submit(t, "ordered", []byte("direct"), nil); m.Header.Get(codec.HeaderAccepted) != "broker" {
		t.Errorf("after the drain: accepted as %q, want broker", m.Header.Get(codec.HeaderAccepted))
	}
}

func TestOutboxFull(t *testing.T) {
	vhost := testVhost(t)
	px, proxied := brokerProxy(t, vhost)
	px.Cut(t)
	a := newNode(t, "alpha", proxied, func(c *bridge.Config) { c.OutboxMaxBytes = 100 << 10 })
	body := []byte(strings.Repeat("x", 10<<10))
	accepted := 0
	for i := 0; ; i++ {
		if i > 20 {
			t.Fatal("outbox never filled up")
		}
		m, err := a.request(t, "cmd.big", body, nil, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		code, text := natstest.ServiceError(m)
		if code == 0 {
			accepted++
			continue
		}
		if code != 507 || !strings.Contains(text, "outbox full") {
			t.Fatalf("got %d %q, want 507 outbox full", code, text)
		}
		break
	}
	st := a.b.Status()
	if st.Outbox.Depth != int64(accepted) || st.Outbox.Bytes > st.Outbox.MaxBytes {
		t.Errorf("status: got %+v after %d accepted", st.Outbox, accepted)
	}
	if accepted < 8 {
		t.Errorf("accepted %d commands of 10 KiB in 100 KiB, want at least 8", accepted)
	}
	// Small events still fit; nothing accepted was dropped.
	if _, err := a.request(t, "evt.small", []byte("x"), nil, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestLocalStageWhileOffline(t *testing.T) {
	vhost := testVhost(t)
	px, proxied := brokerProxy(t, vhost)
	a := newNode(t, "alpha", proxied, nil)
	a.waitConnected(t)
	var h handler
	serveStage(t, a, "local", &h)
	px.Cut(t)
	meshtest.WaitFor(t, 10*time.Second, "alpha offline", func() bool { return a.b.Status().Broker.State == bridge.StateOffline })

	for i := 0; i < 5; i++ {
		m := a.submit(t, "local", []byte(strconv.Itoa(i)), nil)
		if got := m.Header.Get(codec.HeaderAccepted); got != "local" {
			t.Fatalf("accepted as %q, want local", got)
		}
	}
	meshtest.WaitFor(t, 10*time.Second, "local commands handled", func() bool { return len(h.msgs()) >= 5 })
	time.Sleep(300 * time.Millisecond) // room for a second run: its absence cannot be signalled
	if len(h.msgs()) != 5 {
		t.Fatalf("handled %d local commands, want 5 (once each)", len(h.msgs()))
	}
	for i, m := range h.msgs() {
		if string(m.Data) != strconv.Itoa(i) || m.Header.Get(codec.HeaderAttempt) != "1" || m.Header.Get(codec.HeaderMsgID) == "" {
			t.Errorf("local command %d: got %q %v", i, m.Data, m.Header)
		}
	}
	meshtest.WaitFor(t, 5*time.Second, "outbox empty", func() bool { return a.b.Status().Outbox.Depth == 0 })
	// A stage nobody hosts here goes to the outbox for the mesh.
	if m := a.submit(t, "remote", []byte("x"), nil); m.Header.Get(codec.HeaderAccepted) != "outbox" {
		t.Errorf("remote stage while offline: accepted as %q, want outbox", m.Header.Get(codec.HeaderAccepted))
	}
}

func TestNodeNameInUse(t *testing.T) {
	vhost := testVhost(t)
	first := newNode(t, "alpha", vhost, nil)
	first.waitConnected(t)
	second := buildNode(t, "alpha", vhost, nil)
	err := second.b.Start(t.Context())
	var inUse *bridge.NodeNameInUseError
	if !errors.As(err, &inUse) || !errors.Is(err, bridge.ErrNodeNameInUse) {
		t.Fatalf("second process: got %v, want ErrNodeNameInUse", err)
	}
	if !strings.Contains(err.Error(), "node name alpha is in use") {
		t.Errorf("message: got %q", err)
	}
	// The first keeps working.
	if st := first.b.Status().Broker.State; st != bridge.StateConnected {
		t.Errorf("first node: state %s, want connected", st)
	}
}

func TestStatusAndMovingBroker(t *testing.T) {
	rabbit := sharedRabbit(t)
	vhost := rabbit.Vhost(t)
	a := newNode(t, "alpha", "", nil)
	st := a.b.Status()
	if st.Broker.State != bridge.StateNone {
		t.Fatalf("no broker: state %s, want none", st.Broker.State)
	}
	// Without a broker, events stay local and commands need a local stage.
	m, err := a.request(t, "cmd.nothing", nil, nil, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := natstest.ServiceError(m); code != 503 {
		t.Errorf("command without broker or host: got %d, want 503", code)
	}
	if err := a.b.SetURL("http://nope"); err == nil {
		t.Error("SetURL with an http URL: got nil, want an error")
	}
	if err := a.b.SetURL(vhost); err != nil {
		t.Fatal(err)
	}
	a.waitConnected(t)
	st = a.b.Status()
	if strings.Contains(st.Broker.URL, "guest:guest") || !strings.Contains(st.Broker.URL, "xxxxx") {
		t.Errorf("status URL: got %q, want the password redacted", st.Broker.URL)
	}
	var states []string
	for _, h := range st.Broker.History {
		states = append(states, h.State)
	}
	if strings.Join(states, ",") != "connecting,connected" {
		t.Errorf("history: got %v, want connecting,connected", states)
	}
	// Move to another vhost (another broker, as far as the node can tell).
	other := strings.Replace(vhost, "/TestStatus", "/", 1)
	if other == vhost {
		other = rabbit.URL()
	}
	if err := a.b.SetURL(other); err != nil {
		t.Fatal(err)
	}
	meshtest.WaitFor(t, 10*time.Second, "connected to the new broker", func() bool {
		st := a.b.Status()
		return st.Broker.State == bridge.StateConnected && st.Broker.URL == strings.Replace(other, "guest:guest", "guest:xxxxx", 1)
	})
	if err := a.b.SetURL(""); err != nil {
		t.Fatal(err)
	}
	meshtest.WaitFor(t, 10*time.Second, "state none", func() bool { return a.b.Status().Broker.State == bridge.StateNone })
}

func TestStallNoConsumer(t *testing.T) {
	vhost := testVhost(t)
	a := newNode(t, "alpha", vhost, nil)
	b := newNode(t, "beta", vhost, nil)
	a.waitConnected(t)
	b.waitConnected(t)
	var h handler
	sub := serveStage(t, b, "orphan", &h)
	a.submit(t, "orphan", []byte("1"), nil)
	meshtest.WaitFor(t, 10*time.Second, "first command handled", func() bool { return len(h.msgs()) == 1 })
	if err := sub.Unsubscribe(); err != nil { // beta's handler goes away: beta stops consuming
		t.Fatal(err)
	}
	meshtest.WaitFor(t, 10*time.Second, "beta no longer hosting", func() bool { return len(b.b.HostedStages()) == 0 })
	a.submit(t, "orphan", []byte("2"), nil)
	meshtest.WaitFor(t, 10*time.Second, "a stall on alpha", func() bool { return len(a.b.Status().Stalls) == 1 })
	s := a.b.Status().Stalls[0]
	if s.Stage != "orphan" || !strings.Contains(s.Reason, "no node consumes") {
		t.Errorf("stall: got %+v", s)
	}
	// A handler comes back: the stall clears.
	serveStage(t, b, "orphan", &h)
	meshtest.WaitFor(t, 10*time.Second, "stall cleared", func() bool { return len(a.b.Status().Stalls) == 0 })
	if len(h.msgs()) != 2 {
		t.Errorf("handled %d, want 2", len(h.msgs()))
	}
}

// TestOutboxSurvivesRestart closes a node while its outbox holds commands
// and starts it again on the same file: they are sent, in order.
func TestOutboxSurvivesRestart(t *testing.T) {
	vhost := testVhost(t)
	px, proxied := brokerProxy(t, vhost)
	b := newNode(t, "beta", vhost, func(c *bridge.Config) { c.Prefetch = 1 })
	b.waitConnected(t)
	var h handler
	serveStage(t, b, "kept", &h)

	px.Cut(t)
	a := newNode(t, "alpha", proxied, nil)
	const n = 50
	for i := 0; i < n; i++ {
		a.submit(t, "kept", []byte(strconv.Itoa(i)), nil)
	}
	path := a.cfg.OutboxPath
	if err := a.b.Close(); err != nil {
		t.Fatal(err)
	}
	px.Restore(t)
	a2 := newNode(t, "alpha", proxied, func(c *bridge.Config) { c.OutboxPath = path })
	if d := a2.b.Status().Outbox.Depth; d != n && len(h.msgs()) == 0 {
		t.Errorf("outbox after restart: depth %d, want %d", d, n)
	}
	meshtest.WaitFor(t, 20*time.Second, "the kept commands delivered", func() bool { return len(h.msgs()) >= n })
	time.Sleep(300 * time.Millisecond) // room for a duplicate: its absence cannot be signalled
	for i, m := range h.msgs() {
		if string(m.Data) != strconv.Itoa(i) {
			t.Fatalf("command %d is %s, want in order", i, m.Data)
		}
	}
	if len(h.msgs()) != n {
		t.Errorf("delivered %d, want %d", len(h.msgs()), n)
	}
}

func TestBadInputFromPrograms(t *testing.T) {
	vhost := testVhost(t)
	a := newNode(t, "alpha", vhost, func(c *bridge.Config) {
		c.MaxPayload = 600 << 10
		c.Routes = map[string]string{"echo": "beta"}
	})
	b := newNode(t, "beta", vhost, nil)
	a.waitConnected(t)
	b.waitConnected(t)
	hostEcho(t, b, "echo")
	var h handler
	serveStage(t, b, "big", &h)
	waitStandIn(t, a, "echo")

	big := make([]byte, 500<<10)
	for i := range big {
		big[i] = byte('a' + i%26)
	}
	m, err := a.request(t, "cap.echo", big, nil, 5*time.Second)
	if err != nil || len(m.Data) != len(big)+5 {
		t.Fatalf("500 KiB request: got %v (%d bytes), want the echo", err, len(m.Data))
	}
	a.submit(t, "big", big, nil)
	meshtest.WaitFor(t, 10*time.Second, "the 500 KiB command", func() bool { return len(h.msgs()) == 1 && len(h.msgs()[0].Data) == len(big) })

	tooBig := make([]byte, 700<<10)
	for _, tt := range []struct {
		name, subject string
		data          []byte
		hdr           nats.Header
		want          string
	}{
		{"oversized request", "cap.echo", tooBig, nil, "exceeds the limit"},
		{"oversized command", "cmd.big", tooBig, nil, "exceeds the limit"},
		{"oversized event", "evt.big", tooBig, nil, "exceeds the limit"},
		{"wildcard character in a stage", "cmd.a#b", nil, nil, "not a valid stage name"},
		{"bad message id", "cmd.big", nil, nats.Header{codec.HeaderMsgID: {"has space"}}, "not a valid message id"},
		{"reserved header", "evt.x", nil, nats.Header{"CC": {"evt.y"}}, "reserved"},
		{"bad node name", "node.a%b.cap.echo", nil, nil, "is not node.<node>.cap"},
	} {
		m, err := a.request(t, tt.subject, tt.data, tt.hdr, 5*time.Second)
		if err != nil {
			t.Errorf("%s: got %v, want a 400 reply", tt.name, err)
			continue
		}
		if code, text := natstest.ServiceError(m); code != 400 || !strings.Contains(text, tt.want) {
			t.Errorf("%s: got %d %q, want 400 with %q", tt.name, code, text, tt.want)
		}
	}
}
