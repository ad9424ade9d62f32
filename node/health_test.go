package node

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestHealthTravelsOnDiscovery: a node's health reaches its peers with
// its record; a change of state goes out at once as a heartbeat; a
// heartbeat carries the summary only when it changed since it was sent,
// so an idle mesh sends no more than without it.
func TestHealthTravelsOnDiscovery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a := h.node("A", nil)
		b := h.node("B", nil, "cap.one")
		b.SetHealth(Health{State: HealthOK, Broker: "connected", Bindings: "database"})
		h.start(a, b)
		if got := a.peer(t, "B").Health; got == nil || got.State != HealthOK || got.Broker != "connected" {
			t.Fatalf("A sees B's health %+v, want ok and connected (from B's hello)", got)
		}
		// A change of state: at once, not at the next heartbeat.
		sent := len(b.link.sentKeys())
		b.SetHealth(Health{State: HealthFailing, Broker: "connected", Failing: []string{"thermostat"}, Warnings: 1, Warning: "module thermostat crash-loops"})
		h.settle()
		if got := a.peer(t, "B").Health; got == nil || got.State != HealthFailing || len(got.Failing) != 1 || got.Failing[0] != "thermostat" {
			t.Fatalf("A sees B's health %+v right after the change, want failing with thermostat", got)
		}
		if keys := b.link.sentKeys()[sent:]; len(keys) != 1 || keys[0] != "sys.heartbeat" {
			t.Fatalf("B sent %v on its change of state, want one heartbeat", keys)
		}
		// Idle: the next heartbeats carry no summary, and A keeps the last.
		before := len(b.link.sentKeys())
		h.advance(12 * time.Second)
		b.link.mu.Lock()
		bodies := b.link.bodies[before:]
		b.link.mu.Unlock()
		if len(bodies) == 0 {
			t.Fatal("B sent no heartbeat in 12s")
		}
		for _, body := range bodies {
			if strings.Contains(string(body), `"health"`) {
				t.Errorf("an idle heartbeat carries the unchanged health: %s", body)
			}
		}
		if got := a.peer(t, "B").Health; got == nil || got.State != HealthFailing {
			t.Errorf("A lost B's health over idle heartbeats: %+v", got)
		}
		// A change that is not of state rides on the next heartbeat.
		b.SetHealth(Health{State: HealthFailing, Broker: "connected", Failing: []string{"thermostat"}, Outbox: 7})
		h.settle()
		if a.peer(t, "B").Health.Outbox != 0 {
			t.Error("a change of outbox depth alone was sent at once")
		}
		h.advance(5 * time.Second)
		if got := a.peer(t, "B").Health; got.Outbox != 7 {
			t.Errorf("after B's next heartbeat A sees outbox %d, want 7", got.Outbox)
		}
	})
}

// TestHealthLostHeartbeat: the heartbeat that carried a change of health
// is lost (or held back by the broker); the next heartbeats carry the
// summary's hash, and the peer whose copy differs asks for it, so it
// shows the node failing, not the ok it had. The control: while nothing
// is lost, an idle heartbeat starts no query.
func TestHealthLostHeartbeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		a := h.node("A", nil)
		b := h.node("B", nil, "cap.one")
		b.SetHealth(Health{State: HealthOK, Broker: "connected"})
		h.start(a, b)
		h.advance(12 * time.Second)
		sent := len(a.link.sentKeys())
		h.advance(12 * time.Second)
		for _, k := range a.link.sentKeys()[sent:] {
			if strings.Contains(k, "query") {
				t.Fatalf("control: A sent %s on B's idle heartbeats, want no query", k)
			}
		}

		b.link.setDrop(TypeHeartbeat, true)
		b.SetHealth(Health{State: HealthFailing, Broker: "offline", Failing: []string{"thermostat"}})
		h.settle()
		b.link.setDrop(TypeHeartbeat, false)
		if got := a.peer(t, "B").Health; got == nil || got.State != HealthOK {
			t.Fatalf("A sees B's health %+v, want the ok it had (the change was lost)", got)
		}
		h.advance(12 * time.Second)
		if got := a.peer(t, "B").Health; got == nil || got.State != HealthFailing || got.Broker != "offline" {
			t.Errorf("A sees B's health %+v after B's next heartbeats, want failing and offline", got)
		}
	})
}

// TestHealthRejected: a summary beyond its limits, or on a message that
// carries none, is rejected with the whole message (a peer's word is
// input); the control decodes.
func TestHealthRejected(t *testing.T) {
	base := func(h *Health, typ string) []byte {
		m := Message{V: 1, Type: typ, Node: "B", StartedAt: time.Unix(1, 0), Health: h}
		body, _ := json.Marshal(m)
		return body
	}
	if _, err := DecodeMessage(TypeHeartbeat, base(&Health{State: HealthWarning, Warning: "bindings are 3 days old"}, TypeHeartbeat), "B"); err != nil {
		t.Fatalf("control: %v", err)
	}
	// Module names are a module's (dots, up to 128 bytes), text any
	// printable script.
	dotted := &Health{State: HealthFailing, Failing: []string{"thermo.v2", strings.Repeat("m", 128)}, Warning: "Heizung fällt aus – 暖房"}
	if _, err := DecodeMessage(TypeHeartbeat, base(dotted, TypeHeartbeat), "B"); err != nil {
		t.Fatalf("control with module names of a module's rule: %v", err)
	}
	long := strings.Repeat("x", MaxHealthText+1)
	many := make([]string, MaxHealthFailing+1)
	for i := range many {
		many[i] = "m"
	}
	for name, c := range map[string]struct {
		h   *Health
		typ string
	}{
		"unknown state":    {&Health{State: "great"}, TypeHeartbeat},
		"long warning":     {&Health{State: HealthWarning, Warning: long}, TypeHeartbeat},
		"control chars":    {&Health{State: HealthWarning, Warning: "a\x1b[2Jb"}, TypeHeartbeat},
		"C1 control":       {&Health{State: HealthWarning, Warning: "a\u009b2Jb"}, TypeHeartbeat},
		"bidi override":    {&Health{State: HealthWarning, Warning: "a\u202eb"}, TypeHeartbeat},
		"zero width":       {&Health{State: HealthWarning, Warning: "a\u200bb"}, TypeHeartbeat},
		"negative outbox":  {&Health{State: HealthOK, Outbox: -1}, TypeHeartbeat},
		"too many failing": {&Health{State: HealthFailing, Failing: many}, TypeHeartbeat},
		"bad module name":  {&Health{State: HealthFailing, Failing: []string{"a b"}}, TypeHeartbeat},
		"on a bye":         {&Health{State: HealthOK}, TypeBye},
	} {
		var we *WireError
		if _, err := DecodeMessage(c.typ, base(c.h, c.typ), "B"); !errors.As(err, &we) {
			t.Errorf("%s: %v, want a *WireError", name, err)
		}
	}
}
