// Package flow sizes the credit of a stage: how many commands a node holds
// unacknowledged for it, from the rate at which its handler answers and
// the link's round trip. A StageFlow's state is guarded by its Mu,
// held by the caller where a method says so.
package flow

import (
	"sync"
	"sync/atomic"
	"time"
)

// AckLinger is how long the acker lets acks gather before it sends them,
// unless enough of them already wait. An ack frame costs the broker a
// settle command on the quorum queue and this node a system call; a
// multiple ack settles a run of deliveries with one of each. The linger
// only holds back a delivery's ack, never a handler or a publish: the
// consumer's prefetch covers it many times over at any rate it can reach.
const AckLinger = 500 * time.Microsecond

// Credit per stage. A quorum queue delivers to its consumers in turn, each
// up to its prefetch (basic.qos with global=false applies per consumer,
// fixed when it starts consuming). A node that hoards many commands behind
// a slow handler keeps them from faster nodes; a node with too little
// credit cannot keep a fast handler busy across the broker's round trip,
// which on a home link is 20-80 ms. So each stage's credit (the
// unacknowledged messages the broker may send this node) follows what the
// node measures, in windows of at least 100 ms, two round trips and 8
// answers:
//
//   - the rate at which the handler answers (commands a second), and how
//     long its answers take (on average, and the quickest of the session);
//   - the link's round trip: the quickest synchronous broker call of the
//     session on the consuming channel (basic.qos, basic.consume,
//     basic.cancel).
//
// A delivery's credit comes back a round trip plus the ack's linger after
// the handler answers, so a stage needs at least rate x (round trip +
// linger) commands in flight to keep its pace: when it has less, it asks
// for twice that at once (CreditGain). While the handler holds most of the
// credit and answers quickly (within FlowQuick, or twice its quickest
// answer: nothing waits at it), the credit doubles: a parallel handler
// gains. When the handler's answers slow down (beyond FlowSlowFactor x
// FlowQuick and 2 x FlowSlowFactor x its quickest: commands wait at it)
// for CreditSlowWindows windows in a row, the credit halves: a serial slow
// handler stays at Prefetch whatever its backlog. The credit stays between
// Prefetch and MaxStagePrefetch commands, turned into messages with the
// commands a message carried (batches) as measured. Nothing changes while
// the stage is idle, so a burst that empties the queue does not cost the
// next burst its ramp, and a new session starts from the credit the last
// one reached.
//
// Credit falls rarely, on purpose: a quorum queue gives the messages it
// has assigned to a cancelled consumer but not yet sent back to the queue,
// counting a delivery for each (measured on RabbitMQ 3.10: 29 of 2,000
// commands came again as a second attempt over 24 changes), which spends
// the commands' retry budget and marks them as possible duplicates. So
// the rules never probe by adding credit and taking it back.
//
// Changing the credit never waits on the ack path: the consumer manager
// opens and cancels consumers (each a broker round trip) on its own
// goroutine, while the acker goes on settling deliveries on the same
// channel. A stage holds a few consumers whose prefetches add up to its
// credit (growth adds one of the difference; a cut cancels the newest),
// so credit is counted in messages of any number, not in consumers of a
// fixed size. A cancelled consumer gets nothing more from the broker; what
// it has is handled and acked as usual.
const (
	CreditGain = 2
	// CreditWindow bounds the time a window of answers spans: at least
	// max(CreditWindow, 2 round trips) and 8 answers, at most
	// CreditWindowMax.
	CreditWindow    = 100 * time.Millisecond
	CreditWindowMax = time.Second
	// FlowQuick is a handler latency that is quick enough for more credit
	// whatever the handler's own pace.
	FlowQuick = 25 * time.Millisecond
	// FlowSlowFactor: latency above max(FlowSlowFactor x FlowQuick,
	// 2 x FlowSlowFactor x the quickest answer seen) is slow.
	FlowSlowFactor = 4
	// CreditSlowWindows slow windows in a row halve the credit: a burst
	// that waits at the handler for a moment does not.
	CreditSlowWindows = 3
	// CreditConsumers bounds a stage's consumers: past it, they are
	// merged into one.
	CreditConsumers = 12
)

