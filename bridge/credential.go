package bridge

import (
	"context"
	"time"

	brokerlink "github.com/meshbox/meshbox/bridge/link"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/meshbox/meshbox/internal/wire"
)

// This file is the link's credential: which broker user the link connects
// as, whether the broker refused it, and the switch to a new credential
// without an outage (make before break: the handover of link.Loop).

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
// the new one, at most wait (link.Link.AwaitHandover).
func (b *Bridge) liveSession(wait time.Duration) *session {
	b.link.AwaitHandover(wait, b.quit)
	return b.link.sess.Load()
}

// PeerGenerations returns, for each other node heard from on a mesh of
// per-node broker users, the generation of the credential its last system
// message came with (validated by the broker: user_id).
func (b *Bridge) PeerGenerations() map[string]int {
	return b.peers.creds.All()
}
