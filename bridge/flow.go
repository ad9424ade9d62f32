package bridge

import (
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	amqp "github.com/rabbitmq/amqp091-go"
)

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
// for twice that at once (creditGain). While the handler holds most of the
// credit and answers quickly (within flowQuick, or twice its quickest
// answer: nothing waits at it), the credit doubles: a parallel handler
// gains. When the handler's answers slow down (beyond flowSlowFactor x
// flowQuick and 2 x flowSlowFactor x its quickest: commands wait at it)
// for creditSlowWindows windows in a row, the credit halves: a serial slow
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
	creditGain = 2
	// creditWindow bounds the time a window of answers spans: at least
	// max(creditWindow, 2 round trips) and 8 answers, at most
	// creditWindowMax.
	creditWindow    = 100 * time.Millisecond
	creditWindowMax = time.Second
	// flowQuick is a handler latency that is quick enough for more credit
	// whatever the handler's own pace.
	flowQuick = 25 * time.Millisecond
	// flowSlowFactor: latency above max(flowSlowFactor x flowQuick,
	// 2 x flowSlowFactor x the quickest answer seen) is slow.
	flowSlowFactor = 4
	// creditSlowWindows slow windows in a row halve the credit: a burst
	// that waits at the handler for a moment does not.
	creditSlowWindows = 3
	// creditConsumers bounds a stage's consumers: past it, they are
	// merged into one.
	creditConsumers = 12
)

// stageConsumer is one consumer of a stage queue and its prefetch in
// messages.
type stageConsumer struct {
	tag      string
	prefetch int
}

// stageFlow is the credit of one stage in one session. The consumer
// manager opens and cancels the consumers (cons); the readers and the
// handlers' answers feed the figures, in windows, and set want, the
// credit the stage should have in messages.
type stageFlow struct {
	stage   string
	floor   int  // credit at least, in commands (Config.Prefetch)
	ceiling int  // credit at most, in commands (Config.MaxStagePrefetch)
	batch   int  // commands a message carries at most (Config.CommandBatch)
	fixed   bool // floor == ceiling: one consumer, the queue's order
	// rtt is the link's round trip as the session measured it (0: not
	// yet), shared by the session's stages.
	rtt *atomic.Int64

	cons []stageConsumer // consumer manager only: the stage's consumers, oldest first

	mu       sync.Mutex
	want     int     // credit wanted, in messages (>= 1)
	perMsg   float64 // commands a message carries, as measured (1..batch)
	inflight int     // commands delivered and not yet answered by the handler
	win      creditWindowFigures
	state    creditState
	shown    StageCredit // what Status and tests read
}

// creditState is what a stage's rules remember between windows.
type creditState struct {
	settle   bool          // the next window follows a change: it only resets the figures
	slow     int           // slow windows in a row
	quickest time.Duration // the quickest answer of the session (0: none yet)
}

// creditWindowFigures are the figures of one window of answers.
type creditWindowFigures struct {
	start   time.Time // the window's first answer
	peak    int       // most commands at the handler at once
	msgs    int       // messages delivered
	cmds    int       // the commands they carried
	answers int       // answers (commands)
	latSum  time.Duration
}

// newStageFlow returns the credit of a stage for a node with Prefetch
// prefetch, MaxStagePrefetch ceiling and CommandBatch batch, starting at
// start messages (0: prefetch commands, in full batches). A ceiling of
// prefetch (a fixed credit) keeps one consumer: its commands reach the
// handler in the queue's order.
func newStageFlow(stage string, prefetch, batch, ceiling, start int, rtt *atomic.Int64) *stageFlow {
	f := &stageFlow{stage: stage, floor: prefetch, ceiling: max(prefetch, ceiling), batch: max(1, batch),
		fixed: ceiling <= prefetch, rtt: rtt, perMsg: float64(max(1, batch))}
	f.want = f.msgsFor(float64(prefetch))
	if start > 0 && !f.fixed {
		f.want = min(max(start, f.want), f.maxMsgs())
	}
	return f
}

// msgsFor returns the messages that carry cmds commands, as measured.
func (f *stageFlow) msgsFor(cmds float64) int {
	return max(1, int(cmds/f.perMsg+0.999))
}

// maxMsgs is the credit at most, in messages.
func (f *stageFlow) maxMsgs() int { return f.msgsFor(float64(f.ceiling)) }

// deliveredMsg counts a message delivered to the stage with n commands.
func (f *stageFlow) deliveredMsg(n int) {
	f.mu.Lock()
	f.win.msgs++
	f.win.cmds += n
	f.mu.Unlock()
}

