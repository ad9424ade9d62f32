package bridge

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/meshbox/meshbox/bridge/flow"

	"github.com/meshbox/meshbox/bridge/codec"

	amqp "github.com/rabbitmq/amqp091-go"
)

// answered feeds the handler's answer to c (or its timeout) into the
// stage's credit, and wakes the consumer manager when the stage wants
// another credit.
func (s *session) answered(c *cmdCall) {
	now := time.Now()
	if c.flow.Answered(now.Sub(c.sent), now) {
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
	flows := make([]*flow.StageFlow, 0, len(s.flows.stages))
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
func (s *session) applyFlow(f *flow.StageFlow) bool {
	want := f.Wanted()
	before := f.Sum()
	if before == want {
		return true
	}
	if len(f.Cons) >= flow.CreditConsumers {
		old := f.Cons
		if !s.addConsumer(f, want) {
			return false
		}
		for _, c := range old {
			if !s.cancelConsumer(f, c.Tag) {
				return false
			}
		}
	}
	for len(f.Cons) > 1 && f.Sum() > want {
		if !s.cancelConsumer(f, f.Cons[len(f.Cons)-1].Tag) {
			return false
		}
	}
	if sum := f.Sum(); sum < want {
		if !s.addConsumer(f, want-sum) {
			return false
		}
	} else if sum > want && len(f.Cons) == 1 {
		// One consumer holding too much: its replacement first, then it.
		old := f.Cons[0].Tag
		if !s.addConsumer(f, want) || !s.cancelConsumer(f, old) {
			return false
		}
	}
	s.b.route.keepCredit(f.Stage, want)
	s.b.log.Debug("stage credit changed", "stage", f.Stage, "consumers", len(f.Cons), "messages", f.Sum(), "from", before)
	return true
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
func (s *session) addConsumer(f *flow.StageFlow, prefetch int) bool {
	if s.flows.qos != prefetch {
		// Set for the consumers opened from now on; the events consumer
		// keeps Prefetch.
		if err := s.timed(func() error { return s.con.Ch.Qos(prefetch, 0, false) }); err != nil {
			s.fail(fmt.Errorf("set a stage's prefetch: %w", err))
			return false
		}
		s.flows.qos = prefetch
	}
	s.flows.tagSeq++
	tag := "cmd:" + f.Stage + ":" + strconv.Itoa(s.flows.tagSeq)
	var deliveries <-chan amqp.Delivery
	err := s.timed(func() (err error) {
		deliveries, err = s.con.Ch.Consume(codec.StageQueue(f.Stage), tag, false, false, false, false, nil)
		return err
	})
	if err != nil {
		s.fail(fmt.Errorf("consume %s: %w", codec.StageQueue(f.Stage), err))
		return false
	}
	f.Cons = append(f.Cons, flow.StageConsumer{Tag: tag, Prefetch: prefetch})
	s.flows.byTag[tag] = f
	f.SetOpen(len(f.Cons), f.Sum())
	s.spawn(func() { s.readCommands(f, deliveries) })
	return true
}

// cancelConsumer cancels f's consumer tag: the broker sends it nothing
// more; what it delivered already is handled and acked as usual, and its
// reader exits after the last of it. It returns false when it failed the
// session. Consumer manager only.
func (s *session) cancelConsumer(f *flow.StageFlow, tag string) bool {
	if err := s.timed(func() error { return s.con.Ch.Cancel(tag, false) }); err != nil {
		s.fail(fmt.Errorf("cancel consumer of stage %s: %w", f.Stage, err))
		return false
	}
	s.forgetConsumer(f, tag)
	return true
}

// forgetConsumer drops a cancelled consumer. Consumer manager only.
func (s *session) forgetConsumer(f *flow.StageFlow, tag string) {
	delete(s.flows.byTag, tag)
	f.Cons = slices.DeleteFunc(f.Cons, func(c flow.StageConsumer) bool { return c.Tag == tag })
	f.SetOpen(len(f.Cons), f.Sum())
}

// stageCredit returns the credit of stage in the current session (zero:
// no session, or the stage not consumed).
func (b *Bridge) stageCredit(stage string) flow.StageCredit {
	s := b.link.sess.Load()
	if s == nil {
		return flow.StageCredit{}
	}
	s.flows.mu.Lock()
	f := s.flows.stages[stage]
	s.flows.mu.Unlock()
	if f == nil {
		return flow.StageCredit{}
	}
	return f.Figures()
}

// stageConsumers returns the consumers the current session has open on
// stage's queue now and the most it had at once (0, 0: none).
func (b *Bridge) stageConsumers(stage string) (open, most int) {
	c := b.stageCredit(stage)
	return c.Consumers, c.MostConsumers
}
