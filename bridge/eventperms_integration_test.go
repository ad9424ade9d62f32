package bridge_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/bridge/codec"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// What a peer's broker user may bind and publish for events. Attack: it
// binds another node's event queue (to take events meant for it, or to
// make it receive what it does not listen to): refused. Control: it
// binds its own queue with another node's lane. Attack: it publishes an
// event on another node's lane (evo.beta.*, as BCC): the receivers take
// the origin from its user_id all the same, so the event is its own.
func TestPeerEventBindings(t *testing.T) {
	admin, urlOf := perNodeMesh(t)
	credA, credB := generation(t, admin, "alpha", 1), generation(t, admin, "beta", 1)
	credG := generation(t, admin, "gamma", 1)
	b := newNode(t, "beta", urlOf(credB), nil)
	g := newNode(t, "gamma", urlOf(credG), nil)
	knowEachOther(b, g)
	b.waitConnected(t)
	g.waitConnected(t)
	atG := subscribeEvents(t, g, "evt.door")

	conn, err := amqp.Dial(urlOf(credA))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	err = ch.QueueBind("node.beta.events", "evo.gamma.#", "mesh", false, nil)
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.AccessRefused {
		t.Errorf("alpha binding beta's event queue: %v, want 403 ACCESS_REFUSED", err)
	}
	// Control: its own queue (which the admin declared), with beta's lane.
	ch2, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch2.QueueDeclarePassive("node.alpha.events", true, false, false, false, nil); err != nil {
		t.Fatalf("alpha's event queue: %v", err)
	}
	if err := ch2.QueueBind("node.alpha.events", "evo.beta.#", "mesh", false, nil); err != nil {
		t.Errorf("alpha binding its own event queue with beta's lane: %v, want it allowed", err)
	}

	// alpha publishes on beta's lane (and its own routing key): gamma
	// receives it as alpha's event, never as beta's.
	if err := ch2.Confirm(false); err != nil {
		t.Fatal(err)
	}
	p := amqp.Publishing{Type: codec.TypeEvent, MessageId: "forged-lane-1", UserId: credA.User, Timestamp: time.Now(),
		Headers: amqp.Table{"BCC": []any{"evo.beta.door"}}, Body: []byte("which node?")}
	dc, err := ch2.PublishWithDeferredConfirm("mesh", "evt.door", false, false, p)
	if err == nil {
		_, err = dc.WaitContext(t.Context())
	}
	if err != nil {
		// The broker checks the lane against alpha's topic permissions.
		t.Logf("publishing on beta's lane: %v (refused by the broker)", err)
		return
	}
	meshtest.WaitFor(t, 10*time.Second, "the event at gamma", func() bool { return atG.len() >= 1 })
	for _, m := range atG.all() {
		if o := m.Header.Get(codec.HeaderOrigin); o != "alpha" {
			t.Errorf("an event alpha published on beta's lane reached gamma with origin %q, want alpha", o)
		}
	}
}

// A node whose broker user has an older mesh's permissions may bind its
// event queue with evt.# alone: it says so once, counts the refusal, and
// binds every event, so that it misses nothing it listens to.
func TestEventBindingsWithOlderPermissions(t *testing.T) {
	admin, urlOf := perNodeMesh(t)
	credOld, credNew := generation(t, admin, "alpha", 1), generation(t, admin, "gamma", 1)
	guest := strings.Replace(urlOf(credOld), credOld.User+":"+credOld.Password.Reveal(), "guest:guest", 1)
	olderMesh(t, admin.Vhost(), sharedRabbit(t).AdminURL(), guest, credOld.User, "alpha")
	a := newNode(t, "alpha", urlOf(credOld), nil)
	g := newNode(t, "gamma", urlOf(credNew), nil)
	knowEachOther(a, g)
	a.waitConnected(t)
	g.waitConnected(t)
	rec := subscribeEvents(t, a, "evt.door")
	eb := a.b.Status().Broker.EventBindings
	if eb.Warning == "" || eb.Bound != 1 {
		t.Errorf("alpha's event bindings: %+v, want evt.# alone and a warning", eb)
	}
	if _, err := g.client.Request("evt.door", []byte("opened"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	meshtest.WaitFor(t, 10*time.Second, "gamma's event at alpha", func() bool { return rec.len() >= 1 })
	// And alpha's events, published with their lane, reach gamma.
	atG := subscribeEvents(t, g, "evt.window")
	if _, err := a.client.Request("evt.window", []byte("closed"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	meshtest.WaitFor(t, 10*time.Second, "alpha's event at gamma", func() bool { return atG.len() >= 1 })
}
