package bridge

import (
	"context"
	"errors"
	"time"

	brokerlink "github.com/meshbox/meshbox/bridge/link"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/meshbox/meshbox/internal/wire"
)

// This file is the link's credential: which broker user the link connects
// as, whether the broker refused it, and the switch to a new credential
// without an outage (make before break, see handover).

// Credential states in CredentialStatus.State.
const (
	CredentialInUse     = wire.CredentialInUse
	CredentialSwitching = wire.CredentialSwitching
	CredentialRevoked   = wire.CredentialRevoked
	CredentialRefused   = wire.CredentialRefused
	CredentialUnused    = wire.CredentialUnused
)

// CredentialStatus describes the broker credential of the link.
type CredentialStatus = brokerlink.CredentialStatus

// CredentialRefusedError means the broker refused the link's credential at
// login: the user does not exist (any more) or its password is wrong.
type CredentialRefusedError = brokerlink.CredentialRefusedError

// ErrCredentialRevoked is wrapped by a *CredentialRefusedError.
var ErrCredentialRevoked = brokerlink.ErrCredentialRevoked

// refused returns a *CredentialRefusedError for a dial error that is the
// broker's 403 at login, else err.
func (b *Bridge) refused(err error, user string) error {
	return brokerlink.Refused(err, user, func(user string) bool {
		_, before := b.learnt.Accepted.Load(user)
		return before || (b.cfg.AcceptedBefore != nil && b.cfg.AcceptedBefore(user))
	})
}

// handover moves the link from old to a session with the credential of
// the current URL, make before break:
//
//  1. both connections are opened with the new credential while old runs
//     on; if the broker refuses them, old runs on and handover returns nil
//     (runLink tries again later);
//  2. old stops taking requests from other nodes and replies to this
//     node's requests (its queues are unbound, so what is sent meanwhile
//     comes back to its sender, who sends it again, and the consumers are
//     cancelled once they have what reached the queues), the requests it
//     took are answered and the answers published (at most
//     link.HandoverDrain), and local programs' new calls wait for the new
//     session (handing);
//  3. old is stopped; this node's requests waiting for a reply stay open
//     (their replies come back to the replying node until the new session
//     has bound its reply queue, and are sent again);
//  4. the topology is declared on the new connections (the exclusive
//     queues and consumers are free now).
//
// It returns link.HandoverDone with the new session, set up but not started,
// with the link in handing state (runLink ends it once the session runs);
// HandoverKept when old runs on; HandoverBroken when old was stopped but
// the new session failed; HandoverNone for a URL that does not name the
// same broker and vhost as old's (a move to another broker is a plain
// reconnect).
func (b *Bridge) handover(old *session) (*session, brokerlink.Handover) {
	url := b.link.SameBrokerAs(old.url)
	if url == "" || url == old.url {
		return nil, brokerlink.HandoverNone
	}
	user := brokerlink.UserOf(url)
	prevReason := b.link.CredentialStatus().Reason
	ctx, cancel := b.withQuit(context.Background())
	defer cancel()
	ctx, cancelLimit := context.WithTimeout(ctx, connectLimit)
	defer cancelLimit()
	b.link.SetCredential(old.user, CredentialSwitching, "to "+user)
	b.log.Info("broker credential: switching, new connections first", "from", old.user, "to", user)
	next, abort, err := b.dialSession(ctx, url)
	if err != nil {
		reason := err.Error()
		var cr *CredentialRefusedError
		if errors.As(err, &cr) {
			reason = "new credential refused: " + cr.Detail
		}
		b.link.SetCredential(old.user, CredentialInUse, reason)
		if reason != prevReason { // once per cause, not once per retry
			b.log.Warn("broker credential: switch failed; staying on the old one and trying again", "from", old.user, "to", user, "err", err)
		}
		return nil, brokerlink.HandoverKept
	}
	b.link.BeginHandover()
	old.quiesce(ctx)
	old.handedOver = true
	old.end()
	b.link.sess.CompareAndSwap(old, nil)
	old.stop()
	b.reqs.pending.moveTo(old, next)
	if err := next.prepare(ctx, abort); err != nil {
		b.link.EndHandover()
		b.log.Warn("broker credential: new session failed after the old one closed; reconnecting", "user", user, "err", err)
		b.setState(StateOffline, err.Error())
		return nil, brokerlink.HandoverBroken
	}
	return next, brokerlink.HandoverDone
}

// quiesce stops taking requests from other nodes and replies to this
// node's requests, and waits (until ctx ends) until every request taken is
// answered and the answers published (link.Quiesce).
func (s *session) quiesce(ctx context.Context) {
	node := s.b.cfg.Node
	brokerlink.Quiesce(ctx, brokerlink.Quiet{
		Ch: s.con.AutoCh, Exchange: s.con.Ex, Pub: s.pub, Log: s.b.log,
		Queues: []brokerlink.QuietQueue{
			{Queue: s.con.Req, Key: codec.RequestBindingKey(node), Tag: "requests", Done: s.requestsDone},
			{Queue: s.con.Rep, Key: codec.ReplyKey(node), Tag: "replies", Done: s.repliesDone},
		},
		Open: func() int {
			s.local.mu.Lock()
			defer s.local.mu.Unlock()
			return len(s.local.host) + s.local.answering
		},
	})
}

// moveTo hands the requests sent on session from to session to: their
// replies arrive there.
func (r *pendingRequests) moveTo(from, to *session) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.m {
		if p.sess == from {
			p.sess = to
		}
	}
}

// liveSession returns the session in use; during a handover it waits for
// the new one, at most wait.
func (b *Bridge) liveSession(wait time.Duration) *session {
	if h := b.link.Handing(); h != nil {
		t := time.NewTimer(wait)
		select {
		case <-h:
		case <-t.C:
		case <-b.quit:
		}
		t.Stop()
	}
	return b.link.sess.Load()
}

// PeerGenerations returns, for each other node heard from on a mesh of
// per-node broker users, the generation of the credential its last system
// message came with (validated by the broker: user_id).
func (b *Bridge) PeerGenerations() map[string]int {
	return b.peers.creds.All()
}
