package bridge_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/internal/seal"
)

// A member whose bindings do not bind a topic to the scope an event was
// sealed for waits a moment for them (the sender may have read a scope
// bind first) — but only once per change of its bindings. The attack: a
// member (alpha) sends a run of events sealed with the scope's key on a
// topic beta does not know bound, to hold beta's event stream up. Beta
// refuses them all, waits once, and the event behind them (the control:
// an unscoped topic) arrives within a few seconds, not one wait per event.
func TestMisScopedEventsHoldTheStreamOnce(t *testing.T) {
	vhost := testVhost(t)
	km, _ := seal.ContentKeyFrom("kmesh", seal.NewContentKey().Bytes())
	kv, _ := seal.ContentKeyFrom("kvault", seal.NewContentKey().Bytes())
	kv.Scope = "vault"
	ring := func(bound bool) *seal.Keyring {
		sc := seal.Scopes{Bindings: map[string]string{}, Member: map[string]bool{"vault": true},
			Current: map[string]string{"vault": kv.ID}, Members: map[string][]string{"vault": {"alpha", "beta"}}}
		if bound {
			sc.Bindings[seal.BindingKey(seal.BindTopic, "door")] = "vault"
		}
		r := &seal.Keyring{}
		if err := r.SetScoped([]seal.ContentKey{km, kv}, km.ID, sc); err != nil {
			t.Fatal(err)
		}
		return r
	}
	regB := prometheus.NewRegistry()
	a := newNode(t, "alpha", vhost, func(c *bridge.Config) { c.Keys = ring(true) })
	b := newNode(t, "beta", vhost, func(c *bridge.Config) { c.Keys, c.Metrics = ring(false), regB })
	a.waitConnected(t)
	b.waitConnected(t)
	got := make(chan *nats.Msg, 64)
	for _, subj := range []string{"evt.door", "evt.plain"} {
		sub, err := b.client.ChanSubscribe(subj, got)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	if err := b.client.Flush(); err != nil {
		t.Fatal(err)
	}
	waitConsumer(t, vhost, "node.beta.events")
	b.waitEventsBound(t, "evt.door")
	b.waitEventsBound(t, "evt.plain")

	const misScoped = 5
	start := time.Now()
	for range misScoped {
		if err := a.client.Publish("evt.door", []byte("held?")); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.client.Publish("evt.plain", []byte("control")); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		if m.Subject != "evt.plain" || string(m.Data) != "control" {
			t.Fatalf("beta's program got %s %q, want only the control event", m.Subject, m.Data)
		}
	case <-time.After(3 * bridge.BindingLag):
		t.Fatalf("the control event did not arrive within %s after %d mis-scoped ones", 3*bridge.BindingLag, misScoped)
	}
	took := time.Since(start)
	if took > 2*bridge.BindingLag {
		t.Errorf("the control event arrived after %s, want one wait of %s at most (not one per mis-scoped event)", took, bridge.BindingLag)
	}
	if took < bridge.BindingLag-200*time.Millisecond {
		t.Errorf("the control event arrived after %s: beta did not wait for its bindings at all (want about %s)", took, bridge.BindingLag)
	}
	// Every mis-scoped event is refused and counted.
	if n := unsealFailures(t, regB, "event", "wrong_scope"); n != misScoped {
		t.Errorf("wrong_scope events refused by beta: %v, want %d", n, misScoped)
	}
	select {
	case m := <-got:
		t.Errorf("beta's program got %s %q, want nothing more", m.Subject, m.Data)
	default:
	}
}
