package link

import (
	"slices"
	"sync/atomic"
	"time"
)

// An event goes to the broker only when another node listens to its
// topic. The node's discovery gathers what the other nodes listen to
// (package node, Listeners) and hands it over with SetListeners; the
// bridge asks KeepLocal before it sends a program's event. The answer is
// "send" unless the link is connected and the view is current on this
// connection: it says for every node what it listens to, and it holds only
// records discovery heard after it was told of this connection (the view's
// since is not before the connection's start, taken before discovery is
// told). While the link is between connections, or hands one over, no
// view counts. An event kept local has reached the node's own subscribers
// through the NATS server, which is all that a subscriber on no other
// node could have had.

// listening is an EventBinder's view of the other nodes' interest.
type listening struct {
	view      atomic.Pointer[listenView]
	connected atomic.Pointer[time.Time] // when the link's connection started (nil: between connections)
	kept      atomic.Uint64
}

// maxStatusListeners bounds the topic patterns the status lists.
const maxStatusListeners = 100

// listenView is one view: wants nil means every topic may be listened to.
type listenView struct {
	wants    func(topic string) bool
	since    time.Time
	why      string
	patterns []string
}

// SetListeners replaces the view of what the other nodes listen to,
// made of what discovery heard since since: all says any topic may be
// listened to (why says why); otherwise wants reports whether some other
// node listens to a topic, one of patterns (AMQP syntax).
func (b *EventBinder) SetListeners(all bool, why string, patterns []string, wants func(topic string) bool, since time.Time) {
	v := &listenView{since: since, why: why, patterns: slices.Clone(patterns)}
	if !all {
		v.wants = wants
	}
	b.listen.view.Store(v)
}

// Connected records that the link's connection started at now, before
// discovery is told of it: a view made of records heard before now may
// miss what a node changed while the link was down.
func (b *EventBinder) Connected(now time.Time) { b.listen.connected.Store(&now) }

// Disconnected records that the link left its connection (or hands it
// over): no view counts until Connected.
func (b *EventBinder) Disconnected() { b.listen.connected.Store(nil) }

// KeepLocal reports whether an event of topic is kept on this node, not
// sent to the broker: the link is connected, the view of what the other
// nodes listen to is current, and none of them listens to topic. It
// counts the events kept.
func (b *EventBinder) KeepLocal(topic string, connected bool) bool {
	v := b.listen.view.Load()
	if !connected || v == nil || v.wants == nil {
		return false
	}
	if c := b.listen.connected.Load(); c == nil || v.since.Before(*c) {
		return false
	}
	if v.wants(topic) {
		return false
	}
	b.listen.kept.Add(1)
	if b.metrics != nil {
		b.metrics.eventsKept.Inc()
	}
	return true
}

// listenersStatus returns the status's view of what the other nodes
// listen to (nil: no view yet).
func (b *EventBinder) listenersStatus() *ListenersStatus {
	v := b.listen.view.Load()
	if v == nil {
		return nil
	}
	st := &ListenersStatus{KeptLocal: b.listen.kept.Load()}
	if v.wants == nil {
		st.All, st.Why = true, v.why
		return st
	}
	st.Count, st.Topics = len(v.patterns), v.patterns[:min(len(v.patterns), maxStatusListeners)]
	return st
}
