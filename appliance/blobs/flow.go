package blobs

import (
	"time"

	"github.com/meshbox/meshbox/internal/wire"
)

// How a fetch paces itself (flow).
const (
	// minPiece is the smallest request a fetch makes: on the slowest links
	// it asks for a chunk in parts of this size.
	minPiece = 16 << 10
	// assumedRate is the delivery rate a fetch assumes until it has
	// measured one, in bytes per second: a 256 kbit/s uplink.
	assumedRate = 32_000
	// minRate is the lowest rate a fetch believes in, however often its
	// deadlines pass (each halves the rate).
	minRate = 1_000
	// queueTarget is how long the bytes in flight take at the measured
	// rate: the window. Long enough to keep a link busy across a round
	// trip, short enough that a reply does not wait long behind the others
	// (and with it everything else the owner sends on that link).
	queueTarget = time.Second
	// A request's deadline: twice what the bytes ahead of it and its own
	// take at the measured rate, plus the round trip and deadlineSlack,
	// within minDeadline..maxDeadline.
	deadlineSlack = time.Second
	minDeadline   = 5 * time.Second
	maxDeadline   = wire.MaxTimeout
	// flowSamples is how many replies the rate is measured over.
	flowSamples = 8
)

// flow decides, from the replies of a fetch, how large its requests are,
// how many bytes it has in flight (the window) and each request's
// deadline. The owner's uplink carries the replies one after another, so
// the rate is the bytes that arrived over the time requests were in flight
// (busy time), over the last flowSamples replies: on a saturated link the
// link's rate, on a window-limited one the window's.
//
// A deadline that passes means the link is slower than measured: the
// rate halves, and the bytes of that request count as still on their way
// (a ghost) until they would have arrived at the new rate, so that a fetch
// does not ask again while the late reply still fills the link.
//
// A flow is owned by one fetch and not safe for concurrent use; every
// method takes the time, so its rules are tested without a clock.
type flow struct {
	maxWindow int // bytes
	assumed   float64
	samples   [flowSamples]flowSample
	n, next   int           // samples held, where the next one goes
	inflight  int           // bytes of requests in flight
	ghosts    []ghost       // bytes of requests past their deadline, maybe still on their way
	busy      time.Duration // time with requests in flight since the last reply
	last      time.Time     // the last event
}

// flowSample is one reply: its bytes, the busy time since the reply
// before it, and how long it took from request to reply.
type flowSample struct {
	bytes   int
	busy    time.Duration
	latency time.Duration
}

// ghost is a request whose deadline passed: its bytes may be on the link
// until then.
type ghost struct {
	bytes int
	until time.Time
}

// newFlow returns the pacing of a fetch with at most maxWindow bytes in
// flight (at least one chunk).
func newFlow(maxWindow int) *flow {
	return &flow{maxWindow: max(maxWindow, ChunkSize), assumed: assumedRate}
}

// rate is the delivery rate in bytes per second.
func (fl *flow) rate() float64 {
	if fl.n == 0 {
		return fl.assumed
	}
	var bytes int
	var busy time.Duration
	for _, s := range fl.samples[:fl.n] {
		bytes += s.bytes
		busy += s.busy
	}
	return max(minRate, float64(bytes)/max(busy, time.Millisecond).Seconds())
}

// rtt is the shortest time a request took from request to reply, of the
// last flowSamples (0 before the first reply): the round trip, as an
// upper bound.
func (fl *flow) rtt() time.Duration {
	var m time.Duration
	for i, s := range fl.samples[:fl.n] {
		if i == 0 || s.latency < m {
			m = s.latency
		}
	}
	return m
}

// window is the bytes a fetch may have in flight: what the link carries
// in queueTarget, at least two of the smallest requests, at most
// maxWindow.
func (fl *flow) window() int {
	w := int(fl.rate() * queueTarget.Seconds())
	return min(max(w, 2*minPiece), fl.maxWindow)
}

