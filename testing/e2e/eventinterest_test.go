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
// subscription to subject receives: the mesh's events published after
// that reach it (the interest window, docs/messages.md).
func waitListening(t *testing.T, p *meshtest.Process, subject string) {
	t.Helper()
	pattern, ok := wire.EventPattern(subject)
	if !ok {
		t.Fatalf("%s receives no event", subject)
	}
	meshtest.WaitStatus(t, p.HTTPURL(), 20*time.Second, p.Node()+" listening to "+subject, func(s appliance.Status) bool {
		eb := s.Broker.EventBindings
		return eb != nil && !eb.Pending && (slices.Contains(eb.Topics, pattern) || slices.Contains(eb.Topics, wire.AllEvents))
	})
}

// TestEventsByInterest runs the node's real watcher of local interest: an
// MQTT device on beta (mosquitto_sub) subscribes and beta's event queue is
// bound for it within the interest window; a program on alpha publishes
// and listens to the same topic, and receives each event once (from its
// own NATS server), none back from the broker; the queues are bound only
// with the other node's lanes. Attack: a program whose credential permits
// garden.> alone subscribes to every event; the server refuses it and
// alpha binds nothing for it. Control: its own topics are bound.
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
	sensor := programs.Program{Name: "sensor", Publish: []string{"room.>"}, Subscribe: []string{"room.>"}}
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
}
