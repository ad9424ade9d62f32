package bridge

import (
	"strconv"
	"testing"
	"time"

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
		return amqp.Table{"x-death": deaths, "x-first-death-queue": "retry.s", HeaderAttempts: "1"}
	}
	tests := []struct {
		name    string
		kind    string
		key     string
		h       amqp.Table
		refused bool
	}{
		{"no deaths", typeEvent, "evt.a", amqp.Table{HeaderOrigin: "a"}, false},
		{"no headers", typeCommand, "cmd.s", nil, false},
		{"event rejected in a node's queue", typeEvent, "evt.a", amqp.Table{"x-death": []any{death("node.b.system", "rejected")}}, true},
		{"event expired in a retry queue", typeEvent, "evt.a", amqp.Table{"x-death": []any{death("retry.s", "expired")}}, true},
		{"request", typeRequest, "to.a.req.c", amqp.Table{"x-death": []any{death("q", "rejected")}}, true},
		{"reply", typeReply, "to.a.reply", amqp.Table{"x-death": []any{death("q", "expired")}}, true},
		{"system message", typeSystem, "sys.hello", amqp.Table{"x-first-death-queue": "q"}, true},
		{"command back from its retry queue", typeCommand, "cmd.s", retried(death("retry.s", "expired")), false},
		{"command retried twice", typeCommand, "cmd.s", retried(death("retry.s", "expired")), false},
		{"command, header names folded", typeCommand, "cmd.s", amqp.Table{"X-Death": []any{death("retry.s", "expired")}, "meshbox-attempts": "2"}, false},
		{"command without the retry copy's attempts", typeCommand, "cmd.s", amqp.Table{"x-death": []any{death("retry.s", "expired")}}, true},
		{"command rejected in its retry queue", typeCommand, "cmd.s", retried(death("retry.s", "rejected")), true},
		{"command from another stage's retry queue", typeCommand, "cmd.s", retried(death("retry.t", "expired")), true},
		{"command through a node's own queue too", typeCommand, "cmd.s", retried(death("node.b.events", "rejected"), death("retry.s", "expired")), true},
		{"command, first death elsewhere", typeCommand, "cmd.s", amqp.Table{"x-death": []any{death("retry.s", "expired")}, "x-first-death-queue": "mine", HeaderAttempts: "1"}, true},
		{"command, x-death not a list", typeCommand, "cmd.s", amqp.Table{"x-death": "forged", HeaderAttempts: "1"}, true},
		{"command, an entry not a table", typeCommand, "cmd.s", amqp.Table{"x-death": []any{"x"}, HeaderAttempts: "1"}, true},
		{"command batch", typeCommandBatch, "cmd.s", retried(death("retry.s", "expired")), true},
		{"stage with dots", typeCommand, "cmd.a.b", amqp.Table{"x-death": []any{death("retry.a.b", "expired")}, HeaderAttempts: "1"}, false},
		// Planted in the retry queue with CC or BCC by a node whose topic
		// permissions refuse retry.s: the broker recorded the keys it was
		// published with.
		{"command CC'd into the retry queue", typeCommand, "cmd.s", retried(death("retry.s", "expired", "dead.t", "retry.s")), true},
		{"command BCC'd into the retry queue", typeCommand, "cmd.s", retried(death("retry.s", "expired", "dead.t")), true},
		{"command re-keyed into the retry queue", typeCommand, "cmd.s", retried(death("retry.s", "expired", "")), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkDeaths(tt.kind, tt.key, tt.h)
			if got := err != nil; got != tt.refused {
				t.Fatalf("refused: got %v (%v), want %v", got, err, tt.refused)
			}
			if err == nil {
				return
			}
			re := asReplay(err)
			if re == nil || re.reason != replayDeadLettered {
				t.Fatalf("got %T %v, want a replay refused as %s", err, err, replayDeadLettered)
			}
			if want := map[string]string{typeCommandBatch: typeCommand}[tt.kind]; want != "" && re.shape != want {
				t.Errorf("shape: got %s, want %s", re.shape, want)
			}
		})
	}
}

// TestCarbonCopiesRefused: a delivery with CC (or BCC) keys is refused as
// misrouted, whatever its shape; a dead letter only with its queue's own
// key, and deaths only in its stage's retry queue.
func TestCarbonCopiesRefused(t *testing.T) {
	for _, k := range []string{"CC", "BCC", "cc"} {
		for _, kind := range []string{typeEvent, typeCommand, typeRequest} {
			err := checkDeaths(kind, "evt.a", amqp.Table{k: []any{"dead.other"}})
			if re := asReplay(err); re == nil || re.reason != replayMisrouted {
				t.Errorf("%s with %s: got %v, want refused as %s", kind, k, err, replayMisrouted)
			}
		}
	}
	retryDeath := amqp.Table{"queue": "retry.s", "reason": "expired", "routing-keys": []any{"retry.s"}}
	letters := []struct {
		name string
		d    amqp.Delivery
		ok   bool
	}{
		{"dead-lettered by a node", amqp.Delivery{RoutingKey: "dead.s", Headers: amqp.Table{HeaderOrigin: "a"}}, true},
		{"after its retries", amqp.Delivery{RoutingKey: "dead.s", Headers: amqp.Table{"x-death": []any{retryDeath}, HeaderAttempts: "3"}}, true},
		{"BCC'd: another key", amqp.Delivery{RoutingKey: "dead.t", Headers: amqp.Table{}}, false},
		{"CC'd", amqp.Delivery{RoutingKey: "dead.s", Headers: amqp.Table{"CC": []any{"dead.s"}}}, false},
		{"re-keyed through a node's queue", amqp.Delivery{RoutingKey: "dead.s", Headers: amqp.Table{HeaderAttempts: "1",
			"x-death": []any{amqp.Table{"queue": "amq.gen-x", "reason": "rejected", "routing-keys": []any{"to.a.req.x"}}}}}, false},
	}
	for _, l := range letters {
		err := checkDeadLetter("s", &l.d)
		if (err == nil) != l.ok {
			t.Errorf("%s: got %v, want accepted %v", l.name, err, l.ok)
		}
	}
}

