package bridge

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	brokerlink "github.com/meshbox/meshbox/bridge/link"
	"github.com/meshbox/meshbox/internal/backoff"
	"github.com/meshbox/meshbox/internal/brokerurl"
)

const (
	closeLimit = time.Second // graceful close of a connection being dropped
	// connectLimit bounds a whole connection attempt of the link loop: both
	// connections dialled and the topology declared. A broker that accepts
	// the connection and then stalls on a declaration is given up after it.
	connectLimit = 30 * time.Second
	// startConnectLimit bounds the connection attempt Start makes, setup
	// included; after it the node runs offline and the link loop keeps
	// trying.
	startConnectLimit = 5 * time.Second
)

const (
	reasonURLChanged = "broker URL changed"
	reasonShutdown   = "node shutting down"
)

// brokerLink is the link's state (bridge/link) and the session in use,
// which is read without a lock.
type brokerLink struct {
	*brokerlink.Link
	sess atomic.Pointer[session]
}

func newBrokerLink(url string, retry backoff.Policy) *brokerLink {
	return &brokerLink{Link: brokerlink.New(url, retry)}
}

// use makes s the session in use (nil: none) and, for a session,
// moves the generation on.
func (l *brokerLink) use(s *session) {
	l.sess.Store(s)
	if s != nil {
		l.MoveOn()
	}
}

// status is the link's part of the node status, with the credential's
// and the extra connections.
func (l *brokerLink) status() BrokerStatus {
	st := l.Status()
	c := l.CredentialStatus()
	return BrokerStatus{State: st.State, Since: st.Since, URL: st.URL, Broker: st.Broker, URLs: st.URLs,
		Reason: st.Reason, Blocked: st.Blocked, History: st.History, Failovers: st.Failovers,
		Credential: &c, Extra: l.Extras()}
}

// setState records a link state change and logs it once.
func (b *Bridge) setState(state, reason string) {
	changed, url := b.link.Set(state, reason)
	if !changed {
		return
	}
	b.m.setState(state)
	switch {
	case state == StateConnected, state == StateConnecting, state == StateNone, reason == reasonShutdown:
		b.log.Info("broker link "+state, "url", url, "reason", reason)
	default:
		b.log.Warn("broker link "+state, "url", url, "reason", reason)
	}
	if state == StateConnected && b.cfg.OnConnected != nil {
		b.cfg.OnConnected()
	}
	if state != StateConnected {
		b.releaseParked() // the outbox holds them: answered as when the link is down
	}
}

func (b *Bridge) linkState() (string, time.Time) { return b.link.Current() }

func (b *Bridge) currentURL() string { return b.link.CurrentURL() }

// backoff returns the wait before reconnect attempt n (1-based).
func (b *Bridge) backoff(n int) time.Duration { return b.link.Backoff(n) }

