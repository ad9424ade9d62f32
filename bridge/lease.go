package bridge

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/nats-io/nats.go"
)

// Leases. A handler holds a command for one attempt until its deadline:
// CommandTimeout after the command was handed to it. A handler working on
// a long command keeps it by replying, before its result, with messages
// that carry the Meshbox-Progress header (any value; the body is ignored):
// each one moves the deadline to CommandTimeout from then, never beyond
// MaxLease after the command was handed to it. Progress is not the result:
// the command is acked only on a reply without that header. A handler that
// stops sending progress loses the command at its deadline like any late
// handler: the attempt failed, the command goes back to its queue after a
// pause and is delivered again (to this node or another hosting the
// stage), with the attempt counted and marked as a possible duplicate.
// MaxLease stays below the broker's consumer timeout (30 minutes by
// default), which would otherwise close the channel under an unacked
// delivery.

// maxCommandsListed bounds the commands in flight the status lists.
const maxCommandsListed = 200

// CommandStatus is a command in flight on this node.
type CommandStatus struct {
	Stage   string `json:"stage"`
	MsgID   string `json:"msg_id"`
	Attempt int    `json:"attempt"`
	// State is "handler" (at the local handler or waiting for one) or
	// "retry" (failed, waiting to go back to its queue).
	State      string  `json:"state"`
	AgeSeconds float64 `json:"age_seconds"` // since this node handed it to the handler
	// LeaseRemainingSeconds is the time left before the attempt's deadline
	// (0 while waiting to be retried).
	LeaseRemainingSeconds float64 `json:"lease_remaining_seconds"`
	Extended              int     `json:"extended,omitempty"` // progress messages that moved the deadline
}

// isProgress reports whether a handler's reply is progress, not the
// result. nats.go canonicalises header keys it parses, so a map lookup
// does; this runs for every reply.
func isProgress(h nats.Header) bool {
	if h == nil {
		return false
	}
	_, ok := h[codec.HeaderProgress]
	return ok
}

// leaseUntil is the deadline a progress message at now gives an attempt
// handed to its handler at started, and whether it moves the current one.
func (b *Bridge) leaseUntil(started, current, now time.Time) (time.Time, bool) {
	until := now.Add(b.cfg.CommandTimeout)
	if limit := started.Add(b.cfg.MaxLease); until.After(limit) {
		until = limit
	}
	return until, until.After(current)
}

// extendCmd moves the deadline of the open command token on its handler's
// progress.
func (s *session) extendCmd(token string) {
	now := time.Now()
	s.local.mu.Lock()
	defer s.local.mu.Unlock()
	c := s.local.cmds[token]
	if c == nil || s.local.ended {
		return // settled already, or waiting for its retry
	}
	until, later := s.b.leaseUntil(c.started, c.deadline, now)
	if !later || c.timer == nil || !s.workers.Cancel(c.timer) {
		return // at its maximum lease, or its deadline fired already
	}
	c.deadline = until
	c.extended++
	s.b.m.leaseExtensions.Inc()
	c.timer = s.after(until.Sub(now), func() { s.cmdTimeout(token) })
}

// commandsInFlight lists the session's open commands, oldest first.
func (s *session) commandsInFlight(now time.Time) []CommandStatus {
	s.local.mu.Lock()
	out := make([]CommandStatus, 0, len(s.local.cmds))
	for token, c := range s.local.cmds {
		cs := CommandStatus{Stage: c.stage, MsgID: c.env.MsgID, Attempt: c.env.Attempt, State: "handler",
			AgeSeconds: max(0, now.Sub(c.started).Seconds()), Extended: c.extended}
		if strings.HasPrefix(token, retryTokenPrefix) {
			cs.State = "retry"
		} else {
			cs.LeaseRemainingSeconds = max(0, c.deadline.Sub(now).Seconds())
		}
		out = append(out, cs)
	}
	s.local.mu.Unlock()
	slices.SortFunc(out, func(a, b CommandStatus) int { return cmp.Compare(b.AgeSeconds, a.AgeSeconds) })
	if len(out) > maxCommandsListed {
		out = out[:maxCommandsListed]
	}
	return out
}

