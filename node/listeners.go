package node

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/meshbox/meshbox/internal/wire"
)

// Who listens to which events, mesh-wide. A version 7 node's record says
// which topic patterns its programs listen to (SetListening), and every
// node gathers its peers' into Listeners, which its bridge reads before it
// sends an event to the broker: an event no other node listens to stays
// on the node (its local subscribers have it from the NATS server).
//
// The view holds only what the node knows to be current. A peer's record
// counts while it came (or a heartbeat confirmed its hash) since this
// node's link last connected: an update sent while the link was down never
// arrived, so after each LinkUp every peer counts as listening to
// everything until its answer to the hello is in (a round trip). Every
// node that may publish or listen must be known: without node records (a
// mesh without a database), with a node the records name but nobody heard,
// or with a peer of an older version or whose record is not current, the
// view is All, and every event goes to the broker as before. A peer that
// is gone keeps its last record: its queue stays bound while it is away,
// and it says what it listens to when it comes back.

// MaxListeners bounds the distinct topic patterns of the other nodes a
// node matches its events against; beyond it, every event goes to the
// broker.
const MaxListeners = 1024

// coverAtMost bounds the patterns the view drops covered ones from
// (each pair compared).
const coverAtMost = 128

// Listeners is the events the other nodes listen to, as far as this node
// knows (Config.OnEventListeners).
type Listeners struct {
	// All: some node may listen to anything (Why says which and why);
	// every event goes to the broker.
	All bool
	Why string
	// Patterns are the topic patterns (AMQP syntax) the other nodes
	// listen to, without those another covers. Meaningful when !All.
	Patterns []string
	// At is when the view was taken: a view taken before the link's
	// current connection may miss a peer's change (see the bridge).
	At time.Time

	linkUps uint64 // the node's connection it was taken on: a new one hands the view again
	match   *wire.EventMatcher
}

// Wants reports whether some other node listens to events of topic.
func (l *Listeners) Wants(topic string) bool {
	if l == nil || l.All {
		return true
	}
	return l.match.Matches(topic)
}

func (l *Listeners) equal(o *Listeners) bool {
	return o != nil && l.All == o.All && l.Why == o.Why && l.linkUps == o.linkUps && slices.Equal(l.Patterns, o.Patterns)
}

// SetListening tells the node the topic patterns (AMQP syntax, after
// evt., wire.EventPattern) local programs listen to. When they differ from
// the last ones, peers get an update at once. It may be called before
// Start (the hello then carries them) and after Close (ignored).
func (n *Node) SetListening(patterns []string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	var events []string
	for _, p := range patterns {
		if wire.ValidEventPattern(p) == nil && len(events) < MaxEvents {
			events = append(events, p)
		}
	}
	slices.Sort(events)
	events = slices.Compact(events)
	if slices.Equal(events, n.local.events) {
		return
	}
	n.local.events = events
	n.local.hash = HostHash(n.local.caps, n.local.stages, events...)
	n.changedLocked()
	if n.started {
		n.enqueueLocked(intent{typ: TypeUpdate})
	}
}

// heardLocked notes that p's record is current on this node's link.
func (n *Node) heardLocked(p *peer) {
	if p.heardSince != n.linkUps || !p.heard {
		p.heardSince, p.heard = n.linkUps, true
		n.changedLocked()
	}
}

// listenersLocked returns what the other nodes listen to.
func (n *Node) listenersLocked(now time.Time) *Listeners {
	all := func(why string) *Listeners { return &Listeners{All: true, Why: why, At: now, linkUps: n.linkUps} }
	if n.expected == nil {
		return all("the mesh has no node records: any node may listen")
	}
	for _, name := range slices.Sorted(maps.Keys(n.expected)) {
		if name != n.cfg.Name && n.peers[name] == nil {
			return all("node " + name + " not heard yet")
		}
	}
	var pats []string
	for _, name := range slices.Sorted(maps.Keys(n.peers)) {
		p := n.peers[name]
		switch {
		case p.state == StateAbsent:
			return all("node " + p.name + " not heard yet")
		case p.proto < ListenProtocolVersion:
			return all("node " + p.name + " runs an older meshbox, which does not say what it listens to")
		case !p.hasRecord || !p.heard || p.heardSince != n.linkUps:
			return all("node " + p.name + " not heard since the link connected")
		}
		pats = append(pats, p.record.events...)
	}
	slices.Sort(pats)
	if pats = slices.Compact(pats); len(pats) > MaxListeners {
		// Matched against every event: a peer that says it listens to
		// a great many patterns costs the publishers what sending it
		// all costs, no more.
		return all(fmt.Sprintf("the other nodes listen to %d topic patterns, more than the %d a node matches its events against", len(pats), MaxListeners))
	}
	if len(pats) <= coverAtMost {
		pats = wire.CoverPatterns(pats)
	}
	return &Listeners{Patterns: pats, At: now, linkUps: n.linkUps, match: wire.NewEventMatcher(pats)}
}
