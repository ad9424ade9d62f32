package bridge

import (
	"strconv"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestCheckDeaths(t *testing.T) {
	// A death as RabbitMQ records it; a retry queue's copies are published
	// with that queue's own key.
	death := func(queue, reason string, keys ...string) amqp.Table {
		if len(keys) == 0 {
			keys = []string{queue}
		}
		rk := make([]any, len(keys))
		for i, k := range keys {
			rk[i] = k
		}
		return amqp.Table{"queue": queue, "reason": reason, "count": int64(1), "exchange": "mesh", "routing-keys": rk}
	}
	retried := func(deaths ...any) amqp.Table {
		return amqp.Table{"x-death": deaths, "x-first-death-queue": "retry.s", codec.HeaderAttempts: "1"}
	}
	tests := []struct {
		name    string
		kind    string
		key     string
		h       amqp.Table
		refused bool
	}{
		{"no deaths", codec.TypeEvent, "evt.a", amqp.Table{codec.HeaderOrigin: "a"}, false},
		{"no headers", codec.TypeCommand, "cmd.s", nil, false},
		{"event rejected in a node's queue", codec.TypeEvent, "evt.a", amqp.Table{"x-death": []any{death("node.b.system", "rejected")}}, true},
		{"event expired in a retry queue", codec.TypeEvent, "evt.a", amqp.Table{"x-death": []any{death("retry.s", "expired")}}, true},
		{"request", codec.TypeRequest, "to.a.req.c", amqp.Table{"x-death": []any{death("q", "rejected")}}, true},
		{"reply", codec.TypeReply, "to.a.reply", amqp.Table{"x-death": []any{death("q", "expired")}}, true},
		{"system message", codec.TypeSystem, "sys.hello", amqp.Table{"x-first-death-queue": "q"}, true},
		{"command back from its retry queue", codec.TypeCommand, "cmd.s", retried(death("retry.s", "expired")), false},
		{"command retried twice", codec.TypeCommand, "cmd.s", retried(death("retry.s", "expired")), false},
		{"command, header names folded", codec.TypeCommand, "cmd.s", amqp.Table{"X-Death": []any{death("retry.s", "expired")}, "meshbox-attempts": "2"}, false},
		{"command without the retry copy's attempts", codec.TypeCommand, "cmd.s", amqp.Table{"x-death": []any{death("retry.s", "expired")}}, true},
		{"command rejected in its retry queue", codec.TypeCommand, "cmd.s", retried(death("retry.s", "rejected")), true},
		{"command from another stage's retry queue", codec.TypeCommand, "cmd.s", retried(death("retry.t", "expired")), true},
		{"command through a node's own queue too", codec.TypeCommand, "cmd.s", retried(death("node.b.events", "rejected"), death("retry.s", "expired")), true},
		{"command, first death elsewhere", codec.TypeCommand, "cmd.s", amqp.Table{"x-death": []any{death("retry.s", "expired")}, "x-first-death-queue": "mine", codec.HeaderAttempts: "1"}, true},
		{"command, x-death not a list", codec.TypeCommand, "cmd.s", amqp.Table{"x-death": "forged", codec.HeaderAttempts: "1"}, true},
		{"command, an entry not a table", codec.TypeCommand, "cmd.s", amqp.Table{"x-death": []any{"x"}, codec.HeaderAttempts: "1"}, true},
		{"command batch", codec.TypeCommandBatch, "cmd.s", retried(death("retry.s", "expired")), true},
		{"stage with dots", codec.TypeCommand, "cmd.a.b", amqp.Table{"x-death": []any{death("retry.a.b", "expired")}, codec.HeaderAttempts: "1"}, false},
		// Planted in the retry queue with CC or BCC by a node whose topic
		// permissions refuse retry.s: the broker recorded the keys it was
		// published with.
		{"command CC'd into the retry queue", codec.TypeCommand, "cmd.s", retried(death("retry.s", "expired", "dead.t", "retry.s")), true},
		{"command BCC'd into the retry queue", codec.TypeCommand, "cmd.s", retried(death("retry.s", "expired", "dead.t")), true},
		{"command re-keyed into the retry queue", codec.TypeCommand, "cmd.s", retried(death("retry.s", "expired", "")), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := codec.CheckDeaths(tt.kind, tt.key, tt.h)
			if got := err != nil; got != tt.refused {
				t.Fatalf("refused: got %v (%v), want %v", got, err, tt.refused)
			}
			if err == nil {
				return
			}
			re := codec.AsReplay(err)
			if re == nil || re.Reason != codec.ReplayDeadLettered {
				t.Fatalf("got %T %v, want a replay refused as %s", err, err, codec.ReplayDeadLettered)
			}
			if want := map[string]string{codec.TypeCommandBatch: codec.TypeCommand}[tt.kind]; want != "" && re.Shape != want {
				t.Errorf("shape: got %s, want %s", re.Shape, want)
			}
		})
	}
}