// piece is the size of the next request: a power of two from minPiece to
// ChunkSize, at most half the window (so that two are in flight and the
// link does not wait for a round trip between them).
func (fl *flow) piece() int {
	p, half := minPiece, fl.window()/2
	for p < ChunkSize && 2*p <= half {
		p *= 2
	}
	return p
}

// room says whether a request of n bytes may go now: it fits in the
// window with what is in flight and the ghosts, or nothing is (one
// request always may go on an idle link).
func (fl *flow) room(n int, now time.Time) bool {
	ahead := fl.inflight + fl.ghostBytes(now)
	return ahead == 0 || ahead+n <= fl.window()
}

// deadline is the deadline of a request of n bytes sent now, behind what
// is in flight and the ghosts.
func (fl *flow) deadline(n int, now time.Time) time.Duration {
	ahead := fl.inflight + fl.ghostBytes(now)
	t := time.Duration(float64(ahead+n) / fl.rate() * float64(time.Second))
	return min(max(2*t+fl.rtt()+deadlineSlack, minDeadline), maxDeadline)
}

// nextChange is when a ghost leaves (zero: none), which may make room.
func (fl *flow) nextChange(now time.Time) time.Time {
	var at time.Time
	for _, g := range fl.ghosts {
		if g.until.After(now) && (at.IsZero() || g.until.Before(at)) {
			at = g.until
		}
	}
	return at
}

// ghostBytes is the bytes of the ghosts not gone by now (and forgets the
// ones that are).
func (fl *flow) ghostBytes(now time.Time) int {
	n, live := 0, fl.ghosts[:0]
	for _, g := range fl.ghosts {
		if g.until.After(now) {
			n += g.bytes
			live = append(live, g)
		}
	}
	fl.ghosts = live
	return n
}

// advance counts the time since the last event as busy when requests were
// in flight.
func (fl *flow) advance(now time.Time) {
	if fl.inflight > 0 && now.After(fl.last) {
		fl.busy += now.Sub(fl.last)
	}
	if now.After(fl.last) {
		fl.last = now
	}
}

// sent records a request of n bytes sent now.
func (fl *flow) sent(n int, now time.Time) {
	fl.advance(now)
	fl.inflight += n
}

// arrived records the reply of a request of n bytes (sent latency ago)
// that arrived now with got bytes.
func (fl *flow) arrived(n, got int, latency time.Duration, now time.Time) {
	fl.advance(now)
	fl.inflight = max(0, fl.inflight-n)
	fl.samples[fl.next] = flowSample{bytes: got, busy: fl.busy, latency: latency}
	fl.next = (fl.next + 1) % flowSamples
	fl.n = min(fl.n+1, flowSamples)
	fl.busy = 0
}

// failed records a request of n bytes that failed now for another reason
// than its deadline (the owner or the mesh away): nothing about the link.
func (fl *flow) failed(n int, now time.Time) {
	fl.advance(now)
	fl.inflight = max(0, fl.inflight-n)
}

// timedOut records a request of n bytes whose deadline passed now.
func (fl *flow) timedOut(n int, now time.Time) {
	fl.advance(now)
	fl.inflight = max(0, fl.inflight-n)
	fl.slower(n, now)
}

// slower halves the rate after a deadline passed for a reply of n bytes,
// which is a ghost until it would have arrived at the new rate.
func (fl *flow) slower(n int, now time.Time) {
	fl.halve()
	left := time.Duration(float64(n) / fl.rate() * float64(time.Second))
	fl.ghosts = append(fl.ghosts, ghost{bytes: n, until: now.Add(left)})
}

// halve halves the rate (not below minRate).
func (fl *flow) halve() {
	if fl.rate()/2 >= minRate {
		for i := range fl.samples[:fl.n] {
			fl.samples[i].busy = 2 * max(fl.samples[i].busy, time.Millisecond)
		}
		fl.assumed /= 2
	}
	fl.busy = 0
}