// StageConsumer is one consumer of a stage queue and its prefetch in
// messages.
type StageConsumer struct {
	Tag      string
	Prefetch int
}

// StageFlow is the credit of one stage in one session. The consumer
// manager opens and cancels the consumers (cons); the readers and the
// handlers' answers feed the figures, in windows, and set want, the
// credit the stage should have in messages.
type StageFlow struct {
	Stage   string
	floor   int  // credit at least, in commands (Config.Prefetch)
	ceiling int  // credit at most, in commands (Config.MaxStagePrefetch)
	batch   int  // commands a message carries at most (Config.CommandBatch)
	Fixed   bool // floor == ceiling: one consumer, the queue's order
	// rtt is the link's round trip as the session measured it (0: not
	// yet), shared by the session's stages.
	rtt *atomic.Int64

	Cons []StageConsumer // consumer manager only: the stage's consumers, oldest first

	Mu       sync.Mutex
	Want     int     // credit wanted, in messages (>= 1)
	perMsg   float64 // commands a message carries, as measured (1..batch)
	inflight int     // commands delivered and not yet answered by the handler
	win      CreditWindowFigures
	state    CreditState
	shown    StageCredit // what Status and tests read
}

// CreditState is what a stage's rules remember between windows.
type CreditState struct {
	settle   bool          // the next window follows a change: it only resets the figures
	slow     int           // slow windows in a row
	quickest time.Duration // the quickest answer of the session (0: none yet)
}

// CreditWindowFigures are the figures of one window of answers.
type CreditWindowFigures struct {
	start   time.Time // the window's first answer
	peak    int       // most commands at the handler at once
	msgs    int       // messages delivered
	cmds    int       // the commands they carried
	answers int       // answers (commands)
	latSum  time.Duration
}

// NewStageFlow returns the credit of a stage for a node with Prefetch
// prefetch, MaxStagePrefetch ceiling and CommandBatch batch, starting at
// start messages (0: prefetch commands, in full batches). A ceiling of
// prefetch (a fixed credit) keeps one consumer: its commands reach the
// handler in the queue's order.
func NewStageFlow(stage string, prefetch, batch, ceiling, start int, rtt *atomic.Int64) *StageFlow {
	f := &StageFlow{Stage: stage, floor: prefetch, ceiling: max(prefetch, ceiling), batch: max(1, batch),
		Fixed: ceiling <= prefetch, rtt: rtt, perMsg: float64(max(1, batch))}
	f.Want = f.msgsFor(float64(prefetch))
	if start > 0 && !f.Fixed {
		f.Want = min(max(start, f.Want), f.maxMsgs())
	}
	return f
}

// msgsFor returns the messages that carry cmds commands, as measured.
func (f *StageFlow) msgsFor(cmds float64) int {
	return max(1, int(cmds/f.perMsg+0.999))
}

// maxMsgs is the credit at most, in messages.
func (f *StageFlow) maxMsgs() int { return f.msgsFor(float64(f.ceiling)) }

// deliveredMsg counts a message delivered to the stage with n commands.
func (f *StageFlow) DeliveredMsg(n int) {
	f.Mu.Lock()
	f.win.msgs++
	f.win.cmds += n
	f.Mu.Unlock()
}

// delivered counts a delivery passed to the handler.
func (f *StageFlow) Delivered() {
	f.Mu.Lock()
	f.inflight++
	f.win.peak = max(f.win.peak, f.inflight)
	f.Mu.Unlock()
}

// gone counts a delivery that left the handler without an answer (given
// back to the broker).
func (f *StageFlow) Gone() {
	f.Mu.Lock()
	f.inflight = max(0, f.inflight-1)
	f.Mu.Unlock()
}

