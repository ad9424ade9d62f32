package flow

import (
	"math"
	"sync/atomic"
	"testing"
	"time"
)

// stageModel is a model of one stage on one node, to drive a StageFlow's rules
// on a clock of its own: the broker has work for the stage at producer
// commands a second at most (0: without end); each delivery's credit comes
// back rtt + AckLinger + the handler's time after it is sent; the handler
// clears capacity commands a second at most (0: without end), each in
// service, at once (parallel) or one after another (serial: what it holds
// waits behind the others).
type stageModel struct {
	f        *StageFlow
	rtt      atomic.Int64
	now      time.Time
	service  time.Duration
	capacity float64
	producer float64
	serial   bool
	perMsg   int // commands a message carries
	due      float64
	level    int  // commands at the handler now
	started  bool // the handler answered once: its first command waited behind nothing
}

func newStageModel(prefetch, batch, ceiling int, rtt, service time.Duration) *stageModel {
	m := &stageModel{now: time.Unix(1_000_000, 0), service: service, perMsg: batch}
	m.rtt.Store(int64(rtt))
	m.f = NewStageFlow("s", prefetch, batch, ceiling, 0, &m.rtt)
	return m
}

// credit is the credit the flow wants, in commands.
func (m *stageModel) credit() int { return m.f.Wanted() * m.perMsg }

// rate is the commands a second the model clears at the flow's credit.
func (m *stageModel) rate() float64 {
	cycle := time.Duration(m.rtt.Load()) + AckLinger + m.service
	r := float64(m.credit()) / cycle.Seconds()
	if m.capacity > 0 {
		r = min(r, m.capacity)
	}
	if m.producer > 0 {
		r = min(r, m.producer)
	}
	return r
}

// run moves the model d further in steps of 5 ms and returns the credit
// changes the flow asked for on the way.
func (m *stageModel) run(d time.Duration) (changes int) {
	const step = 5 * time.Millisecond
	for end := m.now.Add(d); m.now.Before(end); m.now = m.now.Add(step) {
		r := m.rate()
		// At the handler: a serial one holds what the credit brings
		// beyond what it clears; a parallel one what arrives in a service.
		want := int(math.Round(r * m.service.Seconds()))
		lat := m.service
		if m.capacity > 0 && r >= m.capacity*0.99 {
			// At its pace: what the credit brings beyond what the link
			// holds waits at the handler.
			want = max(want, m.credit()-int(r*(time.Duration(m.rtt.Load())+AckLinger).Seconds()))
			if m.serial {
				lat = time.Duration(want) * m.service
			} else {
				lat = m.service + time.Duration(float64(time.Second)*float64(want)/m.capacity)
			}
		}
		for ; m.level < want; m.level++ {
			m.f.Delivered()
		}
		for ; m.level > want; m.level-- {
			m.f.Gone()
		}
		m.due += r * step.Seconds()
		for ; m.due >= 1; m.due-- {
			if int(m.due)%m.perMsg == 0 {
				m.f.DeliveredMsg(m.perMsg)
			}
			m.f.Delivered()
			if !m.started {
				m.started = true
				if m.f.Answered(m.service, m.now) {
					changes++
				}
				continue
			}
			if m.f.Answered(lat, m.now) {
				changes++
			}
		}
	}
	return changes
}

// A handler that works one command at a time, 50 ms each, never gains
// credit beyond Prefetch, however deep the queue: more credit would only
// wait at it.
func TestStageFlowSerialSlowHandlerStaysAtPrefetch(t *testing.T) {
	for _, rtt := range []time.Duration{100 * time.Microsecond, 50 * time.Millisecond} {
		m := newStageModel(32, 1, 4096, rtt, 50*time.Millisecond)
		m.serial, m.capacity = true, 20
		m.run(30 * time.Second)
		if got := m.credit(); got != 32 {
			t.Errorf("rtt %v: credit of a slow serial handler %d commands, want 32 (Prefetch)", rtt, got)
		}
	}
}

// A quick handler behind a 50 ms round trip: the credit grows to what the
// link needs for the handler's pace (twice rate x cycle) within a couple
// of seconds, and then holds: no change in the next 30 s.
func TestStageFlowFillsTheLink(t *testing.T) {
	m := newStageModel(32, 1, 4096, 50*time.Millisecond, 200*time.Microsecond)
	m.capacity = 20_000
	m.run(3 * time.Second)
	cycle := 50*time.Millisecond + AckLinger + 200*time.Microsecond
	bdp := 20_000 * cycle.Seconds()
	if got := float64(m.credit()); got < bdp || got > 3*bdp {
		t.Fatalf("credit after 3s: %.0f commands, want between %.0f (rate x cycle) and %.0f", got, bdp, 3*bdp)
	}
	if r := m.rate(); r < 0.99*m.capacity {
		t.Fatalf("rate at that credit: %.0f/s, want the handler's %.0f/s", r, m.capacity)
	}
	if n := m.run(30 * time.Second); n != 0 {
		t.Fatalf("%d credit changes in 30 s at a steady pace, want none", n)
	}
	if got := float64(m.credit()); got < bdp || got > 3*bdp {
		t.Fatalf("credit after a minute: %.0f commands, want between %.0f and %.0f", got, bdp, 3*bdp)
	}
}