// runLink owns the broker link: it connects, runs a session until it ends,
// and reconnects with backoff and jitter; while the broker is unreachable
// it probes it instead and reconnects as soon as it answers (link.AwaitBroker).
// first is a session Start already opened (or nil). runLink exits when
// b.quit is closed, and the link's generation moves on then: the extra
// connections end with it.
func (b *Bridge) runLink(first *session) {
	defer b.link.MoveOn()
	sess := first
	failures := 0
	down := map[string]bool{} // brokers (host:port) found unreachable since the last session
	var refusedSince time.Time
	var retry <-chan time.Time // set after a failed handover: try again
	switchFailures := 0        // failed handovers in a row
	handed := false            // sess was made by a handover
	left := ""                 // why the link left the broker it was on last
	for {
		if sess == nil {
			url := b.link.Target()
			if url == "" {
				b.setState(StateNone, "no broker configured")
				select {
				case <-b.quit:
					return
				case <-b.link.URLChanged():
					continue
				}
			}
			if st, _ := b.linkState(); st == StateNone {
				b.setState(StateConnecting, "")
			}
			ctx, cancel := b.withQuit(context.Background())
			ctx, cancelLimit := context.WithTimeout(ctx, connectLimit)
			s, err := b.connect(ctx, url)
			cancelLimit()
			cancel()
			if err != nil {
				select {
				case <-b.quit:
					return
				default:
				}
				failures++
				b.m.err(errKindLink)
				var inUse *NodeNameInUseError
				var cr *CredentialRefusedError
				if errors.As(err, &cr) {
					b.credentialRefused(cr)
				}
				if errors.As(err, &inUse) {
					if refusedSince.IsZero() {
						refusedSince = time.Now()
						b.log.Error("broker refuses this node's name", "node", b.cfg.Node, "reason", inUse.Detail)
					}
					// A stale connection of ours lasts at most two heartbeats; longer means
					// another process owns the name.
					if time.Since(refusedSince) > 3*b.cfg.Heartbeat+5*time.Second {
						b.link.SetFatal(err)
					}
				} else {
					refusedSince = time.Time{}
				}
				b.setState(StateOffline, err.Error())
				if left == "" {
					left = err.Error()
				}
				var ur *brokerlink.UnreachableError
				if errors.As(err, &ur) {
					// Not answering: probe until it does, then attempt at once.
					down[ur.Addr] = true
					b.link.Advance()
					switch b.awaitBroker(down) {
					case brokerlink.AwaitQuit:
						return
					case brokerlink.AwaitURLChanged:
						failures = 0
						b.setState(StateConnecting, "broker URL changed")
					case brokerlink.AwaitCameBack:
						failures = 0
					}
					continue
				}
				delete(down, brokerurl.Host(url))
				// The next broker of the list is tried next; the wait grows
				// with each round through the whole list.
				n := b.link.Brokers()
				b.link.Advance()
				select {
				case <-b.quit:
					return
				case <-b.link.URLChanged():
					failures = 0
					b.setState(StateConnecting, "broker URL changed")
				case <-time.After(b.backoff((failures + n - 1) / n)):
				}
				continue
			}
			sess = s
			if b.m != nil && b.link.EverConnected() {
				b.m.reconnects.Inc()
			}
		}
		failures, refusedSince = 0, time.Time{}
		clear(down)
		b.link.use(sess)
		sess.start()
		b.link.EndHandover()
		b.answerOrphans(sess)
		if fo, moved := b.link.ConnectedTo(sess.url, left); moved {
			b.log.Warn("broker failover: the link moved to another broker of its list", "from", fo.From, "to", fo.To, "reason", fo.Reason)
		}
		left = ""
		b.setState(StateConnected, "")
		b.credentialInUse(sess.user)
		if handed && b.cfg.OnConnected != nil {
			b.cfg.OnConnected() // the new session's system queue is new
		}
		handed, switchFailures = false, 0
		var reason string
		var next *session
		outcome := handoverNone
		for {
			reason = sess.run(retry)
			retry = nil
			if reason != reasonURLChanged {
				break
			}
			if next, outcome = b.handover(sess); outcome != handoverKept {
				break
			}
			switchFailures++
			retry = time.After(b.backoff(switchFailures)) // the old session runs on; try again
		}
		switch outcome {
		case handoverDone:
			sess, handed = next, true
			continue
		case handoverBroken:
			sess = nil // the old session is stopped; connect anew
			continue
		}
		sess.end()
		b.link.sess.CompareAndSwap(sess, nil)
		select {
		case <-b.quit:
			sess.drainCommands(closeLimit)
			sess.settleBeforeStop(closeLimit)
			b.setState(StateOffline, reason)
			sess.stop()
			return
		default:
		}
		if reason == reasonURLChanged {
			b.setState(StateConnecting, reason)
		} else {
			b.m.err(errKindLink)
			b.setState(StateOffline, reason)
			left = reason
			b.link.Advance() // fail over to the next broker of the list
		}
		b.link.SetCredential(sess.user, CredentialUnused, "")
		sess.stop()
		sess = nil
		if reason != reasonURLChanged {
			// A link that just dropped is retried soon, but not in a tight loop.
			select {
			case <-b.quit:
				return
			case <-time.After(b.backoff(1)):
			case <-b.link.URLChanged():
			}
		}
	}
}

// awaitBroker probes the link's broker until one answers (link.AwaitBroker).
// Link loop only.
func (b *Bridge) awaitBroker(down map[string]bool) brokerlink.Awaited {
	return b.link.AwaitBroker(b.quit, down, b.m.dialed, func(reason string) { b.setState(StateOffline, reason) })
}

// withQuit returns a context that is cancelled by cancel or when the bridge
// closes. A helper goroutine lives until one of the two.
func (b *Bridge) withQuit(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	go func() { // exits on cancel or on quit
		select {
		case <-b.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}
