package bridge

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/meshbox/meshbox/bridge/flow"
)

type ackOp int

// ackBatch acks waiting are sent at once; fewer wait up to flow.AckLinger
// for more.
const (
	ackBatch = 64
)

const (
	opAck ackOp = iota
	opRequeue
)

type ackReq struct {
	tag uint64
	op  ackOp
	at  time.Time // when it was asked for
}

// acker settles the deliveries of the consume channel: acks and
// requeues, gathered into runs. It never waits on the broker: credit
// changes, which do, run on the consumer manager. Exits when the session
// ends or an ack fails.
func (s *session) acker() {
	linger := time.NewTimer(flow.AckLinger)
	linger.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case a := <-s.con.ackQ:
			if len(s.con.ackQ) < ackBatch {
				linger.Reset(flow.AckLinger)
				select {
				case <-linger.C:
				case <-s.ctx.Done():
					linger.Stop()
				}
			}
			n, err := s.settleAcks(a)
			s.con.unacked.Add(-int64(n))
			if err != nil {
				s.fail(fmt.Errorf("ack: %w", err))
				return
			}
		}
	}
}

// consumerManager owns the stage consumers of the consume channel (their
// queues declared on a channel of its own, since a failed declaration
// closes its channel): it opens and cancels them as the stages hosted,
// their grants and their credit change, each a broker round trip, while
// the acker goes on, and tries the refused stages again (grants.go).
// Exits when the session ends or a broker call fails.
func (s *session) consumerManager() {
	decl, err := s.con.conn.Channel()
	if err != nil {
		s.fail(fmt.Errorf("open channel: %w", err))
		return
	}
	defer func() { _ = decl.Close() }()
	retry := newRetryTimer()
	defer retry.t.Stop()
	s.syncStages(&decl)
	retry.plan(s.b, true)
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.b.route.stagesChanged:
			s.syncStages(&decl)
			retry.plan(s.b, true)
		case <-retry.t.C:
			s.syncStages(&decl)
			retry.plan(s.b, false)
		case <-s.flows.wake:
			s.applyFlows()
		case <-s.flows.drain:
			if !s.cancelStages() {
				return
			}
		case tag := <-s.con.cancels:
			f, ok := s.flows.byTag[tag]
			if !ok {
				if strings.HasPrefix(tag, "cmd:") {
					continue // cancelled by this side already
				}
				s.fail(fmt.Errorf("the broker cancelled consumer %s", tag))
				return
			}
			s.forgetConsumer(f, tag)
			if len(f.Cons) > 0 {
				signal(s.flows.wake) // opened again up to what the stage wants
				continue
			}
			s.b.log.Warn("the broker cancelled a stage consumer (queue deleted?); declaring it again", "stage", f.Stage)
			s.flows.mu.Lock()
			delete(s.flows.stages, f.Stage)
			s.flows.mu.Unlock()
			s.syncStages(&decl)
			retry.plan(s.b, false)
		}
	}
}

// ackBook follows the settled deliveries of the consume channel. Only
// acked consumers use that channel, so its delivery tags are dense (1, 2,
// 3, ...), and a multiple ack up to a tag is safe when every tag below it
// is settled. Only the acker touches it.
type ackBook struct {
	next    uint64          // lowest tag not known to be settled
	settled map[uint64]bool // settled tags above next
}

// settleAcks applies first and every other ack request already queued,
// and says how many requests it took.
func (s *session) settleAcks(first ackReq) (int, error) {
	reqs := []ackReq{first}
	for more := true; more && len(reqs) < 4096; {
		select {
		case r := <-s.con.ackQ:
			reqs = append(reqs, r)
		default:
			more = false
		}
	}
	s.con.ackDelay.note(time.Since(reqs[0].at))
	requeue, upTo, single := s.con.acks.plan(reqs)
	s.con.cork.Cork() // the run goes out with one write
	defer s.con.cork.Uncork()
	for _, tag := range requeue {
		if err := s.con.ch.Nack(tag, false, true); err != nil {
			return len(reqs), err
		}
	}
	if upTo != 0 {
		if err := s.con.ch.Ack(upTo, true); err != nil {
			return len(reqs), err
		}
	}
	for _, tag := range single {
		if err := s.con.ch.Ack(tag, false); err != nil {
			return len(reqs), err
		}
	}
	return len(reqs), nil
}