// TestCarbonCopiesRefused: a delivery with CC (or BCC) keys is refused as
// misrouted, whatever its shape; a dead letter only with its queue's own
// key, and deaths only in its stage's retry queue.
func TestCarbonCopiesRefused(t *testing.T) {
	for _, k := range []string{"CC", "BCC", "cc"} {
		for _, kind := range []string{codec.TypeEvent, codec.TypeCommand, codec.TypeRequest} {
			err := codec.CheckDeaths(kind, "evt.a", amqp.Table{k: []any{"dead.other"}})
			if re := codec.AsReplay(err); re == nil || re.Reason != codec.ReplayMisrouted {
				t.Errorf("%s with %s: got %v, want refused as %s", kind, k, err, codec.ReplayMisrouted)
			}
		}
	}
	retryDeath := amqp.Table{"queue": "retry.s", "reason": "expired", "routing-keys": []any{"retry.s"}}
	letters := []struct {
		name string
		d    amqp.Delivery
		ok   bool
	}{
		{"dead-lettered by a node", amqp.Delivery{RoutingKey: "dead.s", Headers: amqp.Table{codec.HeaderOrigin: "a"}}, true},
		{"after its retries", amqp.Delivery{RoutingKey: "dead.s", Headers: amqp.Table{"x-death": []any{retryDeath}, codec.HeaderAttempts: "3"}}, true},
		{"BCC'd: another key", amqp.Delivery{RoutingKey: "dead.t", Headers: amqp.Table{}}, false},
		{"CC'd", amqp.Delivery{RoutingKey: "dead.s", Headers: amqp.Table{"CC": []any{"dead.s"}}}, false},
		{"re-keyed through a node's queue", amqp.Delivery{RoutingKey: "dead.s", Headers: amqp.Table{codec.HeaderAttempts: "1",
			"x-death": []any{amqp.Table{"queue": "amq.gen-x", "reason": "rejected", "routing-keys": []any{"to.a.req.x"}}}}}, false},
	}
	for _, l := range letters {
		err := codec.CheckDeadLetter("s", &l.d)
		if (err == nil) != l.ok {
			t.Errorf("%s: got %v, want accepted %v", l.name, err, l.ok)
		}
	}
}

// TestDecodeRefusesDeaths: decode, which every shape goes through,
// refuses a dead-lettered delivery as a replay, not as malformed.
func TestDecodeRefusesDeaths(t *testing.T) {
	d := goodDelivery(codec.TypeEvent)
	d.Headers["x-death"] = []any{amqp.Table{"queue": "mine", "reason": "rejected"}}
	_, err := codec.Decode(codec.TypeEvent, d, 100)
	if re := codec.AsReplay(err); re == nil || re.Shape != codec.TypeEvent {
		t.Fatalf("got %v, want an event refused as a replay", err)
	}
}

func TestWithoutDeaths(t *testing.T) {
	h := amqp.Table{"x-death": []any{}, "x-first-death-queue": "q", "X-Last-Death-Reason": "r", codec.HeaderOrigin: "a", "x-delivery-count": int64(2)}
	got := codec.WithoutDeaths(h)
	if len(got) != 2 || got[codec.HeaderOrigin] != "a" || got["x-delivery-count"] != int64(2) {
		t.Fatalf("got %v, want only %s and x-delivery-count", got, codec.HeaderOrigin)
	}
	if len(h) != 5 {
		t.Fatalf("the original changed: %v", h)
	}
}

