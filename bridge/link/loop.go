package link

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/meshbox/meshbox/internal/brokerurl"
	"github.com/meshbox/meshbox/internal/wire"
)

// This file is the link loop: the one goroutine that owns the broker
// link. It connects, runs a session until it ends, and reconnects with
// backoff and jitter, going round the list of brokers; while the broker
// is unreachable it probes it instead (AwaitBroker); a new credential for
// the same broker is a handover, make before break. The sessions are the
// bridge's: the loop asks for them, and tells of what happens, through a
// Loop's funcs.

// Why a session ended, besides its own failures.
const (
	ReasonURLChanged = "broker URL changed"
	ReasonShutdown   = "node shutting down"
)

// Session is one stay on the broker as the link loop sees it.
type Session interface {
	comparable
	URL() string
	User() string
	// Start runs the session's goroutines.
	Start()
	// Run waits until the session must end and returns why. retry (nil:
	// never) asks it to look at the URL setting again, after a failed
	// handover.
	Run(retry <-chan time.Time) string
	// End hands the session nothing new.
	End()
	// Drain settles, at most limit, what the session's handlers finish: a
	// graceful stop.
	Drain(limit time.Duration)
	// Stop tears the session down and waits for its goroutines.
	Stop()
}

// Handover is how a handover ended.
type Handover int

// How a handover ended.
const (
	HandoverNone   Handover = iota // not a change of credential: reconnect
	HandoverKept                   // the new credential failed; the old session runs on
	HandoverDone                   // the new session is ready
	HandoverBroken                 // the old session is stopped, the new one failed
)

// Loop is what the link loop asks of the bridge above it, and tells it.
// Every func is called from the loop's goroutine.
type Loop[S Session] struct {
	Link *Link
	Quit <-chan struct{} // closed when the node stops
	// Connect opens a session on url within ctx: set up, not started.
	Connect func(ctx context.Context, url string) (S, error)
	// Dial opens a session's connections on url within ctx, without its
	// topology; abort closes their sockets at once.
	Dial func(ctx context.Context, url string) (s S, abort func(), err error)
	// Retire quiets old and stops it, leaving this node's requests
	// waiting for replies to next (a handover).
	Retire func(ctx context.Context, old, next S)
	// Prepare declares the topology on a dialled session within ctx.
	Prepare func(ctx context.Context, s S, abort func()) error
	// Use makes s the session in use; Drop makes it none if s is.
	Use, Drop func(s S)
	// Running is told that s runs, before the link is connected.
	Running func(s S)
	// SetState records a state of the link.
	SetState func(state, reason string)
	// CredentialInUse and CredentialRefused tell of the credential.
	CredentialInUse   func(user string)
	CredentialRefused func(e *CredentialRefusedError)
	// HandedOver is told when a session made by a handover runs (its
	// system queue is new); nil: none.
	HandedOver func()
	// Failed counts a failed attempt or a lost session, Reconnected a
	// session after an earlier one, Dialed a probe's dial.
	Failed, Reconnected func()
	Dialed              func(error)
	Log                 *slog.Logger
	Node                string
	Heartbeat           time.Duration // a stale connection of ours lasts at most two
	// ConnectLimit bounds a connection attempt, CloseLimit a graceful
	// stop's drain.
	ConnectLimit, CloseLimit time.Duration
}

