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
	// Since is when the node last heard that its link connected (LinkUp,
	// or its Start): the view holds only records heard since, so it is
	// current on every connection the link made before that moment, and
	// on none made after it (see the bridge's link.EventBinder).
	Since time.Time

	match *wire.EventMatcher
}

// Wants reports whether some other node listens to events of topic.
func (l *Listeners) Wants(topic string) bool {
	if l == nil || l.All {
		return true
	}
	return l.match.Matches(topic)
}

func (l *Listeners) equal(o *Listeners) bool {
	// A new Since (a new connection) hands the view over again.
	return o != nil && l.All == o.All && l.Why == o.Why && l.Since.Equal(o.Since) && slices.Equal(l.Patterns, o.Patterns)
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
	n.listening = slices.Clone(patterns)
	n.announceListeningLocked()
}

// KeepListening adds patterns to what the node says its programs listen
// to, until until: after a restart, its event queue keeps the bindings of
// its previous run for a while (link.EventKeepAfterStart), and the events
// of those topics should keep coming into it while its programs come
// back. Call it before Start.
func (n *Node) KeepListening(patterns []string, until time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(patterns) == 0 || !time.Now().Before(until) {
		return
	}
	n.prior = slices.Clone(patterns)
	n.announceListeningLocked()
	time.AfterFunc(time.Until(until), func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		if !n.closed {
			n.prior = nil
			n.announceListeningLocked()
		}
	})
}

// maxEventsBytes bounds the patterns a record carries, in bytes: beyond
// it (or beyond MaxEvents) the node says it listens to everything ("#"),
// which is true of what it may receive, and keeps its record within
// MaxMessageBytes beside its capabilities and stages.
const maxEventsBytes = 64 << 10

// announceListeningLocked makes the record's events what the node's
// programs listen to (and the previous run's, while kept), and sends an
// update when they changed.
func (n *Node) announceListeningLocked() {
	events := append(slices.Clone(n.listening), n.prior...)
	size := 0
	for _, p := range events {
		size += len(p) + 3
		if wire.ValidEventPattern(p) != nil {
			events = []string{wire.AllEvents} // cannot be said: say everything
			break
		}
	}
	slices.Sort(events)
	if events = slices.Compact(events); len(events) > MaxEvents || size > maxEventsBytes {
		events = []string{wire.AllEvents}
	}
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
	if p.heardOn != n.linkUps+1 {
		p.heardOn = n.linkUps + 1
		n.changedLocked()
	}
}

// listenersLocked returns what the other nodes listen to.
func (n *Node) listenersLocked() *Listeners {
	all := func(why string) *Listeners {
		return &Listeners{All: true, Why: why, Since: n.linkUpAt}
	}
	if n.expected == nil {
		return all("the mesh has no node records: any node may listen")
	}
	// Every node the records name is a peer (SetExpected), absent until
	// heard.
	set := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(n.peers)) {
		p := n.peers[name]
		switch {
		case p.state == StateAbsent:
			return all("node " + p.name + " not heard yet")
		case p.proto < ListenProtocolVersion:
			return all("node " + p.name + " runs an older meshbox, which does not say what it listens to")
		case !p.hasRecord || p.heardOn != n.linkUps+1:
			return all("node " + p.name + " not heard since the link connected")
		}
		for _, e := range p.record.events {
			if set[e] = true; len(set) > MaxListeners {
				// Matched against every event: a peer that says it
				// listens to a great many patterns costs the publishers
				// what sending it all costs, no more.
				return all(fmt.Sprintf("the other nodes listen to more than the %d topic patterns a node matches its events against", MaxListeners))
			}
		}
	}
	pats := slices.Sorted(maps.Keys(set))
	if len(pats) <= coverAtMost {
		pats = wire.CoverPatterns(pats)
	}
	return &Listeners{Patterns: pats, Since: n.linkUpAt, match: wire.NewEventMatcher(pats)}
}