func TestEventMemory(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	var m codec.EventMemory
	steps := []struct {
		name   string
		origin string
		id     string
		sealed time.Time
		want   string
	}{
		{"first", "a", "e1", now.Add(-time.Second), ""},
		{"again", "a", "e1", now.Add(-time.Second), codec.ReplayDuplicate},
		{"again, sealed anew", "a", "e1", now, codec.ReplayDuplicate},
		{"same id, other origin", "b", "e1", now, ""},
		{"older node, no time", "a", "e2", time.Time{}, ""},
		{"older node, again", "a", "e2", time.Time{}, codec.ReplayDuplicate},
		{"a day in the event queue", "a", "e3", now.Add(-24 * time.Hour), ""},
		{"older than the window", "a", "e4", now.Add(-codec.EventWindow - time.Millisecond), codec.ReplayExpired},
		{"clock ahead", "c", "e5", now.Add(time.Hour), ""},
		{"clock ahead, again", "c", "e5", now.Add(time.Hour), codec.ReplayDuplicate},
	}
	for _, st := range steps {
		if got := m.Admit(st.origin, "t", st.id, st.sealed, now); got != st.want {
			t.Errorf("%s: got %q, want %q", st.name, got, st.want)
		}
	}
	// A week later the first ids are forgotten, and refused as expired.
	later := now.Add(codec.EventWindow + time.Second)
	if got := m.Admit("a", "t", "e1", now.Add(-time.Second), later); got != codec.ReplayExpired {
		t.Errorf("a week later: got %q, want %q", got, codec.ReplayExpired)
	}
	if got := m.Admit("a", "t", "e6", later, later); got != "" {
		t.Errorf("a new event a week later: got %q, want none", got)
	}
	if n := len(m.Set); n != 1 || len(m.Order) != 1 {
		t.Errorf("remembered %d ids in %d, want the newest only", n, len(m.Order))
	}
	// An id names one event per origin and topic: a program that reuses
	// another program's id on its own topic drops nothing of the other's.
	if got := m.Admit("a", "other", "e6", later, later); got != "" {
		t.Errorf("the same id from the same origin on another topic: got %q, want none", got)
	}
}

// TestEventMemoryFull: beyond eventMemoryLen, the oldest by sealing time
// are forgotten and an event sealed at or before them is refused as
// expired; newer ones are still told apart.
func TestEventMemoryFull(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	var m codec.EventMemory
	start := now.Add(-time.Hour)
	for i := range codec.EventMemoryLen + 10 {
		at := start.Add(time.Duration(i) * time.Millisecond)
		if got := m.Admit("a", "t", strconv.Itoa(i), at, now); got != "" {
			t.Fatalf("event %d: got %q, want none", i, got)
		}
	}
	if n := len(m.Set); n != codec.EventMemoryLen {
		t.Fatalf("remembered %d, want %d", n, codec.EventMemoryLen)
	}
	tests := []struct {
		name string
		id   string
		at   time.Time
		want string
	}{
		{"a forgotten one", "3", start.Add(3 * time.Millisecond), codec.ReplayExpired},
		{"a new one as old as the forgotten", "new", start.Add(9 * time.Millisecond), codec.ReplayExpired},
		{"the oldest remembered", "10", start.Add(10 * time.Millisecond), codec.ReplayDuplicate},
		{"a remembered one", "5000", start.Add(5000 * time.Millisecond), codec.ReplayDuplicate},
		{"a new one", "new2", now, ""},
	}
	for _, tt := range tests {
		if got := m.Admit("a", "t", tt.id, tt.at, now); got != tt.want {
			t.Errorf("%s: got %q, want %q", tt.name, got, tt.want)
		}
	}
	// The floor is a's alone: another sender's event sealed as long ago
	// (its clock behind, or its events waiting in this node's queue) is
	// not taken for a forgotten one of a's.
	if got := m.Admit("b", "t", "3", start.Add(3*time.Millisecond), now); got != "" {
		t.Errorf("another origin's event as old as a's forgotten ones: got %q, want none", got)
	}
}