// Run owns the broker link: it connects, runs a session until it ends,
// and reconnects with backoff and jitter; while the broker is unreachable
// it probes it instead and reconnects as soon as it answers (AwaitBroker).
// first is a session opened already (or the zero S). Run returns when
// Quit is closed, and the link's generation moves on then: the extra
// connections end with it.
func (lp *Loop[S]) Run(first S) {
	l := lp.Link
	defer l.MoveOn()
	var none S
	sess := first
	failures := 0
	down := map[string]bool{} // brokers (host:port) found unreachable since the last session
	var refusedSince time.Time
	var retry <-chan time.Time // set after a failed handover: try again
	switchFailures := 0        // failed handovers in a row
	handed := false            // sess was made by a handover
	left := ""                 // why the link left the broker it was on last
	for {
		if sess == none {
			url := l.Target()
			if url == "" {
				lp.SetState(wire.StateNone, "no broker configured")
				select {
				case <-lp.Quit:
					return
				case <-l.URLChanged():
					continue
				}
			}
			if st, _ := l.Current(); st == wire.StateNone {
				lp.SetState(wire.StateConnecting, "")
			}
			ctx, cancel := WithQuit(context.Background(), lp.Quit)
			ctx, cancelLimit := context.WithTimeout(ctx, lp.ConnectLimit)
			s, err := lp.Connect(ctx, url)
			cancelLimit()
			cancel()
			if err != nil {
				select {
				case <-lp.Quit:
					return
				default:
				}
				failures++
				lp.Failed()
				var inUse *NodeNameInUseError
				var cr *CredentialRefusedError
				if errors.As(err, &cr) {
					lp.CredentialRefused(cr)
				}
				if errors.As(err, &inUse) {
					if refusedSince.IsZero() {
						refusedSince = time.Now()
						lp.Log.Error("broker refuses this node's name", "node", lp.Node, "reason", inUse.Detail)
					}
					// A stale connection of ours lasts at most two heartbeats; longer means
					// another process owns the name.
					if time.Since(refusedSince) > 3*lp.Heartbeat+5*time.Second {
						l.SetFatal(err)
					}
				} else {
					refusedSince = time.Time{}
				}
				lp.SetState(wire.StateOffline, err.Error())
				if left == "" {
					left = err.Error()
				}
				var ur *UnreachableError
				if errors.As(err, &ur) {
					// Not answering: probe until it does, then attempt at once.
					down[ur.Addr] = true
					l.Advance()
					switch l.AwaitBroker(lp.Quit, down, lp.Dialed, func(reason string) { lp.SetState(wire.StateOffline, reason) }) {
					case AwaitQuit:
						return
					case AwaitURLChanged:
						failures = 0
						lp.SetState(wire.StateConnecting, "broker URL changed")
					case AwaitCameBack:
						failures = 0
					}
					continue
				}
				delete(down, brokerurl.Host(url))
				// The next broker of the list is tried next; the wait grows
				// with each round through the whole list.
				n := l.Brokers()
				l.Advance()
				select {
				case <-lp.Quit:
					return
				case <-l.URLChanged():
					failures = 0
					lp.SetState(wire.StateConnecting, "broker URL changed")
				case <-time.After(l.Backoff((failures + n - 1) / n)):
				}
				continue
			}
			sess = s
			if l.EverConnected() {
				lp.Reconnected()
			}
		}
		failures, refusedSince = 0, time.Time{}
		clear(down)
		lp.Use(sess)
		sess.Start()
		l.EndHandover()
		lp.Running(sess)
		if fo, moved := l.ConnectedTo(sess.URL(), left); moved {
			lp.Log.Warn("broker failover: the link moved to another broker of its list", "from", fo.From, "to", fo.To, "reason", fo.Reason)
		}
		left = ""
		lp.SetState(wire.StateConnected, "")
		lp.CredentialInUse(sess.User())
		if handed && lp.HandedOver != nil {
			l.EventBinding().Connected(time.Now()) // before discovery hears of it
			lp.HandedOver()                        // the new session's system queue is new
		}
		handed, switchFailures = false, 0
		var reason string
		var next S
		outcome := HandoverNone
		for {
			reason = sess.Run(retry)
			retry = nil
			if reason != ReasonURLChanged {
				break
			}
			if next, outcome = lp.handover(sess); outcome != HandoverKept {
				break
			}
			switchFailures++
			retry = time.After(l.Backoff(switchFailures)) // the old session runs on; try again
		}
		switch outcome {
		case HandoverDone:
			sess, handed = next, true
			continue
		case HandoverBroken:
			sess = none // the old session is stopped; connect anew
			continue
		}
		sess.End()
		lp.Drop(sess)
		select {
		case <-lp.Quit:
			sess.Drain(lp.CloseLimit)
			lp.SetState(wire.StateOffline, reason)
			sess.Stop()
			return
		default:
		}
		if reason == ReasonURLChanged {
			lp.SetState(wire.StateConnecting, reason)
		} else {
			lp.Failed()
			lp.SetState(wire.StateOffline, reason)
			left = reason
			l.Advance() // fail over to the next broker of the list
		}
		l.SetCredential(sess.User(), wire.CredentialUnused, "")
		sess.Stop()
		sess = none
		if reason != ReasonURLChanged {
			// A link that just dropped is retried soon, but not in a tight loop.
			select {
			case <-lp.Quit:
				return
			case <-time.After(l.Backoff(1)):
			case <-l.URLChanged():
			}
		}
	}
}

