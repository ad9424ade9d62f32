package ledger

import (
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshbox/meshbox/testing/meshtest/natstest"
	"github.com/nats-io/nats.go"
)

func TestChecker(t *testing.T) {
	a := func(seq int) Op { return Op{"alpha", seq} }
	d := func(seq int, marked bool) Delivery {
		return Delivery{Op: a(seq), Node: "beta", MsgID: "id" + strconv.Itoa(seq), Marked: marked}
	}
	tests := []struct {
		name       string
		ops        map[Op]Outcome
		ds         []Delivery
		valid      bool
		lost       int
		dupMarked  int
		dupUnmark  int
		unexpected int
		idChanged  int
		inversions int
		indetDeliv int
	}{
		{name: "clean", ops: map[Op]Outcome{a(1): Acked, a(2): Acked},
			ds: []Delivery{d(1, false), d(2, false)}, valid: true},
		{name: "lost", ops: map[Op]Outcome{a(1): Acked, a(2): Acked},
			ds: []Delivery{d(2, false)}, lost: 1},
		{name: "marked duplicate", ops: map[Op]Outcome{a(1): Acked},
			ds: []Delivery{d(1, false), d(1, true)}, valid: true, dupMarked: 1},
		{name: "unmarked duplicate", ops: map[Op]Outcome{a(1): Acked},
			ds: []Delivery{d(1, false), d(1, false)}, dupUnmark: 1},
		{name: "duplicate with another id", ops: map[Op]Outcome{a(1): Acked},
			ds: []Delivery{d(1, false), {Op: a(1), Node: "beta", MsgID: "other", Marked: true}}, dupMarked: 1, idChanged: 1},
		{name: "refused but delivered", ops: map[Op]Outcome{a(1): Refused},
			ds: []Delivery{d(1, false)}, unexpected: 1},
		{name: "never submitted", ops: map[Op]Outcome{a(1): Acked},
			ds: []Delivery{d(1, false), d(7, false)}, unexpected: 1},
		{name: "not a payload", ops: map[Op]Outcome{},
			ds: []Delivery{{Bad: true, Node: "beta"}}, unexpected: 1},
		{name: "indeterminate either way", ops: map[Op]Outcome{a(1): Indeterminate, a(2): Indeterminate},
			ds: []Delivery{d(2, false)}, valid: true, indetDeliv: 1},
		{name: "out of order", ops: map[Op]Outcome{a(1): Acked, a(2): Acked, a(3): Acked},
			ds: []Delivery{d(2, false), d(1, false), d(3, false)}, valid: true, inversions: 1},
		{name: "redelivery does not count as inversion", ops: map[Op]Outcome{a(1): Acked, a(2): Acked},
			ds: []Delivery{d(1, false), d(2, false), d(1, true)}, valid: true, dupMarked: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Check(tt.ops, tt.ds)
			got := []int{len(r.Lost), r.DupMarked, len(r.DupUnmarked), len(r.Unexpected), len(r.IDChanged), r.TotalInversions(), r.IndeterminateDelivered}
			want := []int{tt.lost, tt.dupMarked, tt.dupUnmark, tt.unexpected, tt.idChanged, tt.inversions, tt.indetDeliv}
			if !slices.Equal(got, want) {
				t.Errorf("lost, dup marked, dup unmarked, unexpected, id changed, inversions, indeterminate delivered: got %v, want %v\n%s", got, want, r)
			}
			if r.Valid() != tt.valid {
				t.Errorf("valid: got %t, want %t\n%s", r.Valid(), tt.valid, r)
			}
		})
	}
}

func TestPayloadRoundTrip(t *testing.T) {
	k, ok := ParsePayload(Payload("alpha", 42))
	if !ok || k != (Op{"alpha", 42}) {
		t.Fatalf("ParsePayload(Payload(alpha, 42)): got %v %t, want alpha:42 true", k, ok)
	}
	k, ok = ParsePayload(PaddedPayload("beta", 7, 100))
	if !ok || k != (Op{"beta", 7}) {
		t.Fatalf("ParsePayload(PaddedPayload(beta, 7, 100)): got %v %t, want beta:7 true", k, ok)
	}
	for _, bad := range []string{"", "alpha", ":1", "alpha:x", "alpha:-1", "alpha:1x|"} {
		if _, ok := ParsePayload([]byte(bad)); ok {
			t.Errorf("ParsePayload(%q): got ok, want not a payload", bad)
		}
	}
}

