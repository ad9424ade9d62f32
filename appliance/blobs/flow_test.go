package blobs

import (
	"fmt"
	"sort"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// TestFlowBeforeMeasuring: a fetch that has measured nothing assumes a
// 256 kbit/s link: two of the smallest requests in flight, each with a
// deadline that covers them on such a link.
func TestFlowBeforeMeasuring(t *testing.T) {
	fl := newFlow(DefaultWindow * ChunkSize)
	if got := fl.window(); got != 2*minPiece {
		t.Errorf("window: got %d, want %d", got, 2*minPiece)
	}
	if got := fl.piece(); got != minPiece {
		t.Errorf("piece: got %d, want %d", got, minPiece)
	}
	for i := range 2 {
		if !fl.room(minPiece, t0) {
			t.Fatalf("request %d: no room, want room for two", i)
		}
		d := fl.deadline(minPiece, t0)
		// At 256 kbit/s the request and the ones ahead of it take this.
		need := time.Duration(float64((i+1)*minPiece) / 32_000 * float64(time.Second))
		if d < need || d < minDeadline {
			t.Errorf("request %d: deadline %s, want at least %s and %s", i, d, need, minDeadline)
		}
		fl.sent(minPiece, t0)
	}
	if fl.room(minPiece, t0) {
		t.Error("a third request has room, want two at most")
	}
}

// TestFlowIdleLinkTakesOneRequest: a request larger than the window
// (a whole chunk, from an owner that serves no parts) goes when nothing
// is in flight, and alone.
func TestFlowIdleLinkTakesOneRequest(t *testing.T) {
	fl := newFlow(DefaultWindow * ChunkSize)
	if !fl.room(ChunkSize, t0) {
		t.Fatal("an idle link has no room for a chunk")
	}
	fl.sent(ChunkSize, t0)
	if fl.room(ChunkSize, t0) {
		t.Error("a second chunk has room beyond the window")
	}
	if d, need := fl.deadline(ChunkSize, t0), 2*ChunkSize*time.Second/32_000; d < need {
		t.Errorf("deadline of a chunk behind a chunk: got %s, want at least %s (256 kbit/s)", d, need)
	}
}

// linkSim is a link that carries replies one after another at rate bytes
// per second, rtt apart from the fetch: a request's reply leaves the owner
// when it arrived there and the replies ahead of it left.
type linkSim struct {
	rate float64
	rtt  time.Duration
	free time.Time // when the owner's uplink is next idle
	// From slowAt on (when set), the link carries slowRate.
	slowAt   time.Time
	slowRate float64
}

// reply is when the reply of n bytes asked for at sent arrives.
func (l *linkSim) reply(sent time.Time, n int) time.Time {
	start := sent.Add(l.rtt / 2)
	if l.free.After(start) {
		start = l.free
	}
	rate := l.rate
	if !l.slowAt.IsZero() && !start.Before(l.slowAt) {
		rate = l.slowRate
	}
	l.free = start.Add(time.Duration(float64(n) / rate * float64(time.Second)))
	return l.free.Add(l.rtt / 2)
}

type simRequest struct {
	n        int
	sent, at time.Time
	deadline time.Duration
}

// event is when the fetch hears of r: its reply, or its deadline.
func (r simRequest) event() time.Time {
	if dl := r.sent.Add(r.deadline); dl.Before(r.at) {
		return dl
	}
	return r.at
}

// simulate runs a fetch of total bytes over link with a flow and returns
// the requests in the order they were answered, how many timed out and
// when the last one arrived. A request whose reply comes after its deadline is timed out
// (and asked again), as a fetch does.
func simulate(fl *flow, link *linkSim, total int) (done []simRequest, timedOut int, end time.Time) {
	now, left := t0, total
	var inflight []simRequest
	for left > 0 || len(inflight) > 0 {
		for left > 0 {
			n := min(fl.piece(), left)
			if !fl.room(n, now) {
				break
			}
			r := simRequest{n: n, sent: now, deadline: fl.deadline(n, now)}
			r.at = link.reply(now, n)
			fl.sent(n, now)
			inflight = append(inflight, r)
			left -= n
		}
		if len(inflight) == 0 { // held back by ghosts
			now = fl.nextChange(now)
			continue
		}
		// The next event: a reply, or a deadline that passes first.
		sort.Slice(inflight, func(i, j int) bool { return inflight[i].event().Before(inflight[j].event()) })
		r := inflight[0]
		inflight = inflight[1:]
		if dl := r.sent.Add(r.deadline); r.at.After(dl) {
			now = dl
			fl.timedOut(r.n, now)
			timedOut++
			left += r.n
			continue
		}
		now = r.at
		fl.arrived(r.n, r.n, r.at.Sub(r.sent), now)
		done = append(done, r)
	}
	return done, timedOut, now
}

// TestFlowFollowsTheLink: over steady links from 64 kbit/s to loopback
// speed, a fetch keeps the link busy, no reply comes after its deadline,
// and a reply waits about queueTarget behind the others, not longer; the
// window and the requests shrink on a slow link and grow on a fast one.
func TestFlowFollowsTheLink(t *testing.T) {
	tests := []struct {
		bits      float64 // per second
		rtt       time.Duration
		total     int
		piece     int // once measured
		minUse    float64
		wantFull  bool // the window at its largest
		maxLatent time.Duration
	}{
		{64e3, 50 * time.Millisecond, 256 << 10, minPiece, 0.95, false, 6 * time.Second},
		{256e3, 50 * time.Millisecond, 1 << 20, minPiece, 0.95, false, 2 * time.Second},
		{1e6, 50 * time.Millisecond, 5 << 20, 32 << 10, 0.97, false, 2 * time.Second},
		{10e6, 50 * time.Millisecond, 20 << 20, ChunkSize, 0.95, true, 2 * time.Second},
		{8e9, 200 * time.Microsecond, 64 << 20, ChunkSize, 0.9, true, 50 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%.0fkbit", tt.bits/1000), func(t *testing.T) {
			fl := newFlow(DefaultWindow * ChunkSize)
			link := &linkSim{rate: tt.bits / 8, rtt: tt.rtt}
			done, timedOut, end := simulate(fl, link, tt.total)
			if timedOut > 0 {
				t.Errorf("%d replies came after their deadline, want none", timedOut)
			}
			floor := float64(tt.total) / link.rate
			if use := floor / end.Sub(t0).Seconds(); use < tt.minUse {
				t.Errorf("the link was busy %.0f%% of the fetch, want at least %.0f%%", 100*use, 100*tt.minUse)
			}
			if got := fl.piece(); got != tt.piece {
				t.Errorf("piece once measured: got %d, want %d", got, tt.piece)
			}
			if full := fl.window() == DefaultWindow*ChunkSize; full != tt.wantFull {
				t.Errorf("window once measured: got %d (at its largest: %v), want at its largest: %v", fl.window(), full, tt.wantFull)
			}
			if got, want := fl.rate(), link.rate; got < 0.8*want || got > 1.05*want {
				t.Errorf("rate: got %.0f B/s, want about %.0f", got, want)
			}
			var worst time.Duration
			for _, r := range done[len(done)/2:] { // once measured
				worst = max(worst, r.at.Sub(r.sent))
			}
			if worst > tt.maxLatent {
				t.Errorf("a reply took %s from request to arrival, want at most %s", worst, tt.maxLatent)
			}
		})
	}
}