// delivered counts a delivery passed to the handler.
func (f *stageFlow) delivered() {
	f.mu.Lock()
	f.inflight++
	f.win.peak = max(f.win.peak, f.inflight)
	f.mu.Unlock()
}

// gone counts a delivery that left the handler without an answer (given
// back to the broker).
func (f *stageFlow) gone() {
	f.mu.Lock()
	f.inflight = max(0, f.inflight-1)
	f.mu.Unlock()
}

// answered counts the handler's answer (or its timeout) to a delivery,
// after lat, at now, and reports whether want changed at the end of a
// window.
func (f *stageFlow) answered(lat time.Duration, now time.Time) (changed bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
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
	if f.fixed {
		return false
	}
	rtt := time.Duration(f.rtt.Load())
	elapsed := now.Sub(f.win.start)
	if elapsed < creditWindowMax && (f.win.answers < 8 || elapsed < max(creditWindow, 2*rtt)) {
		return false
	}
	w := f.win
	f.win = creditWindowFigures{start: now, peak: f.inflight}
	if f.state.settle {
		f.state.settle = false
		return false
	}
	if w.msgs > 0 {
		f.perMsg = min(float64(f.batch), max(1, float64(w.cmds)/float64(w.msgs)))
	}
	target := f.decide(w, float64(w.answers)/elapsed.Seconds(), rtt)
	target = min(max(target, f.msgsFor(float64(f.floor))), f.maxMsgs())
	if target == f.want {
		return false
	}
	f.want = target
	f.state.settle = true
	f.shown.Changes++
	return true
}

// decide returns the credit (messages) that the window w, with rate
// answers a second on a link of round trip rtt, asks for. f.mu held.
func (f *stageFlow) decide(w creditWindowFigures, rate float64, rtt time.Duration) int {
	need := f.msgsFor(creditGain * rate * (rtt + ackLinger).Seconds())
	credit := float64(f.want) * f.perMsg // in commands
	held := float64(w.peak) >= credit*3/4
	avg := w.latSum / time.Duration(max(1, w.answers))
	q := f.state.quickest
	switch {
	case avg > max(flowSlowFactor*flowQuick, 2*flowSlowFactor*q):
		// Commands wait at the handler: less credit, if it lasts.
		if f.state.slow++; f.state.slow >= creditSlowWindows {
			f.state.slow = 0
			return max(f.want/2, need)
		}
		return max(f.want, need)
	case held && avg <= max(flowQuick, 2*q):
		// The handler holds the credit and nothing waits at it.
		f.state.slow = 0
		return max(2*f.want, need)
	}
	f.state.slow = 0
	if need > f.want+f.want/4 {
		return need // the link needs more for the pace reached
	}
	return f.want
}

// wanted returns the credit the stage should have, in messages.
func (f *stageFlow) wanted() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.want
}

// answered feeds the handler's answer to c (or its timeout) into the
// stage's credit, and wakes the consumer manager when the stage wants
// another credit.
func (s *session) answered(c *cmdCall) {
	now := time.Now()
	if c.flow.answered(now.Sub(c.sent), now) {
		signal(s.flows.wake)
	}
	s.orderedNext(c)
}

// applyFlows opens or cancels stage consumers until each stage has the
// credit it wants. Consumer manager only.
func (s *session) applyFlows() {
	if s.flows.draining {
		return
	}
	s.flows.mu.Lock()
	flows := make([]*stageFlow, 0, len(s.flows.stages))
	for _, f := range s.flows.stages {
		flows = append(flows, f)
	}
	s.flows.mu.Unlock()
	for _, f := range flows {
		if !s.applyFlow(f) {
			return
		}
	}
}

// applyFlow opens or cancels f's consumers until their prefetches add up
// to the credit f wants: it cancels the newest while they hold more, then
// opens one of the difference. Past creditConsumers, it merges them: one
// of the whole credit, then the others cancelled. It returns false when
// it failed the session. Consumer manager only.
func (s *session) applyFlow(f *stageFlow) bool {
	want := f.wanted()
	before := f.sum()
	if before == want {
		return true
	}
	if len(f.cons) >= creditConsumers {
		old := f.cons
		if !s.addConsumer(f, want) {
			return false
		}
		for _, c := range old {
			if !s.cancelConsumer(f, c.tag) {
				return false
			}
		}
	}
	for len(f.cons) > 1 && f.sum() > want {
		if !s.cancelConsumer(f, f.cons[len(f.cons)-1].tag) {
			return false
		}
	}
	if sum := f.sum(); sum < want {
		if !s.addConsumer(f, want-sum) {
			return false
		}
	} else if sum > want && len(f.cons) == 1 {
		// One consumer holding too much: its replacement first, then it.
		old := f.cons[0].tag
		if !s.addConsumer(f, want) || !s.cancelConsumer(f, old) {
			return false
		}
	}
	s.b.route.keepCredit(f.stage, want)
	s.b.log.Debug("stage credit changed", "stage", f.stage, "consumers", len(f.cons), "messages", f.sum(), "from", before)
	return true
}

