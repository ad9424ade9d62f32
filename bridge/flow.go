package bridge

import (
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Adaptive credit per stage. A quorum queue delivers to its consumers in
// turn, each up to its prefetch (basic.qos with global=false applies per
// consumer, fixed when it starts consuming). A node that hoards many
// commands behind a slow handler keeps them from faster nodes; a node with
// a small fixed prefetch cannot keep a fast handler busy across the
// broker's round trip. So a session runs a varying number of consumers on
// each stage queue, each with Prefetch unacknowledged deliveries: it
// doubles them while the stage's handler answers quickly and the consumers
// it has are saturated, and halves them when the handler's answers slow
// down.
// Cancelling a consumer stops new deliveries to it; the deliveries it
// already has are handled and acked as usual.
const (
	// flowQuick is a handler latency that is quick enough for more credit
	// whatever the handler's own pace: the commands a node may hold beyond
	// one consumer's prefetch are about what its handler clears in this
	// time.
	flowQuick = 25 * time.Millisecond
	// flowSlowFactor: latency above max(flowSlowFactor x flowQuick,
	// 2 x flowSlowFactor x the quickest answer seen) halves the consumers.
	flowSlowFactor = 4
)

// stageFlow is the credit of one stage in one session. The consumer
// owner opens and cancels the consumers (tags); the readers and the
// handlers' answers feed the figures, in windows of prefetch answers, and
// set want, the number of consumers the stage should have.
type stageFlow struct {
	stage    string
	prefetch int // per consumer, in messages
	window   int // answers between two looks at the figures (Config.Prefetch)
	max      int // consumers at most

	tags []string // consumer owner only: the stage's consumers, oldest first

	mu       sync.Mutex
	want     int           // consumers wanted (1..max)
	inflight int           // delivered and not yet answered by the handler
	peak     int           // most inflight during the window
	msgs     int           // messages delivered during the window
	cmds     int           // the commands they carried (a batch carries several)
	answers  int           // answers in the window
	latSum   time.Duration // their latencies
	quickest time.Duration // the quickest answer of the session (0: none yet)
	open     int           // consumers open (mirrors len(tags), for Status and tests)
	most     int           // most consumers open at once in the session
}

// newStageFlow returns the credit of a stage for a node with Prefetch
// prefetch, MaxStagePrefetch maxPrefetch and CommandBatch batch. Credit is
// counted in commands: a consumer's prefetch is prefetch/batch messages,
// each of up to batch commands, so a node behind a slow handler holds
// about prefetch commands whether they come in batches or alone, and a
// quick node may open maxPrefetch/(prefetch/batch) consumers: maxPrefetch
// messages, alone or in batches. A maxPrefetch of prefetch (a fixed
// credit) keeps one consumer: its commands reach the handler in the
// queue's order.
func newStageFlow(stage string, prefetch, batch, maxPrefetch int) *stageFlow {
	per := max(1, (prefetch+batch-1)/batch)
	most := 1
	if maxPrefetch > prefetch {
		most = max(1, maxPrefetch/per)
	}
	return &stageFlow{stage: stage, prefetch: per, window: prefetch, max: most, want: 1}
}

// deliveredMsg counts a message delivered to the stage with n commands.
func (f *stageFlow) deliveredMsg(n int) {
	f.mu.Lock()
	f.msgs++
	f.cmds += n
	f.mu.Unlock()
}

// delivered counts a delivery passed to the handler.
func (f *stageFlow) delivered() {
	f.mu.Lock()
	f.inflight++
	f.peak = max(f.peak, f.inflight)
	f.mu.Unlock()
}

// answered counts the handler's answer (or its timeout) to a delivery,
// after lat, and reports whether want changed at the end of a window.
func (f *stageFlow) answered(lat time.Duration) (changed bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inflight = max(0, f.inflight-1)
	if f.quickest == 0 || lat < f.quickest {
		f.quickest = max(lat, time.Microsecond)
	}
	f.answers++
	f.latSum += lat
	if f.answers < f.window {
		return false
	}
	avg := f.latSum / time.Duration(f.answers)
	perMsg := 1
	if f.msgs > 0 {
		perMsg = max(1, f.cmds/f.msgs)
	}
	saturated := f.peak >= f.want*f.prefetch*perMsg*3/4
	switch {
	case avg > max(flowSlowFactor*flowQuick, 2*flowSlowFactor*f.quickest) && f.want > 1:
		f.want = max(1, f.want/2)
		changed = true
	case saturated && avg < max(flowQuick, 2*f.quickest) && f.want < f.max:
		f.want = min(f.max, 2*f.want)
		changed = true
	}
	f.answers, f.latSum, f.peak, f.msgs, f.cmds = 0, 0, f.inflight, 0, 0
	return changed
}

// wanted returns how many consumers the stage should have.
func (f *stageFlow) wanted() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.want
}

