package e2e

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// eventBindingsOf returns the keys a node's event queue is bound with on
// mesh, read from the broker's management API.
func eventBindingsOf(t *testing.T, rh *rabbithole.Client, vhost, node string) []string {
	t.Helper()
	bs, err := rh.ListQueueBindings(vhost, "node."+node+".events")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, b := range bs {
		if b.Source == "mesh" {
			keys = append(keys, b.RoutingKey)
		}
	}
	slices.Sort(keys)
	return keys
}

// eventsBound waits until p's event queue is bound for topic pattern
// (AMQP syntax) and returns how long that took from since.
func eventsBound(t *testing.T, p *meshtest.Process, pattern string, since time.Time) time.Duration {
	t.Helper()
	meshtest.WaitStatus(t, p.HTTPURL(), 20*time.Second, p.Node()+" bound for "+pattern, func(s appliance.Status) bool {
		eb := s.Broker.EventBindings
		return eb != nil && !eb.Pending && slices.Contains(eb.Topics, pattern)
	})
	return time.Since(since)
}

// waitListening waits until p's event queue is bound for the events a
// subscription to subject receives, and each node of from (those that
// publish them) knows that some node listens to them: the mesh's events
// published after that reach p (the interest window, docs/messages.md).
func waitListening(t *testing.T, p *meshtest.Process, subject string, from ...*meshtest.Process) {
	t.Helper()
	pattern, ok := wire.EventPattern(subject)
	if !ok {
		t.Fatalf("%s receives no event", subject)
	}
	meshtest.WaitStatus(t, p.HTTPURL(), 20*time.Second, p.Node()+" listening to "+subject, func(s appliance.Status) bool {
		eb := s.Broker.EventBindings
		return eb != nil && !eb.Pending && (slices.Contains(eb.Topics, pattern) || slices.Contains(eb.Topics, wire.AllEvents))
	})
	for _, f := range from {
		if f != p {
			meshtest.WaitStatus(t, f.HTTPURL(), 20*time.Second, f.Node()+" knows that a node listens to "+subject, func(s appliance.Status) bool {
				return sendsEvents(s, pattern)
			})
		}
	}
}

// sendsEvents reports whether a node with status s sends the events of
// topic pattern to the broker: it has no view of the other nodes'
// interest (none yet, or an older meshbox), its view says any node may
// listen to anything, or a pattern of its view covers pattern.
func sendsEvents(s appliance.Status, pattern string) bool {
	eb := s.Broker.EventBindings
	if eb == nil || eb.Listeners == nil || eb.Listeners.All {
		return true
	}
	for _, q := range eb.Listeners.Topics {
		if wire.EventMatches(q, pattern) {
			return true
		}
	}
	return false
}

