package bridge

import (
	"context"
	"sync/atomic"
	"time"

	brokerlink "github.com/meshbox/meshbox/bridge/link"
	"github.com/meshbox/meshbox/internal/backoff"
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
	reasonURLChanged = brokerlink.ReasonURLChanged
	reasonShutdown   = brokerlink.ReasonShutdown
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

// setState records a link state change and logs it once
// (link.Link.SetState).
func (b *Bridge) setState(state, reason string) { b.link.SetState(state, reason) }

// runLink owns the broker link (link.Loop): it connects, runs a session
// until it ends, and reconnects with backoff and jitter; while the broker
// is unreachable it probes it instead and reconnects as soon as it
// answers. first is a session Start already opened (or nil). runLink
// exits when b.quit is closed, and the link's generation moves on then:
// the extra connections end with it.
func (b *Bridge) runLink(first *session) {
	lp := brokerlink.Loop[*session]{
		Link: b.link.Link, Quit: b.quit,
		Connect: b.connect, Dial: b.dialSession,
		Retire: func(ctx context.Context, old, next *session) {
			old.quiesce(ctx)
			old.handedOver = true
			old.end()
			b.link.sess.CompareAndSwap(old, nil)
			old.stop()
			b.reqs.pending.moveTo(old, next)
		},
		Prepare:           func(ctx context.Context, s *session, abort func()) error { return s.prepare(ctx, abort) },
		Use:               b.link.use,
		Drop:              func(s *session) { b.link.sess.CompareAndSwap(s, nil) },
		Running:           b.answerOrphans,
		SetState:          b.setState,
		CredentialInUse:   b.link.CredentialInUse,
		CredentialRefused: b.link.CredentialRefused,
		HandedOver:        b.cfg.OnConnected,
		Failed:            func() { b.m.err(errKindLink) },
		Reconnected: func() {
			if b.m != nil {
				b.m.Reconnected()
			}
		},
		Dialed: b.m.Dialed,
		Log:    b.log, Node: b.cfg.Node, Heartbeat: b.cfg.Heartbeat,
		ConnectLimit: connectLimit, CloseLimit: closeLimit,
	}
	lp.Run(first)
}

// The link loop's view of a session (link.Session).

func (s *session) URL() string                       { return s.url }
func (s *session) User() string                      { return s.user }
func (s *session) Start()                            { s.start() }
func (s *session) Run(retry <-chan time.Time) string { return s.run(retry) }
func (s *session) End()                              { s.end() }
func (s *session) Stop()                             { s.stop() }

// Drain settles what the handlers finish within limit and waits for
// their acks: a graceful stop.
func (s *session) Drain(limit time.Duration) {
	s.drainCommands(limit)
	s.settleBeforeStop(limit)
}

// withQuit returns a context that is cancelled by cancel or when the bridge
// closes (link.WithQuit).
func (b *Bridge) withQuit(parent context.Context) (context.Context, context.CancelFunc) {
	return brokerlink.WithQuit(parent, b.quit)
}