// credit returns the stage's consumers and their unacknowledged
// deliveries at most (consumer owner only).
func (f *stageFlow) credit() (consumers, prefetch int) {
	return len(f.tags), len(f.tags) * f.prefetch
}

// gone counts a delivery that left the handler without an answer (given
// back to the broker).
func (f *stageFlow) gone() {
	f.mu.Lock()
	f.inflight = max(0, f.inflight-1)
	f.mu.Unlock()
}

// answered feeds the handler's answer to c (or its timeout) into the
// stage's credit, and wakes the consumer owner when the stage wants
// another number of consumers.
func (s *session) answered(c *cmdCall) {
	if c.flow.answered(time.Since(c.sent)) {
		signal(s.flows.wake)
	}
}

// applyFlows opens or cancels stage consumers until each stage has the
// number it wants. Consumer owner only.
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
		want, before := f.wanted(), len(f.tags)
		for len(f.tags) < want {
			if !s.addConsumer(f) {
				return
			}
		}
		for len(f.tags) > want {
			if !s.cancelConsumer(f) {
				return
			}
		}
		if n, credit := f.credit(); n != before {
			s.b.log.Debug("stage credit changed", "stage", f.stage, "consumers", n, "prefetch", credit)
		}
	}
}

// addConsumer opens one more consumer on f's stage queue, with its reader.
// It returns false when it failed the session. Consumer owner only.
func (s *session) addConsumer(f *stageFlow) bool {
	if s.flows.qos != f.prefetch {
		// Set for the consumers opened from now on; the events consumer
		// keeps Prefetch.
		if err := s.con.ch.Qos(f.prefetch, 0, false); err != nil {
			s.fail(fmt.Errorf("set a stage's prefetch: %w", err))
			return false
		}
		s.flows.qos = f.prefetch
	}
	s.flows.tagSeq++
	tag := "cmd:" + f.stage + ":" + strconv.Itoa(s.flows.tagSeq)
	ds, err := s.con.ch.Consume(stageQueue(f.stage), tag, false, false, false, false, nil)
	if err != nil {
		s.fail(fmt.Errorf("consume %s: %w", stageQueue(f.stage), err))
		return false
	}
	f.tags = append(f.tags, tag)
	s.flows.byTag[tag] = f
	f.setOpen(len(f.tags))
	s.spawn(func() { s.readCommands(f, ds) })
	return true
}

// cancelConsumer cancels f's newest consumer: the broker sends it nothing
// more; what it delivered already is handled and acked as usual, and its
// reader exits after the last of it. It returns false when it failed the
// session. Consumer owner only.
func (s *session) cancelConsumer(f *stageFlow) bool {
	tag := f.tags[len(f.tags)-1]
	if err := s.con.ch.Cancel(tag, false); err != nil {
		s.fail(fmt.Errorf("cancel consumer of stage %s: %w", f.stage, err))
		return false
	}
	s.forgetConsumer(f, tag)
	return true
}

// forgetConsumer drops a cancelled consumer. Consumer owner only.
func (s *session) forgetConsumer(f *stageFlow, tag string) {
	delete(s.flows.byTag, tag)
	f.tags = slices.DeleteFunc(f.tags, func(t string) bool { return t == tag })
	f.setOpen(len(f.tags))
}

// setOpen records how many consumers are open.
func (f *stageFlow) setOpen(n int) {
	f.mu.Lock()
	f.open = n
	f.most = max(f.most, n)
	f.mu.Unlock()
}

// consumers returns the consumers open now and the most open at once.
func (f *stageFlow) consumers() (open, most int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.open, f.most
}

// stageConsumers returns the consumers the current session has open on
// stage's queue now and the most it had at once (0, 0: none).
func (b *Bridge) stageConsumers(stage string) (open, most int) {
	s := b.link.sess.Load()
	if s == nil {
		return 0, 0
	}
	s.flows.mu.Lock()
	f := s.flows.stages[stage]
	s.flows.mu.Unlock()
	if f == nil {
		return 0, 0
	}
	return f.consumers()
}