// The same pace with the ceiling below what the link needs: credit stops
// at MaxStagePrefetch commands, counted in commands whatever the batches.
func TestStageFlowCeilingInCommands(t *testing.T) {
	m := newStageModel(32, 4, 512, 50*time.Millisecond, 200*time.Microsecond)
	m.capacity = 20_000
	m.run(5 * time.Second)
	if got := m.credit(); got != 512 {
		t.Fatalf("credit with batches of 4 and a ceiling of 512 commands: %d commands (%d messages), want 512", got, m.f.Wanted())
	}
	if n := m.run(10 * time.Second); n != 0 {
		t.Fatalf("%d changes at the ceiling, want none", n)
	}
}

// A handler that answers in 50 ms however many commands it has (it works
// on them in parallel) gains credit while it holds it all: more credit is
// more throughput, not a longer wait.
func TestStageFlowParallelHandlerGains(t *testing.T) {
	m := newStageModel(32, 1, 4096, 100*time.Microsecond, 50*time.Millisecond)
	m.capacity = 4000
	m.run(5 * time.Second)
	if got, r := m.credit(), m.rate(); r < 0.99*m.capacity {
		t.Fatalf("parallel 50 ms handler: credit %d, rate %.0f/s, want its %.0f/s", got, r, m.capacity)
	}
}

// When the producer, not the credit, bounds the pace (a loopback link, a
// quick handler, few submitters), the credit stays put: nothing waits at
// the handler and the link needs little.
func TestStageFlowHoldsWhenCreditIsNotTheLimit(t *testing.T) {
	m := newStageModel(32, 1, 4096, 100*time.Microsecond, 100*time.Microsecond)
	m.producer = 5000
	m.run(2 * time.Second)
	if n := m.run(60 * time.Second); n != 0 {
		t.Fatalf("%d credit changes in a minute with the producer as the bound, want none", n)
	}
	if got := m.credit(); got > 64 {
		t.Fatalf("credit %d commands with nothing to gain, want about Prefetch", got)
	}
}

// A handler that slows down for good (its work now takes 200 ms, one at a
// time) gives credit back: halved after three slow windows, down to
// Prefetch.
func TestStageFlowGivesCreditBackToASlowHandler(t *testing.T) {
	m := newStageModel(32, 1, 4096, 100*time.Microsecond, 200*time.Microsecond)
	m.capacity = 4000
	m.run(3 * time.Second)
	if got := m.credit(); got <= 32 {
		t.Fatalf("credit of a quick parallel handler %d, want it above Prefetch", got)
	}
	m.serial, m.capacity, m.service = true, 5, 200*time.Millisecond
	m.run(60 * time.Second)
	if got := m.credit(); got != 32 {
		t.Fatalf("credit after the handler slowed down: %d commands, want 32 (Prefetch)", got)
	}
}

// Bursts: a second of work, a second of nothing, over and over. The
// credit reached in a burst stays through the idle second (no ramp per
// burst) and does not swing.
func TestStageFlowStableUnderBursts(t *testing.T) {
	m := newStageModel(32, 1, 4096, 50*time.Millisecond, 200*time.Microsecond)
	m.capacity = 10_000
	m.run(3 * time.Second)
	reached := m.credit()
	changes := 0
	for range 10 {
		m.producer = 0
		changes += m.run(time.Second)
		if got := m.credit(); got < reached/2 {
			t.Fatalf("credit in a burst %d, had reached %d: it lost the link's credit between bursts", got, reached)
		}
		m.producer = 1e-9 // idle: nothing for the stage
		changes += m.run(time.Second)
	}
	if changes > 2 {
		t.Fatalf("%d credit changes over 10 bursts, want it to hold", changes)
	}
}

// A fixed credit (MaxStagePrefetch = Prefetch) never changes: one consumer
// of Prefetch/CommandBatch messages keeps the queue's order.
func TestStageFlowFixedCredit(t *testing.T) {
	m := newStageModel(64, 4, 64, 50*time.Millisecond, 100*time.Microsecond)
	if !m.f.Fixed || m.f.Wanted() != 16 {
		t.Fatalf("a fixed credit of 64 with batches of 4: fixed %v, %d messages; want fixed, 16", m.f.Fixed, m.f.Wanted())
	}
	m.capacity = 20_000
	if n := m.run(5 * time.Second); n != 0 || m.f.Wanted() != 16 {
		t.Fatalf("a fixed credit changed %d times, to %d messages", n, m.f.Wanted())
	}
}

// A new session starts from the credit the last one reached, within the
// bounds.
func TestStageFlowStartsFromTheLastSession(t *testing.T) {
	var rtt atomic.Int64
	if got := NewStageFlow("s", 32, 1, 4096, 900, &rtt).Wanted(); got != 900 {
		t.Fatalf("started at %d messages, want 900", got)
	}
	if got := NewStageFlow("s", 32, 1, 256, 900, &rtt).Wanted(); got != 256 {
		t.Fatalf("started at %d messages past a ceiling of 256, want 256", got)
	}
	if got := NewStageFlow("s", 32, 1, 32, 900, &rtt).Wanted(); got != 32 {
		t.Fatalf("a fixed credit started at %d, want 32", got)
	}
}
