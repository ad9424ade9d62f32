package bridge

import (
	"fmt"
	"strings"
	"time"

	brokerlink "github.com/meshbox/meshbox/bridge/link"
)

// ackOp is what an ack asks for a delivery (link.AckOp).
type ackOp = brokerlink.AckOp

const (
	opAck     = brokerlink.OpAck
	opRequeue = brokerlink.OpRequeue
)

// acker settles the deliveries of the consume channel (link.Acker). It
// never waits on the broker: credit changes, which do, run on the
// consumer manager. Exits when the session ends or an ack fails.
func (s *session) acker() { s.con.acker.Run(s.ctx, s.con.Ch, s.fail) }

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
		case tag := <-s.con.Cancels:
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

// ack asks the acker to ack or requeue a delivery. It gives up
// when the session ends (the broker requeues the delivery itself).
func (s *session) ack(tag uint64, op ackOp) { s.con.acker.Ack(s.ctx, tag, op) }

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
// far is acked on the broker (link.Acker.SettleBeforeStop).
func (s *session) settleBeforeStop(limit time.Duration) { s.con.acker.SettleBeforeStop(limit) }
