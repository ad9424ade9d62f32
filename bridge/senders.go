package bridge

import (
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	amqp "github.com/rabbitmq/amqp091-go"
)

// This file holds which broker users may speak for which node. RabbitMQ
// checks that a message's user_id is its connection's user, but any user
// the broker's operator makes, node.<n>.g9 say, is a user: the user_id
// alone proves only that the publisher logged in as a user of that name.
// So a node accepts a node's user_id only for a generation the mesh
// database lists for that node (its bindings, cache.Bindings.
// SenderGenerations): the newest and, during a rotation, the older ones
// not yet revoked. Every shape is checked, discovery included: a bye made
// under node.a.g9 marks nobody gone.
//
// Until the bindings list generations (no bindings yet, a database or a
// cache file older than them, a mesh whose nodes have no broker users of
// their own) a node accepts every generation, as the broker does.
//
// A node's bindings may lag a rotation by the moment it takes to read
// them again: a generation newer than any the bindings list is refused
// like any other (what is a rotation to this node is a forgery to the
// next), but not at once: the node asks for its bindings again; a command
// of one is given back to its queue, like one sealed with a key this node
// does not hold yet, until its retry budget is spent; a request or a
// system message waits up to bindingLag for the bindings to list it
// (holdForRotation).

// senders are the generations accepted per node; nil: not loaded, any
// generation is accepted. The map is never modified once stored.
type senders struct {
	gens  atomic.Pointer[map[string][]int]
	asked atomic.Int64 // when Config.OnNewerGeneration was last called (Unix ns)
}

// SetSenderGenerations sets, for every node of the mesh, the generations
// of its broker credential this node accepts messages from (see above);
// nil accepts any generation. The appliance calls it with every version of
// the bindings. Safe for concurrent use.
func (b *Bridge) SetSenderGenerations(gens map[string][]int) {
	if gens == nil {
		b.peers.senders.gens.Store(nil)
		return
	}
	c := make(map[string][]int, len(gens))
	for n, g := range gens {
		c[n] = slices.Sorted(slices.Values(g))
	}
	b.peers.senders.gens.Store(&c)
}

// unknown reports whether the bindings are loaded and list no node named
// node.
func (s *senders) unknown(node string) bool {
	p := s.gens.Load()
	if p == nil {
		return false
	}
	_, ok := (*p)[node]
	return !ok
}

// check returns nil when generation gen of node's broker user may speak
// for node, else a *forged saying why.
func (s *senders) check(node string, gen int) error {
	p := s.gens.Load()
	if p == nil {
		return nil
	}
	gens, ok := (*p)[node]
	switch {
	case !ok:
		return &codec.Forged{Cause: causeUnknownNode, Reason: fmt.Sprintf("node %s is not in this node's bindings", node)}
	case slices.Contains(gens, gen):
		return nil
	case len(gens) == 0:
		return &codec.Forged{Cause: causeStaleGeneration, Reason: fmt.Sprintf(
			"broker user %s: node %s has no credential generation in this node's bindings", BrokerUser(node, gen), node)}
	case gen > gens[len(gens)-1]:
		return &codec.Forged{Cause: causeNewerGeneration, Reason: fmt.Sprintf(
			"broker user %s: generation %d is newer than node %s's in this node's bindings (%v)", BrokerUser(node, gen), gen, node, gens)}
	}
	return &codec.Forged{Cause: causeStaleGeneration, Reason: fmt.Sprintf(
		"broker user %s: generation %d is not one of node %s's in this node's bindings (%v)", BrokerUser(node, gen), gen, node, gens)}
}

// Causes of a forged delivery, the cause of its log line.
const (
	causeNoNodeUser      = "no_node_user"     // no user_id, or not a node's broker user
	causeUnknownNode     = "unknown_node"     // a node's user, of a node the bindings do not have
	causeStaleGeneration = "stale_generation" // a generation the bindings do not list (revoked, never made by the admin)
	causeNewerGeneration = "newer_generation" // newer than every one the bindings list: a rotation this node has not read yet, or a forgery
	causeOther           = "other"            // any other
)

// forgedRefused logs a forged delivery once per cause and sender (its
// user_id); meshbox_errors_total{kind="forged"} counts them all.
func (b *Bridge) forgedRefused(f *codec.Forged, kind, userID string) {
	cause := f.Cause
	if cause == "" {
		cause = causeOther
	}
	if b.seen.forged.First(cause + "/" + userID) {
		b.log.Warn("forged message refused (logged once per cause and sender; meshbox_errors_total{kind=\"forged\"} counts them all)",
			"shape", kind, "cause", cause, "user_id", userID, "detail", f.Reason)
	}
}

// maxHeldForRotation bounds the deliveries of a session waiting at once
// for the bindings to list their sender's newer generation: past it, they
// are refused at once.
const maxHeldForRotation = 256

// holdForRotation takes a request or system message refused because its
// sender's generation is newer than the bindings list: a rotation under
// way, whose new generation the sender read from the database before this
// node did. It asks for the bindings again (Config.OnNewerGeneration) and
// gives the delivery to again once they list the generation, or after
// bindingLag (again then refuses it for good). It reports whether it took
// the delivery. A generation the broker accepted for a node's user was
// made by whoever runs the broker: what a forger gains is that wait.
func (s *session) holdForRotation(err error, d *amqp.Delivery, again func(*amqp.Delivery)) bool {
	fg := codec.AsForged(err)
	if fg == nil || fg.Cause != causeNewerGeneration {
		return false
	}
	b := s.b
	b.askBindings()
	if s.con.heldForRotation.Add(1) > maxHeldForRotation {
		s.con.heldForRotation.Add(-1)
		return false
	}
	held := *d // a copy: the reader's delivery is reused
	node, gen, _ := ParseBrokerUser(held.UserId)
	ok := s.work(func() {
		defer s.con.heldForRotation.Add(-1)
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for until := time.Now().Add(bindingLag); time.Now().Before(until); {
			select {
			case <-s.ctx.Done():
				return
			case <-tick.C:
			}
			if b.peers.senders.check(node, gen) == nil {
				break
			}
		}
		again(&held)
	})
	if !ok {
		s.con.heldForRotation.Add(-1)
	}
	return ok
}

// askBindings calls Config.OnNewerGeneration, at most once a second.
func (b *Bridge) askBindings() {
	if b.cfg.OnNewerGeneration == nil {
		return
	}
	now := time.Now().UnixNano()
	last := b.peers.senders.asked.Load()
	if now-last < int64(time.Second) || !b.peers.senders.asked.CompareAndSwap(last, now) {
		return
	}
	b.cfg.OnNewerGeneration()
}
