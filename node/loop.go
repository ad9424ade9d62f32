package node

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"
)

// The node's goroutines: the loop that sleeps until the next deadline, the
// sender, and the effects applier.

// loop sends heartbeats and probes when they are due and expires silent
// peers. Between rounds it sleeps until the next deadline (see tick), or
// until a change of the view may have brought one closer (wakeLoop), so an
// idle node wakes only for its heartbeats, and a node waiting for its link
// (waitLink) with no peer to judge not at all. It exits when ctx is done.
func (n *Node) loop(ctx context.Context) {
	defer n.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		if d, ok := n.tick(); ok {
			t.Reset(d)
		} else {
			t.Stop()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-n.wakeLoop:
		}
	}
}

// tick is one round of the loop. It returns how long the loop may sleep
// before the next thing is due, and false when nothing is.
func (n *Node) tick() (time.Duration, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := time.Now()
	n.expireLocked(now)
	if n.waitLink {
		// Nothing can go out before LinkUp, which wakes the loop: the
		// heartbeat and the probe are due then.
		next, ok := n.nextDeadlineLocked()
		return max(next.Sub(now), 0), ok
	}
	if !now.Before(n.nextHeartbeat) {
		// The interval is announced in this heartbeat (heartbeat_ms) and
		// the next one comes within it, so peers always judge this node's
		// silence by an interval it keeps.
		n.hbInterval = n.heartbeatIntervalLocked()
		n.enqueueLocked(intent{typ: TypeHeartbeat})
		n.nextHeartbeat = now.Add(jittered(n.hbInterval))
	}
	if !now.Before(n.nextProbe) {
		n.probeRingLocked()
		n.nextProbe = now.Add(jittered(n.cfg.DiscoveryInterval))
	}
	next, _ := n.nextDeadlineLocked() // a heartbeat is always due
	return max(next.Sub(now), 0), true
}

// nextDeadlineLocked is the earliest moment the loop has something to do:
// a heartbeat, a probe (neither while waitLink), a peer's window running
// out, a gone peer's retention ending, or the grace of an expected peer
// that has not appeared; false when there is none. The expiry checks are
// strict (a peer is gone once its silence is longer than the window), so
// their deadlines lie just past the limit.
func (n *Node) nextDeadlineLocked() (time.Time, bool) {
	var next time.Time
	consider := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	if !n.waitLink {
		consider(n.nextHeartbeat)
		consider(n.nextProbe)
	}
	for _, p := range n.peers {
		switch p.state {
		case StateUp:
			if !n.linkDown {
				consider(n.silenceBaseLocked(p).Add(n.windowLocked(p) + 1))
			}
		case StateGone:
			if !p.expected {
				consider(p.since.Add(n.cfg.GoneRetention + 1))
			}
		case StateAbsent:
			if !p.warnedAbsent {
				consider(p.since.Add(n.absentGrace() + 1))
			}
		}
	}
	return next, !next.IsZero()
}

// windowLocked is how long peer p may stay silent before it is gone.
func (n *Node) windowLocked(p *peer) time.Duration {
	iv := p.interval
	if iv == 0 {
		iv = n.cfg.HeartbeatInterval
	}
	return time.Duration(n.cfg.MissedHeartbeats) * iv
}

// silenceBaseLocked is when p's current silence began: its last message,
// or the moment this node could publish again if that is later.
func (n *Node) silenceBaseLocked(p *peer) time.Time {
	if n.linkRecoveredAt.After(p.lastSeen) {
		return n.linkRecoveredAt
	}
	return p.lastSeen
}

// absentGrace is how long an expected peer may stay unseen before the
// node warns about it: a peer that runs answers this node's hello at
// once, and one that starts later says hello itself.
func (n *Node) absentGrace() time.Duration {
	return time.Duration(n.cfg.MissedHeartbeats) * n.cfg.DiscoveryInterval
}

// expireLocked marks silent peers gone, forgets old gone peers and warns
// once about each expected peer that has not appeared. Silence is not
// held against peers while this node cannot publish: then the broker is
// away for this node too, and the peers get a fresh window once it is
// back.
func (n *Node) expireLocked(now time.Time) {
	for name, p := range n.peers {
		switch p.state {
		case StateUp:
			if n.linkDown {
				continue
			}
			if now.Sub(n.silenceBaseLocked(p)) > n.windowLocked(p) {
				n.setGoneLocked(p, now, fmt.Sprintf("missed %d heartbeats", n.cfg.MissedHeartbeats))
			}
		case StateGone:
			if !p.expected && now.Sub(p.since) > n.cfg.GoneRetention {
				delete(n.peers, name)
				n.changedLocked()
			}
		case StateAbsent:
			if !p.warnedAbsent && now.Sub(p.since) > n.absentGrace() {
				p.warnedAbsent = true
				n.logger.Warn("expected peer has not appeared", "peer", p.name, "expected_since", p.since)
			}
		}
	}
}