// TestDecodeRefusesDeaths: decode, which every shape goes through,
// refuses a dead-lettered delivery as a replay, not as malformed.
func TestDecodeRefusesDeaths(t *testing.T) {
	d := goodDelivery(typeEvent)
	d.Headers["x-death"] = []any{amqp.Table{"queue": "mine", "reason": "rejected"}}
	_, err := decode(typeEvent, d, 100)
	if re := asReplay(err); re == nil || re.shape != typeEvent {
		t.Fatalf("got %v, want an event refused as a replay", err)
	}
}

func TestWithoutDeaths(t *testing.T) {
	h := amqp.Table{"x-death": []any{}, "x-first-death-queue": "q", "X-Last-Death-Reason": "r", HeaderOrigin: "a", "x-delivery-count": int64(2)}
	got := withoutDeaths(h)
	if len(got) != 2 || got[HeaderOrigin] != "a" || got["x-delivery-count"] != int64(2) {
		t.Fatalf("got %v, want only %s and x-delivery-count", got, HeaderOrigin)
	}
	if len(h) != 5 {
		t.Fatalf("the original changed: %v", h)
	}
}

func TestEventMemory(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	var m eventMemory
	steps := []struct {
		name   string
		origin string
		id     string
		sealed time.Time
		want   string
	}{
		{"first", "a", "e1", now.Add(-time.Second), ""},
		{"again", "a", "e1", now.Add(-time.Second), replayDuplicate},
		{"again, sealed anew", "a", "e1", now, replayDuplicate},
		{"same id, other origin", "b", "e1", now, ""},
		{"older node, no time", "a", "e2", time.Time{}, ""},
		{"older node, again", "a", "e2", time.Time{}, replayDuplicate},
		{"a day in the event queue", "a", "e3", now.Add(-24 * time.Hour), ""},
		{"older than the window", "a", "e4", now.Add(-eventWindow - time.Millisecond), replayExpired},
		{"clock ahead", "c", "e5", now.Add(time.Hour), ""},
		{"clock ahead, again", "c", "e5", now.Add(time.Hour), replayDuplicate},
	}
	for _, st := range steps {
		if got := m.admit(st.origin, "t", st.id, st.sealed, now); got != st.want {
			t.Errorf("%s: got %q, want %q", st.name, got, st.want)
		}
	}
	// A week later the first ids are forgotten, and refused as expired.
	later := now.Add(eventWindow + time.Second)
	if got := m.admit("a", "t", "e1", now.Add(-time.Second), later); got != replayExpired {
		t.Errorf("a week later: got %q, want %q", got, replayExpired)
	}
	if got := m.admit("a", "t", "e6", later, later); got != "" {
		t.Errorf("a new event a week later: got %q, want none", got)
	}
	if n := len(m.set); n != 1 || len(m.order) != 1 {
		t.Errorf("remembered %d ids in %d, want the newest only", n, len(m.order))
	}
	// An id names one event per origin and topic: a program that reuses
	// another program's id on its own topic drops nothing of the other's.
	if got := m.admit("a", "other", "e6", later, later); got != "" {
		t.Errorf("the same id from the same origin on another topic: got %q, want none", got)
	}
}

// TestEventMemoryFull: beyond eventMemoryLen, the oldest by sealing time
// are forgotten and an event sealed at or before them is refused as
// expired; newer ones are still told apart.
func TestEventMemoryFull(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	var m eventMemory
	start := now.Add(-time.Hour)
	for i := range eventMemoryLen + 10 {
		at := start.Add(time.Duration(i) * time.Millisecond)
		if got := m.admit("a", "t", strconv.Itoa(i), at, now); got != "" {
			t.Fatalf("event %d: got %q, want none", i, got)
		}
	}
	if n := len(m.set); n != eventMemoryLen {
		t.Fatalf("remembered %d, want %d", n, eventMemoryLen)
	}
	tests := []struct {
		name string
		id   string
		at   time.Time
		want string
	}{
		{"a forgotten one", "3", start.Add(3 * time.Millisecond), replayExpired},
		{"a new one as old as the forgotten", "new", start.Add(9 * time.Millisecond), replayExpired},
		{"the oldest remembered", "10", start.Add(10 * time.Millisecond), replayDuplicate},
		{"a remembered one", "5000", start.Add(5000 * time.Millisecond), replayDuplicate},
		{"a new one", "new2", now, ""},
	}
	for _, tt := range tests {
		if got := m.admit("a", "t", tt.id, tt.at, now); got != tt.want {
			t.Errorf("%s: got %q, want %q", tt.name, got, tt.want)
		}
	}
	// The floor is a's alone: another sender's event sealed as long ago
	// (its clock behind, or its events waiting in this node's queue) is
	// not taken for a forgotten one of a's.
	if got := m.admit("b", "t", "3", start.Add(3*time.Millisecond), now); got != "" {
		t.Errorf("another origin's event as old as a's forgotten ones: got %q, want none", got)
	}
}