// plan turns ack requests into broker calls: requeues one by one; acks
// that complete the run of settled tags from the oldest as one multiple ack
// up to upTo (0: none); the other acks one by one (never held back behind a
// slow delivery). It records them all as settled.
func (a *ackBook) plan(reqs []ackReq) (requeue []uint64, upTo uint64, single []uint64) {
	if a.settled == nil {
		a.next, a.settled = 1, map[uint64]bool{}
	}
	pending := map[uint64]bool{}
	for _, r := range reqs {
		switch {
		case r.tag < a.next || a.settled[r.tag]:
			// settled already: never twice (a second ack would close the channel)
		case r.op == opRequeue:
			requeue = append(requeue, r.tag)
			a.settled[r.tag] = true
		default:
			pending[r.tag] = true
		}
	}
	for a.settled[a.next] || pending[a.next] {
		if pending[a.next] {
			upTo = a.next
			delete(pending, a.next)
		}
		delete(a.settled, a.next)
		a.next++
	}
	for tag := range pending {
		single = append(single, tag)
		a.settled[tag] = true
	}
	slices.Sort(single)
	return requeue, upTo, single
}

// ack asks the acker to ack or requeue a delivery. It gives up
// when the session ends (the broker requeues the delivery itself).
func (s *session) ack(tag uint64, op ackOp) {
	s.con.unacked.Add(1)
	select {
	case s.con.ackQ <- ackReq{tag: tag, op: op, at: time.Now()}:
	case <-s.ctx.Done():
		s.con.unacked.Add(-1)
	}
}

// cancelStages cancels every stage consumer for good: the node stops.
// What the consumers delivered already is handled and acked as usual. It
// returns false when it failed the session. Consumer manager only.
func (s *session) cancelStages() bool {
	s.flows.draining = true
	s.flows.mu.Lock()
	defer s.flows.mu.Unlock()
	for _, f := range s.flows.stages {
		for len(f.Cons) > 0 {
			if !s.cancelConsumer(f, f.Cons[len(f.Cons)-1].Tag) {
				return false
			}
		}
	}
	return true
}

// ackDelays follows how long acks wait between a handler's answer and
// their write to the broker: the acker's own linger, and anything that
// would hold it up.
type ackDelays struct {
	most atomic.Int64 // the longest wait of the session, in nanoseconds
	// over counts the runs of acks whose oldest waited longer than each
	// of ackWaits.
	over [len(ackWaits)]atomic.Int64
}

// ackWaits are the waits for the acker counted: half a home link's round
// trip (fifty times the linger), and a whole long one.
var ackWaits = [...]time.Duration{25 * time.Millisecond, 100 * time.Millisecond}

// note records a wait of d.
func (a *ackDelays) note(d time.Duration) {
	for i, w := range ackWaits {
		if d > w {
			a.over[i].Add(1)
		}
	}
	for {
		cur := a.most.Load()
		if int64(d) <= cur || a.most.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}

// drainCommands, for a node that stops gracefully, stops the stage
// consumers and waits, at most limit, until the commands at the local
// handlers are settled: what a handler finishes within the limit is acked
// instead of being delivered again after the stop (and, for a command of
// a batch, with its batch's finished commands). The acker and the consumer manager still
// runs.
func (s *session) drainCommands(limit time.Duration) {
	select {
	case s.flows.drain <- struct{}{}:
	default:
	}
	for end := time.Now().Add(limit); s.openCmds() > 0 && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
	}
}

// openCmds counts the commands at the local handlers (not those waiting
// for their requeue: the broker takes them back at the stop).
func (s *session) openCmds() int {
	s.local.mu.Lock()
	defer s.local.mu.Unlock()
	n := 0
	for token := range s.local.cmds {
		if !strings.HasPrefix(token, retryTokenPrefix) {
			n++
		}
	}
	return n + s.local.order.waiting() // waiting for their turn
}

// settleBeforeStop waits, at most limit, until every delivery settled so
// far is acked on the broker: a node closing gracefully does not leave
// finished commands to be redelivered. The acker still runs.
func (s *session) settleBeforeStop(limit time.Duration) {
	for end := time.Now().Add(limit); s.con.unacked.Load() > 0 && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
	}
}