// sender publishes the queued messages one at a time. It exits when ctx
// is done.
func (n *Node) sender(ctx context.Context) {
	defer n.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.wakeSend:
		}
		for ctx.Err() == nil {
			n.mu.Lock()
			if len(n.pending) == 0 {
				n.mu.Unlock()
				break
			}
			it := n.pending[0]
			n.pending = n.pending[1:]
			delete(n.pendingSet, it)
			var body []byte
			if it.typ != typeProbe { // a probe carries nothing
				body = n.buildLocked(it)
			}
			ups := n.linkUps
			n.mu.Unlock()

			pctx, cancel := context.WithTimeout(ctx, n.cfg.PublishTimeout)
			sentAt := time.Now()
			var err error
			switch {
			case it.typ == typeProbe:
				err = n.cfg.Link.ProbeNode(pctx, it.to, func() { n.probeReturned(it, sentAt) })
			case it.to == "":
				err = n.cfg.Link.PublishSystem(pctx, it.typ, body)
			default:
				err = n.cfg.Link.SendSystem(pctx, it.to, it.typ, body)
			}
			cancel()
			// Asked outside n.mu: the link calls LinkUp with its own locks
			// held.
			unconnected := err != nil && it.to == "" && n.cfg.Connected != nil && !n.cfg.Connected()
			n.published(ctx, it, sentAt, err, unconnected, ups)
		}
	}
}

// published records the outcome of one publish, sent at sentAt. The link
// is judged by broadcasts only: an addressed message may fail for its
// addressee, and when the broker had no route to it (Config.NoRoute), the
// addressee is not connected (see noRouteLocked). unconnected says a
// failed broadcast found the link not connected after it failed; ups is
// linkUps before it was sent: a LinkUp since then may have come before
// the link was asked, and then the node does not wait for another.
func (n *Node) published(ctx context.Context, it intent, sentAt time.Time, err error, unconnected bool, ups uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err != nil {
		if ctx.Err() != nil {
			return // closing
		}
		n.m.errors.WithLabelValues("publish").Inc()
		if unconnected && ups == n.linkUps && !n.waitLink {
			n.waitLink = true
			n.wakeLoopLocked() // its heartbeat and probe deadlines are off
		}
		if it.to == "" && !n.linkDown {
			n.linkDown = true
			if n.everSent {
				n.logger.Warn("cannot send discovery messages; peers are not expired while this lasts", "type", it.typ, "err", err)
			} else {
				n.logger.Info("discovery waits for the broker link", "err", err)
			}
		} else if it.to != "" && n.cfg.NoRoute != nil && n.cfg.NoRoute(err) {
			n.noRouteLocked(it, sentAt)
		} else {
			n.logger.Debug("discovery message not sent", "type", it.typ, "to", it.to, "err", err)
		}
		return
	}
	n.m.messages.WithLabelValues(it.typ, "out").Inc()
	if it.typ == typeProbe {
		return // written, not confirmed: it says nothing of the link
	}
	if !n.everSent {
		n.firstSent = time.Now()
		n.changedLocked() // the peers' protocols are reported once settled
	}
	n.everSent = true
	n.waitLink = false
	if n.linkDown {
		n.linkDown = false
		n.linkRecoveredAt = time.Now()
		n.logger.Info("discovery messages flow again; asking every peer again")
		n.enqueueLocked(intent{typ: TypeHello}) // version 2 peers answer it with an info
	}
}

// effects applies the view to the link (gone marks, routes), to
// OnLocalChange and to the metrics, in that order, whenever it changed.
// It is the only caller of those, so they see changes in order. It exits
// when ctx is done.
func (n *Node) effects(ctx context.Context) {
	defer n.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.wakeEffects:
		}
		n.applyEffects()
	}
}