// TestEventsByInterest runs the node's real watcher of local interest: an
// MQTT device on beta (mosquitto_sub) subscribes and beta's event queue is
// bound for it within the interest window; a program on alpha publishes
// and listens to the same topic, and receives each event once (from its
// own NATS server), none back from the broker; the queues are bound only
// with the other node's lanes. Attack: a program whose credential permits
// garden.> alone subscribes to every event; the server refuses it and
// alpha binds nothing for it. Control: its own topics are bound.
// The publisher's side, through real discovery: alpha learns that beta
// listens to room.# alone and keeps 50 events of hall.light on the node
// (an event with a reply is still confirmed), and a subscriber added on
// beta has alpha's stream of hall.light within the interest window.
func TestEventsByInterest(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a broker, a database and two nodes")
	}
	meshtest.Binary(t)
	rmq := meshtest.RabbitMQ(t)
	vhostURL := rmq.Vhost(t)
	db := meshtest.Postgres(t).Database(t)
	if code, _, errOut := cli(t, "init", "--db", db, "--node", "alpha", "--broker", meshtest.NoCredential(vhostURL)); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	mesh(t, db, "node", "add", "beta", "--record-only")
	alpha := meshtest.StartProcess(t, "--node", "alpha", "--db", db)
	beta := meshtest.StartProcessEnv(t, []string{"MESHBOX_NATS_MQTT=127.0.0.1:0"}, "--node", "beta", "--db", db)
	for _, p := range []*meshtest.Process{alpha, beta} {
		meshtest.WaitStatus(t, p.HTTPURL(), 20*time.Second, p.Node()+" connected, knowing its peer's protocol", func(s appliance.Status) bool {
			eb := s.Broker.EventBindings
			return s.Broker.State == "connected" && eb != nil && !eb.Legacy
		})
		waitKeysInStep(t, p)
	}
	u, err := url.Parse(vhostURL)
	if err != nil {
		t.Fatal(err)
	}
	vhost, _ := url.PathUnescape(strings.TrimPrefix(u.Path, "/"))
	rh, err := rabbithole.NewClient(rmq.ManagementURL(), "guest", "guest")
	if err != nil {
		t.Fatal(err)
	}

	// The device on beta, defined as a user would.
	code, out, errOut := cli(t, "program", "add", "panel", "--mqtt", "--subscribe", "room.>", "--data", beta.DataDir(), "--server", beta.NATSURL())
	if code != 0 {
		t.Fatalf("program add panel: exit %d: %s%s", code, out, errOut)
	}
	panel := mqttOf(t, beta, "panel")
	start := time.Now()
	onBeta := panel.sub(t, "panel-1", "evt/room/#")
	took := eventsBound(t, beta, "room.#", start)
	t.Logf("an MQTT device subscribing on beta to its event queue bound: %v", took)
	if window := time.Second + 500*time.Millisecond; took > window {
		t.Errorf("beta bound room.# %v after its device subscribed, want within %v", took, window)
	}

	// A program on alpha publishes room.temp and listens to room.>.
	sensor := programs.Program{Name: "sensor", Publish: []string{"room.>", "hall.>"}, Subscribe: []string{"room.>"}}
	prog := meshtest.ProgramConn(t, alpha.NATSURL(), meshtest.AddProgram(t, alpha.NATSURL(), alpha.DataDir(), sensor), sensor)
	local := make(chan *nats.Msg, 256)
	if _, err := prog.ChanSubscribe("evt.room.>", local); err != nil {
		t.Fatal(err)
	}
	flush(t, prog)
	eventsBound(t, alpha, "room.#", time.Now())
	const n = 50
	for i := range n {
		m := &nats.Msg{Subject: "evt.room.temp", Data: fmt.Appendf(nil, "%d", i)}
		if i == n-1 {
			if _, err := prog.RequestMsg(m, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := prog.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	meshtest.WaitFor(t, 20*time.Second, "the events at beta's device", func() bool { return onBeta.has("evt/room/temp", fmt.Sprint(n-1)) })
	// Beta's lane into alpha carries nothing of alpha's own: whatever
	// came back would have come by now, with the events beta's device
	// got after it.
	if got := len(local); got != n {
		t.Errorf("alpha's program got %d events, want %d (once each, none back from the broker)", got, n)
	}
	if got, want := eventBindingsOf(t, rh, vhost, "alpha"), []string{"evo.beta.room.#"}; !slices.Equal(got, want) {
		t.Errorf("alpha's event queue bindings: %q, want %q (beta's lane alone)", got, want)
	}
	if got, want := eventBindingsOf(t, rh, vhost, "beta"), []string{"evo.alpha.room.#"}; !slices.Equal(got, want) {
		t.Errorf("beta's event queue bindings: %q, want %q", got, want)
	}

	// Attack: a narrow program subscribes to every event.
	nosy := programs.Program{Name: "nosy", Subscribe: []string{"garden.>"}}
	violations := make(chan error, 4)
	nc := meshtest.ProgramConn(t, alpha.NATSURL(), meshtest.AddProgram(t, alpha.NATSURL(), alpha.DataDir(), nosy), nosy,
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case violations <- err:
			default:
			}
		}))
	if _, err := nc.Subscribe("evt.>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-violations:
		if !errors.Is(err, nats.ErrPermissionViolation) {
			t.Fatalf("nosy subscribes to evt.>: %v, want a permissions violation", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("nosy subscribed to evt.> without a permissions violation")
	}
	// Control: its own topics, bound after the refused subscription.
	if _, err := nc.Subscribe("evt.garden.>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	flush(t, nc)
	eventsBound(t, alpha, "garden.#", time.Now())
	st := meshtest.Status(t, alpha.HTTPURL())
	if topics := st.Broker.EventBindings.Topics; slices.Contains(topics, "#") {
		t.Errorf("alpha listens to every event for a program that may not: %q", topics)
	}
	if got, want := eventBindingsOf(t, rh, vhost, "alpha"), []string{"evo.beta.garden.#", "evo.beta.room.#"}; !slices.Equal(got, want) {
		t.Errorf("alpha's event queue bindings: %q, want %q", got, want)
	}

	// The publisher's side: alpha knows, from discovery, that beta
	// listens to room.# alone, and keeps the events of hall.light, which
	// nobody else listens to, on the node.
	meshtest.WaitStatus(t, alpha.HTTPURL(), 20*time.Second, "alpha knows what beta listens to", func(s appliance.Status) bool {
		l := s.Broker.EventBindings.Listeners
		return l != nil && !l.All && slices.Equal(l.Topics, []string{"room.#"})
	})
	kept := func() uint64 { return meshtest.Status(t, alpha.HTTPURL()).Broker.EventBindings.Listeners.KeptLocal }
	keptBefore := kept()
	for range n {
		if err := prog.Publish("evt.hall.light", []byte("on")); err != nil {
			t.Fatal(err)
		}
	}
	// Control: a program asking for a confirmation has it, nobody
	// listening or not.
	if _, err := prog.Request("evt.hall.light", []byte("on"), 10*time.Second); err != nil {
		t.Fatalf("an event of hall.light with a reply: %v, want it confirmed", err)
	}
	if got := kept() - keptBefore; got != n {
		t.Errorf("alpha kept %d events of hall.light on the node, want %d (nobody else listens)", got, n)
	}

	// A subscriber added on beta has the topic's events within the
	// window: beta's watcher sees it, binds, and says so to alpha.
	hall := programs.Program{Name: "hall", Subscribe: []string{"hall.>"}}
	hallConn := meshtest.ProgramConn(t, beta.NATSURL(), meshtest.AddProgram(t, beta.NATSURL(), beta.DataDir(), hall), hall)
	stop, streamDone := make(chan struct{}), make(chan struct{})
	go func() { // alpha's stream; exits when stop is closed
		defer close(streamDone)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			_ = prog.Publish("evt.hall.light", fmt.Appendf(nil, "%d", i))
		}
	}()
	defer func() { close(stop); <-streamDone }()
	time.Sleep(100 * time.Millisecond) // the stream flows, kept on alpha
	start = time.Now()
	got, err := hallConn.SubscribeSync("evt.hall.>")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := got.NextMsg(10 * time.Second); err != nil {
		t.Fatalf("beta's new subscriber had no event of hall.light: %v", err)
	}
	took = time.Since(start)
	t.Logf("a subscriber added on beta had alpha's events after %v", took)
	if window := time.Second + 500*time.Millisecond; took > window {
		t.Errorf("beta's new subscriber had alpha's events %v after it subscribed, want within %v", took, window)
	}
}