// sum is the credit f's consumers hold, in messages. Consumer manager
// only.
func (f *stageFlow) sum() int {
	n := 0
	for _, c := range f.cons {
		n += c.prefetch
	}
	return n
}

// timed runs a synchronous broker call on the consume channel and feeds
// its duration into the session's round trip (the quickest of them).
func (s *session) timed(call func() error) error {
	start := time.Now()
	err := call()
	if err == nil {
		d := int64(time.Since(start))
		for {
			cur := s.flows.rtt.Load()
			if cur != 0 && cur <= d || s.flows.rtt.CompareAndSwap(cur, d) {
				break
			}
		}
	}
	return err
}

// addConsumer opens one more consumer on f's stage queue with prefetch
// messages, with its reader. It returns false when it failed the session.
// Consumer manager only.
func (s *session) addConsumer(f *stageFlow, prefetch int) bool {
	if s.flows.qos != prefetch {
		// Set for the consumers opened from now on; the events consumer
		// keeps Prefetch.
		if err := s.timed(func() error { return s.con.ch.Qos(prefetch, 0, false) }); err != nil {
			s.fail(fmt.Errorf("set a stage's prefetch: %w", err))
			return false
		}
		s.flows.qos = prefetch
	}
	s.flows.tagSeq++
	tag := "cmd:" + f.stage + ":" + strconv.Itoa(s.flows.tagSeq)
	var deliveries <-chan amqp.Delivery
	err := s.timed(func() (err error) {
		deliveries, err = s.con.ch.Consume(codec.StageQueue(f.stage), tag, false, false, false, false, nil)
		return err
	})
	if err != nil {
		s.fail(fmt.Errorf("consume %s: %w", codec.StageQueue(f.stage), err))
		return false
	}
	f.cons = append(f.cons, stageConsumer{tag: tag, prefetch: prefetch})
	s.flows.byTag[tag] = f
	f.setOpen(len(f.cons), f.sum())
	s.spawn(func() { s.readCommands(f, deliveries) })
	return true
}

// cancelConsumer cancels f's consumer tag: the broker sends it nothing
// more; what it delivered already is handled and acked as usual, and its
// reader exits after the last of it. It returns false when it failed the
// session. Consumer manager only.
func (s *session) cancelConsumer(f *stageFlow, tag string) bool {
	if err := s.timed(func() error { return s.con.ch.Cancel(tag, false) }); err != nil {
		s.fail(fmt.Errorf("cancel consumer of stage %s: %w", f.stage, err))
		return false
	}
	s.forgetConsumer(f, tag)
	return true
}

// forgetConsumer drops a cancelled consumer. Consumer manager only.
func (s *session) forgetConsumer(f *stageFlow, tag string) {
	delete(s.flows.byTag, tag)
	f.cons = slices.DeleteFunc(f.cons, func(c stageConsumer) bool { return c.tag == tag })
	f.setOpen(len(f.cons), f.sum())
}

// setOpen records the consumers open and the credit they hold.
func (f *stageFlow) setOpen(n, credit int) {
	f.mu.Lock()
	f.shown.Consumers, f.shown.Messages = n, credit
	f.shown.MostConsumers = max(f.shown.MostConsumers, n)
	f.shown.MostMessages = max(f.shown.MostMessages, credit)
	f.mu.Unlock()
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
func (f *stageFlow) figures() StageCredit {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.shown
}

// stageCredit returns the credit of stage in the current session (zero:
// no session, or the stage not consumed).
func (b *Bridge) stageCredit(stage string) StageCredit {
	s := b.link.sess.Load()
	if s == nil {
		return StageCredit{}
	}
	s.flows.mu.Lock()
	f := s.flows.stages[stage]
	s.flows.mu.Unlock()
	if f == nil {
		return StageCredit{}
	}
	return f.figures()
}

// stageConsumers returns the consumers the current session has open on
// stage's queue now and the most it had at once (0, 0: none).
func (b *Bridge) stageConsumers(stage string) (open, most int) {
	c := b.stageCredit(stage)
	return c.Consumers, c.MostConsumers
}