func (n *Node) applyEffects() {
	n.mu.Lock()
	gen := n.gen
	routes := n.routesLocked()
	gone := n.goneLocked()
	local := n.local
	counts := map[string]int{StateUp: 0, StateGone: 0, StateAbsent: 0}
	for _, p := range n.peers {
		counts[p.state]++
	}
	remote := len(n.capabilitiesLocked().Remote)
	oldest, settled := n.oldestProtoLocked()
	eventPeers := n.peerNamesLocked()
	known := n.knownOldestLocked()
	// An event lane is read by every node known at its version or later.
	eventLegacy := known < EventLaneProtocolVersion
	var listeners *Listeners
	if n.cfg.OnEventListeners != nil {
		listeners = n.listenersLocked()
	}
	n.mu.Unlock()

	a := &n.applied // touched only here, and by Close after the goroutine ended
	for name := range a.gone {
		if _, still := gone[name]; !still {
			n.cfg.Link.MarkGone(name, time.Time{})
		}
	}
	for name, since := range gone {
		if was, ok := a.gone[name]; !ok || !was.Equal(since) {
			n.cfg.Link.MarkGone(name, since)
		}
	}
	a.gone = gone
	if a.routes == nil || !maps.EqualFunc(routes, a.routes, slices.Equal) {
		n.cfg.Link.SetRoutes(routes)
		a.routes = routes
	}
	if n.cfg.OnLocalChange != nil && (!a.set || !local.equal(a.local)) {
		n.cfg.OnLocalChange(slices.Clone(local.caps), slices.Clone(local.stages))
		a.local, a.set = local, true
	}
	if n.cfg.OnEventPeers != nil && (!a.eventSet || eventLegacy != a.eventLegacy || !slices.Equal(eventPeers, a.eventPeers)) {
		n.cfg.OnEventPeers(eventPeers, eventLegacy)
		a.eventPeers, a.eventLegacy, a.eventSet = eventPeers, eventLegacy, true
	}
	if n.cfg.OnKnownProtocols != nil && (!a.knownSet || known != a.known) {
		n.cfg.OnKnownProtocols(known)
		a.known, a.knownSet = known, true
	}
	if n.cfg.OnEventListeners != nil && !listeners.equal(a.listeners) {
		n.cfg.OnEventListeners(listeners)
		a.listeners = listeners
	}
	if n.cfg.OnPeerProtocols != nil {
		switch {
		case settled && oldest != a.oldest:
			n.cfg.OnPeerProtocols(oldest)
			a.oldest = oldest
		case !settled && !a.settle && !n.firstSentAt().IsZero():
			a.settle = true
			time.AfterFunc(time.Until(n.firstSentAt().Add(PeerProtocolSettle+10*time.Millisecond)), func() {
				n.mu.Lock()
				n.changedLocked()
				n.mu.Unlock()
			})
		}
	}
	for state, c := range counts {
		n.m.peers.WithLabelValues(state).Set(float64(c))
	}
	n.m.caps.WithLabelValues("local").Set(float64(len(local.caps)))
	n.m.caps.WithLabelValues("remote").Set(float64(remote))

	n.mu.Lock()
	n.applied.gen = gen
	n.mu.Unlock()
}

// oldestProtoLocked returns the lowest protocol version the up peers
// speak (ProtocolVersion when none is up), and whether the node's first
// discovery message has been out for PeerProtocolSettle.
func (n *Node) oldestProtoLocked() (oldest int, settled bool) {
	oldest = ProtocolVersion
	for _, p := range n.peers {
		if p.state == StateUp {
			oldest = min(oldest, p.proto)
		}
	}
	return oldest, n.everSent && time.Since(n.firstSent) >= PeerProtocolSettle
}

// peerNamesLocked returns the sorted names of the peers the node knows
// of, up or not (OnEventPeers).
func (n *Node) peerNamesLocked() []string {
	names := make([]string, 0, len(n.peers))
	for name := range n.peers {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// knownOldestLocked returns the lowest protocol version of the peers
// the node knows of, up or not (OnKnownProtocols): 0 for one not heard,
// and without node records (a mesh without a database), when the node
// cannot know every node that may read or publish.
func (n *Node) knownOldestLocked() int {
	if n.expected == nil {
		return 0
	}
	oldest := ProtocolVersion
	for _, p := range n.peers {
		oldest = min(oldest, p.proto)
	}
	return oldest
}

// firstSentAt returns when the node's first discovery message went out
// (zero: none yet).
func (n *Node) firstSentAt() time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.firstSent
}