func TestDeliveryOf(t *testing.T) {
	m := &nats.Msg{Data: PaddedPayload("alpha", 3, 40), Header: nats.Header{"Meshbox-Msg-Id": {"m3"}, "Meshbox-Redelivered": {"true"}}}
	want := Delivery{Op: Op{"alpha", 3}, Node: "beta", MsgID: "m3", Marked: true}
	if got := DeliveryOf("beta", m); got != want {
		t.Errorf("DeliveryOf: got %v, want %v", got, want)
	}
	if got := DeliveryOf("beta", &nats.Msg{Data: []byte("junk")}); !got.Bad || got.Node != "beta" {
		t.Errorf("DeliveryOf a body that is no payload: got %v, want bad on beta", got)
	}
}

func TestSubmitOutcomes(t *testing.T) {
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	if _, err := nc.Subscribe("cmd.>", func(m *nats.Msg) {
		r := nats.NewMsg(m.Reply)
		switch m.Subject {
		case "cmd.ok":
			r.Header.Set("Meshbox-Accepted", "broker")
		case "cmd.refused":
			r.Header.Set("Nats-Service-Error-Code", "503")
			r.Header.Set("Nats-Service-Error", "no node hosts stage refused")
		case "cmd.mute":
			return
		}
		_ = m.RespondMsg(r)
	}); err != nil {
		t.Fatal(err)
	}
	for subject, want := range map[string]Outcome{"cmd.ok": Acked, "cmd.refused": Refused, "cmd.bare": Indeterminate, "cmd.mute": Indeterminate} {
		o, _, err := Submit(nc, subject, Payload("alpha", 1), 200*time.Millisecond)
		if o != want || (o == Indeterminate) != (err != nil) {
			t.Errorf("Submit to %s: got %v (%v), want %v", subject, o, err, want)
		}
	}
}

func TestTally(t *testing.T) {
	if got := (Tally{}).String(); got != "none" {
		t.Errorf("empty tally: got %q, want none", got)
	}
	tl := Tally{}
	for _, answer := range []string{"503 node 12 gone", "503 node 34 gone", "507 outbox full"} {
		tl[Clip(answer)]++
	}
	if got, want := tl.String(), `2× "### node ## gone", 1× "### outbox full"`; got != want {
		t.Errorf("tally: got %q, want %q (numbers blanked, largest first)", got, want)
	}
}

// TestLoadHold: a load whose gate is held submits nothing until it is
// released, then goes on; a run told to stop while held still ends
// (control: a load whose gate is open submits).
func TestLoadHold(t *testing.T) {
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	var got atomic.Int64
	if _, err := nc.Subscribe("cmd.load", func(m *nats.Msg) {
		got.Add(1)
		r := nats.NewMsg(m.Reply)
		r.Header.Set("Meshbox-Accepted", "broker")
		_ = m.RespondMsg(r)
	}); err != nil {
		t.Fatal(err)
	}
	gate := &Gate{}
	l := &Load{NC: nc, Subject: "cmd.load", Origin: "alpha", History: NewHistory(), Gate: gate}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Run(2, 1000, 0, 1_000_000, stop)
	}()
	waitCount := func(what string, cond func(int64) bool) int64 {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for n := got.Load(); ; n = got.Load() {
			if cond(n) {
				return n
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d submissions", what, n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitCount("the load running", func(n int64) bool { return n >= 20 })
	gate.Hold()
	// The submissions in flight end: the count stays the same for 100 ms
	// (within 5 s: a load that does not hold never settles).
	at := got.Load()
	for stable, end := time.Now(), time.Now().Add(5*time.Second); time.Since(stable) < 100*time.Millisecond && time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if n := got.Load(); n != at {
			at, stable = n, time.Now()
		}
	}
	time.Sleep(200 * time.Millisecond) // at the load's rate, 200 more
	if n := got.Load(); n != at {
		t.Errorf("held: %d submissions went on after the hold, want none", n-at)
	}
	gate.Release()
	waitCount("the load going on after release", func(n int64) bool { return n >= at+20 })
	gate.Hold()
	close(stop)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a held run told to stop did not end")
	}
}