// localCmd is a command runHandler has at a local handler: a command of
// the node's own outbox when it has no broker (standalone).
type localCmd struct {
	stage, msgID string
	attempt      int
	started      time.Time
	deadline     atomic.Int64 // unix nanoseconds
	extended     atomic.Int32
}

// localCommandsInFlight lists the commands at local handlers outside a
// session.
func (b *Bridge) localCommandsInFlight(now time.Time) []CommandStatus {
	var out []CommandStatus
	b.cmds.local.Range(func(k, _ any) bool {
		c := k.(*localCmd)
		out = append(out, CommandStatus{Stage: c.stage, MsgID: c.msgID, Attempt: c.attempt, State: "handler",
			AgeSeconds:            max(0, now.Sub(c.started).Seconds()),
			LeaseRemainingSeconds: max(0, time.Unix(0, c.deadline.Load()).Sub(now).Seconds()),
			Extended:              int(c.extended.Load())})
		return true
	})
	return out
}

// runHandler calls the local handler of stage with msg and returns its
// result reply on success or why it failed. The handler's progress extends its lease as
// for mesh commands. While no handler is subscribed it waits (up to the
// deadline) as long as hosted() stays true.
func (b *Bridge) runHandler(ctx context.Context, stage string, msg *nats.Msg, hosted func() bool) (*nats.Msg, error) {
	nc := b.nc
	if nc == nil {
		nc = b.bc
	}
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("calling the handler of stage %s: %v", stage, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	msg.Reply = inbox
	started := time.Now()
	deadline := started.Add(b.cfg.CommandTimeout)
	// Listed in the status as the session's commands are (a standalone
	// node has no session, and its commands are in flight all the same).
	lc := &localCmd{stage: stage, msgID: msg.Header.Get(codec.HeaderMsgID), started: started}
	lc.attempt, _ = strconv.Atoi(msg.Header.Get(codec.HeaderAttempt))
	lc.deadline.Store(deadline.UnixNano())
	b.cmds.local.Store(lc, struct{}{})
	defer b.cmds.local.Delete(lc)
	if err := nc.PublishMsg(msg); err != nil {
		return nil, fmt.Errorf("calling the handler of stage %s: %v", stage, err)
	}
	for {
		wait, cancel := context.WithDeadline(ctx, deadline)
		resp, err := sub.NextMsgWithContext(wait)
		cancel()
		switch {
		case errors.Is(err, nats.ErrNoResponders): // a sync subscription's form of the 503 status
			if !hosted() {
				return nil, errNotHostedHere
			}
			if time.Until(deadline) <= handlerPoll {
				return nil, fmt.Errorf("no handler for stage %s on node %s within %s", stage, b.cfg.Node, b.cfg.CommandTimeout)
			}
			select {
			case <-time.After(handlerPoll):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			if err := nc.PublishMsg(msg); err != nil {
				return nil, fmt.Errorf("calling the handler of stage %s: %v", stage, err)
			}
		case err == nil && isProgress(resp.Header):
			if until, later := b.leaseUntil(started, deadline, time.Now()); later {
				deadline = until
				lc.deadline.Store(deadline.UnixNano())
				lc.extended.Add(1)
				b.m.leaseExtensions.Inc()
			}
		case err == nil:
			if err := handlerFailure(resp.Header, stage, b.cfg.Node); err != nil {
				return nil, err
			}
			return resp, nil
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.Is(err, context.DeadlineExceeded):
			return nil, fmt.Errorf("handler of stage %s on node %s did not answer within its lease (%s)", stage, b.cfg.Node,
				time.Since(started).Round(time.Millisecond))
		default:
			return nil, fmt.Errorf("calling the handler of stage %s: %v", stage, err)
		}
	}
}
