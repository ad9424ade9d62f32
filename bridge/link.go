package bridge

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshbox/meshbox/internal/backoff"
	"github.com/meshbox/meshbox/internal/brokerurl"
)

const (
	dialTimeout    = 5 * time.Second  // TCP connect
	handshakeLimit = 10 * time.Second // TLS and AMQP handshake
	closeLimit     = time.Second      // graceful close of a connection being dropped
	// connectLimit bounds a whole connection attempt of the link loop: both
	// connections dialled and the topology declared. A broker that accepts
	// the connection and then stalls on a declaration is given up after it.
	connectLimit = 30 * time.Second
	// startConnectLimit bounds the connection attempt Start makes, setup
	// included; after it the node runs offline and the link loop keeps
	// trying.
	startConnectLimit = 5 * time.Second
	historyLen        = 20
)

const (
	reasonURLChanged = "broker URL changed"
	reasonShutdown   = "node shutting down"
)

// link is the state of the broker link: the broker URLs, the one in use,
// the link's state, since when and why, its recent history and failovers,
// and the session in use. mu guards everything but sess, which is read
// without it. Only the link's methods touch its fields.
type link struct {
	mu        sync.Mutex
	url       string   // the setting: one URL or several (internal/brokerurl)
	urls      []string // url split
	pos       int      // index in urls of the broker in use or tried next; -1: pick one at random
	connected string   // host:port of the broker the last session ran on ("" before the first)
	state     string
	since     time.Time
	reason    string
	blocked   string // the broker's reason while it blocks the publishing connection
	history   []StateChange
	failovers []Failover

	urlChanged chan struct{} // cap 1: SetURL wakes the link loop
	fatal      chan error    // cap 1: the node name was refused for good
	sess       atomic.Pointer[session]
	retry      backoff.Policy // reconnect backoff
	probe      backoff.Policy // the wait between probes of an unreachable broker (probe.go)
	cred       credential     // the credential in use (credential.go)
	handing    chan struct{}  // non-nil during a handover; closed at its end
	gen        linkGen        // the sessions so far (dialer.go)
	extras     extraConns     // the connections DialExtra opened (dialer.go)
}

func newLink(url string, retry backoff.Policy) *link {
	every := min(retry.Min, probeEvery)
	return &link{url: url, urls: brokerurl.Split(url), pos: -1, state: StateNone, since: time.Now(), retry: retry,
		probe:      backoff.Policy{Min: every, Max: every},
		urlChanged: make(chan struct{}, 1), fatal: make(chan error, 1)}
}

// setURL records url and reports whether it changed. The broker in use,
// when the new list names it (with any credential), stays the one in use.
func (l *link) setURL(url string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.url == url {
		return false
	}
	in := ""
	if l.pos >= 0 && l.pos < len(l.urls) {
		in = l.urls[l.pos]
	}
	l.url, l.urls = url, brokerurl.Split(url)
	l.pos = slices.IndexFunc(l.urls, func(u string) bool { return in != "" && sameBroker(u, in) })
	return true
}

// set records state and reason. It reports whether the state changed, and
// the broker's URL (redacted) for the log line.
func (l *link) set(state, reason string) (changed bool, url string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if state != StateBlocked {
		l.blocked = ""
	}
	if l.state == state {
		l.reason = reason
		return false, ""
	}
	now := time.Now()
	l.state, l.since, l.reason = state, now, reason
	at := l.inUseLocked()
	l.history = append(l.history, StateChange{State: state, At: now, Reason: reason, Broker: brokerurl.Host(at)})
	if len(l.history) > historyLen {
		l.history = slices.Delete(l.history, 0, len(l.history)-historyLen)
	}
	if at == "" {
		at = l.url
	}
	return true, redactURL(at)
}

// setBlocked records the broker's reason for blocking publishers.
func (l *link) setBlocked(reason string) {
	l.mu.Lock()
	l.blocked = reason
	l.mu.Unlock()
}

func (l *link) current() (string, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state, l.since
}