// TestFlowLinkSlowsDown: a link that drops from 1 Mbit/s to an eighth of
// that in the middle of a fetch costs a few deadlines, and the fetch goes
// on at the new rate without filling the link with late replies.
func TestFlowLinkSlowsDown(t *testing.T) {
	fl := newFlow(DefaultWindow * ChunkSize)
	link := &linkSim{rate: 125_000, rtt: 50 * time.Millisecond, slowAt: t0.Add(10 * time.Second), slowRate: 15_625}
	const total = 2 << 20
	done, timedOut, end := simulate(fl, link, total)
	if timedOut > 3 {
		t.Errorf("%d replies came after their deadline, want at most 3", timedOut)
	}
	sent := 0
	for _, r := range done {
		sent += r.n
	}
	if sent != total {
		t.Errorf("answered %d bytes, want %d", sent, total)
	}
	// The floor: 10 s at the first rate, the rest at the second.
	floor := 10 + (float64(total)-10*125_000)/15_625
	if took := end.Sub(t0).Seconds(); took > 1.1*floor {
		t.Errorf("the fetch took %.1f s, want at most 1.1 x the floor of %.1f s", took, floor)
	}
	t.Logf("%d deadlines passed; %.1f s for a floor of %.1f s", timedOut, end.Sub(t0).Seconds(), floor)
	if got := fl.rate(); got > 1.05*15_625 || got < 0.5*15_625 {
		t.Errorf("rate at the end: got %.0f B/s, want about 15625", got)
	}
}

