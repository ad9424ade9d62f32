package bridge

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	amqp "github.com/rabbitmq/amqp091-go"
)

// stallState is what the bridge knows about one stage's command queue.
type stallState struct {
	count        int       // messages ready at the last check
	lastProgress time.Time // queue seen empty or shrinking
	lastAge      time.Duration
	lastAgeAt    time.Time // when a delivery's age was last measured
	suspect      int       // consecutive checks with a stall condition
	stalled      bool
	reason       string
	since        time.Time
}

// stallBook is what the bridge knows about the command queues it
// watches. mu guards its maps.
type stallBook struct {
	mu        sync.Mutex
	byStage   map[string]*stallState
	submitted map[string]time.Time // stages this node sent commands to, and when last
	// watch is signalled when there may be a queue to watch that was not
	// before (a stage submitted to for the first time, or hosted here): a
	// checker with nothing to watch sleeps until then.
	watch chan struct{}
}

// stateOf returns the state of stage (mu held).
func (sb *stallBook) stateOf(stage string) *stallState {
	st := sb.byStage[stage]
	if st == nil {
		st = &stallState{lastProgress: time.Now()}
		sb.byStage[stage] = st
	}
	return st
}

// noteSubmitted records that this node sent a command to stage: its queue
// is watched for stalls.
func (b *Bridge) noteSubmitted(stage string) {
	b.cmds.stall.mu.Lock()
	_, known := b.cmds.stall.submitted[stage]
	b.cmds.stall.submitted[stage] = time.Now()
	b.cmds.stall.mu.Unlock()
	if !known {
		signal(b.cmds.stall.watch)
	}
}

// noteDeliveryAge records how long a delivered command had waited since it
// was accepted (sender's clock, second resolution).
func (b *Bridge) noteDeliveryAge(stage string, sent time.Time) {
	if sent.IsZero() {
		return
	}
	now := time.Now()
	b.cmds.stall.mu.Lock()
	st := b.cmds.stall.stateOf(stage)
	st.lastAge, st.lastAgeAt = now.Sub(sent), now
	st.lastProgress = now
	b.cmds.stall.mu.Unlock()
}

// stallCandidates are the stages whose queues are watched: those hosted
// here, those declared for assigned modules, and those this node sent
// commands to.
func (b *Bridge) stallCandidates() []string {
	set := b.hostedStages()
	maps.Copy(set, b.declaredStages())
	b.cmds.stall.mu.Lock()
	for s := range b.cmds.stall.submitted {
		set[s] = true
	}
	b.cmds.stall.mu.Unlock()
	return sortedKeys(set)
}

// stallChecker inspects the watched command queues (and the dead-letter
// queues of the stages hosted here) every StallCheck with passive
// declarations (on a channel of its own: a missing queue closes
// it). While no queue is to be watched (no stage hosted here, none
// submitted to) it sleeps until one is. Exits when the session ends.
func (s *session) stallChecker() {
	b := s.b
	ch, err := s.con.conn.Channel()
	if err != nil {
		s.fail(fmt.Errorf("open channel: %w", err))
		return
	}
	defer func() {
		if ch != nil { // nil after a failed re-open below
			_ = ch.Close()
		}
	}()
	t := time.NewTimer(b.cfg.StallCheck)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		stages := b.stallCandidates()
		if len(stages) == 0 {
			select {
			case <-s.ctx.Done():
				return
			case <-b.cmds.stall.watch:
			}
		}
		for _, stage := range stages {
			q, err := ch.QueueDeclarePassive(codec.StageQueue(stage), true, false, false, false, nil)
			if err != nil {
				var ae *amqp.Error
				if errors.As(err, &ae) && ae.Code == amqp.NotFound {
					b.cmds.stall.mu.Lock()
					delete(b.cmds.stall.submitted, stage) // no queue: sends fail with no route instead
					b.cmds.stall.mu.Unlock()
				}
				if s.ctx.Err() != nil || s.con.conn.IsClosed() {
					return
				}
				if ch, err = s.con.conn.Channel(); err != nil {
					s.fail(fmt.Errorf("open channel: %w", err))
					return
				}
				continue
			}
			b.observeQueue(stage, q.Messages, q.Consumers)
			if s.hasAux(stage, auxDead) {
				dq, err := ch.QueueDeclarePassive(codec.DeadQueue(stage), true, false, false, false, nil)
				if err != nil {
					if s.ctx.Err() != nil || s.con.conn.IsClosed() {
						return
					}
					if ch, err = s.con.conn.Channel(); err != nil {
						s.fail(fmt.Errorf("open channel: %w", err))
						return
					}
					continue
				}
				b.setDeadCount(stage, dq.Messages)
			}
		}
		t.Reset(b.cfg.StallCheck)
	}
}

// observeQueue updates the stall state of stage from a queue inspection.
// A stall is raised after two checks in a row see it, and cleared at once.
func (b *Bridge) observeQueue(stage string, count, consumers int) {
	now := time.Now()
	q := codec.StageQueue(stage)
	b.cmds.stall.mu.Lock()
	st := b.cmds.stall.stateOf(stage)
	if count == 0 || count < st.count {
		st.lastProgress = now
	}
	st.count = count
	var reason string
	switch {
	case count > 0 && consumers == 0:
		reason = fmt.Sprintf("%d commands waiting in %s and no node consumes it", count, q)
	case count > 0 && now.Sub(st.lastProgress) > b.cfg.StallAfter:
		reason = fmt.Sprintf("%d commands waiting in %s and none taken for %s", count, q, now.Sub(st.lastProgress).Round(time.Second))
	case !st.lastAgeAt.IsZero() && now.Sub(st.lastAgeAt) < 2*b.cfg.StallCheck && st.lastAge > b.cfg.StallAfter:
		reason = fmt.Sprintf("the oldest command delivered from %s had waited %s (threshold %s)", q, st.lastAge.Round(time.Second), b.cfg.StallAfter)
	}
	var logRaise, logClear bool
	switch {
	case reason == "":
		st.suspect = 0
		if st.stalled {
			st.stalled, st.reason = false, ""
			logClear = true
		}
	default:
		st.suspect++
		st.reason = reason
		if !st.stalled && st.suspect >= 2 {
			st.stalled, st.since = true, now
			logRaise = true
		}
	}
	n := 0
	for _, x := range b.cmds.stall.byStage {
		if x.stalled {
			n++
		}
	}
	b.cmds.stall.mu.Unlock()
	b.m.stalls.Set(float64(n))
	if logRaise {
		b.log.Warn("stage stalled", "stage", stage, "reason", reason)
	}
	if logClear {
		b.log.Info("stage no longer stalled", "stage", stage)
	}
}

// stallList returns the current stalls, by stage.
func (b *Bridge) stallList() []StallStatus {
	b.cmds.stall.mu.Lock()
	defer b.cmds.stall.mu.Unlock()
	out := []StallStatus{}
	for stage, st := range b.cmds.stall.byStage {
		if st.stalled {
			out = append(out, StallStatus{Stage: stage, Reason: st.reason, Since: st.since})
		}
	}
	slices.SortFunc(out, func(a, b StallStatus) int {
		switch {
		case a.Stage < b.Stage:
			return -1
		case a.Stage > b.Stage:
			return 1
		}
		return 0
	})
	return out
}