// answered counts the handler's answer (or its timeout) to a delivery,
// after lat, at now, and reports whether want changed at the end of a
// window.
func (f *StageFlow) Answered(lat time.Duration, now time.Time) (changed bool) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	f.inflight = max(0, f.inflight-1)
	lat = max(lat, time.Microsecond)
	if f.state.quickest == 0 || lat < f.state.quickest {
		f.state.quickest = lat
	}
	f.win.latSum += lat
	if f.win.start.IsZero() {
		f.win.start = now
	}
	f.win.answers++
	if f.Fixed {
		return false
	}
	rtt := time.Duration(f.rtt.Load())
	elapsed := now.Sub(f.win.start)
	if elapsed < CreditWindowMax && (f.win.answers < 8 || elapsed < max(CreditWindow, 2*rtt)) {
		return false
	}
	w := f.win
	f.win = CreditWindowFigures{start: now, peak: f.inflight}
	if f.state.settle {
		f.state.settle = false
		return false
	}
	if w.msgs > 0 {
		f.perMsg = min(float64(f.batch), max(1, float64(w.cmds)/float64(w.msgs)))
	}
	target := f.decide(w, float64(w.answers)/elapsed.Seconds(), rtt)
	target = min(max(target, f.msgsFor(float64(f.floor))), f.maxMsgs())
	if target == f.Want {
		return false
	}
	f.Want = target
	f.state.settle = true
	f.shown.Changes++
	return true
}

// decide returns the credit (messages) that the window w, with rate
// answers a second on a link of round trip rtt, asks for. f.mu held.
func (f *StageFlow) decide(w CreditWindowFigures, rate float64, rtt time.Duration) int {
	need := f.msgsFor(CreditGain * rate * (rtt + AckLinger).Seconds())
	credit := float64(f.Want) * f.perMsg // in commands
	held := float64(w.peak) >= credit*3/4
	avg := w.latSum / time.Duration(max(1, w.answers))
	q := f.state.quickest
	switch {
	case avg > max(FlowSlowFactor*FlowQuick, 2*FlowSlowFactor*q):
		// Commands wait at the handler: less credit, if it lasts.
		if f.state.slow++; f.state.slow >= CreditSlowWindows {
			f.state.slow = 0
			return max(f.Want/2, need)
		}
		return max(f.Want, need)
	case held && avg <= max(FlowQuick, 2*q):
		// The handler holds the credit and nothing waits at it.
		f.state.slow = 0
		return max(2*f.Want, need)
	}
	f.state.slow = 0
	if need > f.Want+f.Want/4 {
		return need // the link needs more for the pace reached
	}
	return f.Want
}

// wanted returns the credit the stage should have, in messages.
func (f *StageFlow) Wanted() int {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	return f.Want
}

// sum is the credit f's consumers hold, in messages. Consumer manager
// only.
func (f *StageFlow) Sum() int {
	n := 0
	for _, c := range f.Cons {
		n += c.Prefetch
	}
	return n
}

// setOpen records the consumers open and the credit they hold.
func (f *StageFlow) SetOpen(n, credit int) {
	f.Mu.Lock()
	f.shown.Consumers, f.shown.Messages = n, credit
	f.shown.MostConsumers = max(f.shown.MostConsumers, n)
	f.shown.MostMessages = max(f.shown.MostMessages, credit)
	f.Mu.Unlock()
}

// StageCredit is a stage's credit in a session, as Status and tests read
// it.
type StageCredit struct {
	Consumers     int // consumers open now
	MostConsumers int // most open at once
	Messages      int // credit open now, in messages
	MostMessages  int // most credit open at once
	Changes       int // credit changes the stage asked for
}

// figures returns f's credit now.
func (f *StageFlow) Figures() StageCredit {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	return f.shown
}