// TestFlowSlowerAfterDeadline: a deadline that passes halves the rate
// (and the window), its bytes count as still on their way until they
// would have arrived at the new rate, and nothing is asked for again
// while they fill the window.
func TestFlowSlowerAfterDeadline(t *testing.T) {
	fl := newFlow(DefaultWindow * ChunkSize)
	now := t0
	for range flowSamples { // a steady 125 kB/s, one 32 KiB reply at a time
		fl.sent(32<<10, now)
		now = now.Add(time.Duration(float64(32<<10) / 125_000 * float64(time.Second)))
		fl.arrived(32<<10, 32<<10, 300*time.Millisecond, now)
	}
	rate, window := fl.rate(), fl.window()
	fl.sent(64<<10, now)
	fl.sent(64<<10, now)
	now = now.Add(fl.deadline(64<<10, now))
	fl.timedOut(64<<10, now)
	if got := fl.rate(); got < rate/2*0.99 || got > rate/2*1.01 {
		t.Errorf("rate after a deadline passed: got %.0f, want half of %.0f", got, rate)
	}
	if got := fl.window(); got >= window {
		t.Errorf("window after a deadline passed: got %d, want less than %d", got, window)
	}
	ghostEnd := fl.nextChange(now)
	if want := now.Add(time.Duration(float64(64<<10) / fl.rate() * float64(time.Second))); !ghostEnd.Equal(want) {
		t.Errorf("the late reply's bytes count until %s, want %s", ghostEnd.Sub(now), want.Sub(now))
	}
	if fl.room(minPiece, now) {
		t.Errorf("room for a request while %d bytes are in flight and %d may still be on their way (window %d)", fl.inflight, fl.ghostBytes(now), fl.window())
	}
	withGhost := fl.deadline(minPiece, now)
	fl.timedOut(64<<10, now) // the other one too: now only ghosts
	if !fl.room(minPiece, ghostEnd) && fl.room(minPiece, now) {
		t.Error("room only while the late replies may still be on their way")
	}
	if after := fl.deadline(minPiece, ghostEnd.Add(time.Hour)); after >= withGhost && withGhost > minDeadline {
		t.Errorf("deadline with the late reply ahead %s, without %s: want the late reply's bytes counted", withGhost, after)
	}
	// Another failure (the owner away) says nothing of the link.
	r := fl.rate()
	fl.sent(minPiece, now)
	fl.failed(minPiece, now.Add(time.Second))
	if fl.rate() != r {
		t.Errorf("rate after a 503: got %.0f, want %.0f as before", fl.rate(), r)
	}
}

// TestFlowDeadlineBounds: however slow the link, a deadline stays within
// minDeadline..maxDeadline, and the rate never drops below minRate.
func TestFlowDeadlineBounds(t *testing.T) {
	fl := newFlow(DefaultWindow * ChunkSize)
	now := t0
	for range 40 {
		fl.sent(minPiece, now)
		now = now.Add(fl.deadline(minPiece, now))
		fl.timedOut(minPiece, now)
	}
	if fl.rate() < minRate {
		t.Errorf("rate: got %.0f, want at least %d", fl.rate(), minRate)
	}
	if d := fl.deadline(ChunkSize, now); d != maxDeadline {
		t.Errorf("deadline of a chunk at %0.f B/s: got %s, want %s", fl.rate(), d, maxDeadline)
	}
	fast := newFlow(DefaultWindow * ChunkSize)
	fast.sent(ChunkSize, t0)
	fast.arrived(ChunkSize, ChunkSize, time.Millisecond, t0.Add(time.Millisecond))
	if d := fast.deadline(ChunkSize, t0); d != minDeadline {
		t.Errorf("deadline on a fast link: got %s, want %s", d, minDeadline)
	}
}