func (l *link) status() BrokerStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := BrokerStatus{State: l.state, Since: l.since, URL: redactURL(l.inUseLocked()), Reason: l.reason,
		Blocked: l.blocked, History: slices.Clone(l.history), Failovers: slices.Clone(l.failovers)}
	if st.Failovers == nil {
		st.Failovers = []Failover{}
	}
	if len(l.urls) > 1 {
		for _, u := range l.urls {
			st.URLs = append(st.URLs, redactURL(u))
		}
	}
	if st.State != StateNone {
		st.Broker = brokerurl.Host(l.inUseLocked())
	}
	return st
}

// statusWithCredential is status plus the credential's and the extra
// connections.
func (l *link) statusWithCredential() BrokerStatus {
	st := l.status()
	c := l.credentialStatus()
	st.Credential = &c
	st.Extra = l.extras.list()
	return st
}

// everConnected reports whether a connected state was ever recorded
// before the current one.
func (l *link) everConnected() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, h := range l.history {
		if h.State == StateConnected {
			return true
		}
	}
	return false
}

// setState records a link state change and logs it once.
func (b *Bridge) setState(state, reason string) {
	changed, url := b.link.set(state, reason)
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

func (b *Bridge) linkState() (string, time.Time) { return b.link.current() }

func (b *Bridge) currentURL() string { return b.link.currentURL() }

// backoff returns the wait before reconnect attempt n (1-based).
func (b *Bridge) backoff(n int) time.Duration { return b.link.retry.Delay(n) }

// runLink owns the broker link: it connects, runs a session until it ends,
// and reconnects with backoff and jitter; while the broker is unreachable
// it probes it instead and reconnects as soon as it answers (probe.go).
// first is a session Start already opened (or nil). runLink exits when
// b.quit is closed, and the link's generation moves on then: the extra
// connections end with it.
func (b *Bridge) runLink(first *session) {
	defer b.link.moveOn()
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
			url := b.link.target()
			if url == "" {
				b.setState(StateNone, "no broker configured")
				select {
				case <-b.quit:
					return
				case <-b.link.urlChanged:
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
						select {
						case b.link.fatal <- err:
						default:
						}
					}
				} else {
					refusedSince = time.Time{}
				}
				b.setState(StateOffline, err.Error())
				if left == "" {
					left = err.Error()
				}
				var ur *unreachableError
				if errors.As(err, &ur) {
					// Not answering: probe until it does, then attempt at once.
					down[ur.addr] = true
					b.link.advance()
					switch b.awaitBroker(down) {
					case awaitQuit:
						return
					case awaitURLChanged:
						failures = 0
						b.setState(StateConnecting, "broker URL changed")
					case awaitCameBack:
						failures = 0
					}
					continue
				}
				delete(down, brokerurl.Host(url))
				// The next broker of the list is tried next; the wait grows
				// with each round through the whole list.
				n := b.link.brokers()
				b.link.advance()
				select {
				case <-b.quit:
					return
				case <-b.link.urlChanged:
					failures = 0
					b.setState(StateConnecting, "broker URL changed")
				case <-time.After(b.backoff((failures + n - 1) / n)):
				}
				continue
			}
			sess = s
			if b.m != nil && b.link.everConnected() {
				b.m.reconnects.Inc()
			}
		}
		failures, refusedSince = 0, time.Time{}
		clear(down)
		b.link.use(sess)
		sess.start()
		b.link.endHandover()
		b.answerOrphans(sess)
		if fo, moved := b.link.connectedTo(sess.url, left); moved {
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
			b.link.advance() // fail over to the next broker of the list
		}
		b.link.setCredential(sess.user, CredentialUnused, "")
		sess.stop()
		sess = nil
		if reason != reasonURLChanged {
			// A link that just dropped is retried soon, but not in a tight loop.
			select {
			case <-b.quit:
				return
			case <-time.After(b.backoff(1)):
			case <-b.link.urlChanged:
			}
		}
	}
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