// WithQuit returns a context that is cancelled by cancel or when quit is
// closed. A helper goroutine lives until one of the two.
func WithQuit(parent context.Context, quit <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	go func() { // exits on cancel or on quit
		select {
		case <-quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// handover moves the link from old to a session with the credential of
// the URL setting, make before break:
//
//  1. both connections are opened with the new credential while old runs
//     on; if the broker refuses them, old runs on and handover returns nil
//     (Run tries again later);
//  2. old stops taking requests from other nodes and replies to this
//     node's requests (its queues are unbound, so what is sent meanwhile
//     comes back to its sender, who sends it again, and the consumers are
//     cancelled once they have what reached the queues), the requests it
//     took are answered and the answers published (at most
//     HandoverDrain, Quiesce), and local programs' new calls wait for the new
//     session (BeginHandover);
//  3. old is stopped (Retire); this node's requests waiting for a reply stay open
//     (their replies come back to the replying node until the new session
//     has bound its reply queue, and are sent again);
//  4. the topology is declared on the new connections (Prepare: the
//     exclusive queues and consumers are free now).
//
// It returns HandoverDone with the new session, set up but not started,
// with the link in handing state (Run ends it once the session runs);
// HandoverKept when old runs on; HandoverBroken when old was stopped but
// the new session failed; HandoverNone for a URL that does not name the
// same broker and vhost as old's (a move to another broker is a plain
// reconnect).
func (lp *Loop[S]) handover(old S) (S, Handover) {
	l := lp.Link
	var none S
	url := l.SameBrokerAs(old.URL())
	if url == "" || url == old.URL() {
		return none, HandoverNone
	}
	user := UserOf(url)
	prevReason := l.CredentialStatus().Reason
	ctx, cancel := WithQuit(context.Background(), lp.Quit)
	defer cancel()
	ctx, cancelLimit := context.WithTimeout(ctx, lp.ConnectLimit)
	defer cancelLimit()
	l.SetCredential(old.User(), wire.CredentialSwitching, "to "+user)
	lp.Log.Info("broker credential: switching, new connections first", "from", old.User(), "to", user)
	next, abort, err := lp.Dial(ctx, url)
	if err != nil {
		reason := err.Error()
		var cr *CredentialRefusedError
		if errors.As(err, &cr) {
			reason = "new credential refused: " + cr.Detail
		}
		l.SetCredential(old.User(), wire.CredentialInUse, reason)
		if reason != prevReason { // once per cause, not once per retry
			lp.Log.Warn("broker credential: switch failed; staying on the old one and trying again", "from", old.User(), "to", user, "err", err)
		}
		return none, HandoverKept
	}
	l.BeginHandover()
	l.EventBinding().Disconnected() // the old session's system queue goes: until the new one's is heard of
	lp.Retire(ctx, old, next)
	if err := lp.Prepare(ctx, next, abort); err != nil {
		l.EndHandover()
		lp.Log.Warn("broker credential: new session failed after the old one closed; reconnecting", "user", user, "err", err)
		lp.SetState(wire.StateOffline, err.Error())
		return none, HandoverBroken
	}
	return next, HandoverDone
}
