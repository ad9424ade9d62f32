package node

import (
	"reflect"
	"slices"
	"time"
)

// Message handling: discovery messages in, the view updated, replies and
// updates queued. n.mu is held in every *Locked method.

// handleLocked applies m; verified says its signature was verified with
// the sender's signing key.
func (n *Node) handleLocked(m *Message, verified bool) {
	now := time.Now()
	if m.Node == n.cfg.Name {
		if m.StartedAt.Equal(n.cfg.StartedAt) {
			return // our own broadcast, back from the mesh exchange
		}
		n.m.rejected.WithLabelValues("name_conflict").Inc()
		if !n.conflictWarned {
			n.conflictWarned = true
			n.logger.Warn("another process announces itself with this node's name", "its_started_at", m.StartedAt)
		}
		return
	}
	if (m.Type == TypeQuery || m.Type == TypePing) && m.To != "" && m.To != n.cfg.Name {
		return // a question for another node; an info for another is still a true record
	}
	p := n.peers[m.Node]
	if p == nil {
		if len(n.peers) >= maxPeers {
			n.m.rejected.WithLabelValues("too_many_peers").Inc()
			n.logger.Debug("discovery message dropped: too many peers", "node", m.Node, "limit", maxPeers)
			return
		}
		p = &peer{name: m.Node}
		n.peers[m.Node] = p
	}
	restarted := false
	if !p.startedAt.IsZero() && !m.StartedAt.Equal(p.startedAt) {
		if m.StartedAt.Before(p.startedAt) {
			n.m.rejected.WithLabelValues("stale").Inc()
			return // a late message from an earlier run of the peer
		}
		restarted = true
		p.seq, p.recordSeq, p.hasRecord, p.record = 0, 0, false, hostRecord{}
		p.version = "" // a restart may be an upgrade or a downgrade to a meshbox that advertises none
	} else if p.state == StateGone && p.reason == reasonLeft {
		n.m.rejected.WithLabelValues("stale").Inc()
		return // this run of the peer said bye; anything later from it is late
	} else if verified && !p.startedAt.IsZero() && m.Seq <= p.seq {
		// A signer numbers every message of a run in the order it sends
		// them: one this node has passed already is a copy.
		n.refusedLocked(reasonReplayed, m.Node, m.Type)
		return
	}
	n.m.messages.WithLabelValues(m.Type, "in").Inc()

	p.lastSeen = now
	p.startedAt = m.StartedAt
	p.seq = max(p.seq, m.Seq)
	if m.Version != "" {
		p.version = m.Version
	}
	if m.Type == TypeHello || m.Type == TypeInfo || m.Type == TypeUpdate || m.Type == TypeHeartbeat {
		p.revision = m.Revision
		if m.Health != nil && (m.Type == TypeHeartbeat || !p.hasRecord || m.Seq >= p.recordSeq) {
			if p.health == nil || !reflect.DeepEqual(*p.health, *m.Health) {
				n.changedLocked()
			}
			p.health = m.Health
		}
	}
	p.proto = max(m.Proto, 1) // a version 1 node does not say
	if m.HeartbeatMS > 0 {
		if iv := time.Duration(m.HeartbeatMS) * time.Millisecond; iv != p.interval {
			p.interval = iv
			n.wakeLoopLocked() // a shorter window ends sooner
		}
	}

	switch m.Type {
	case TypeBye:
		if p.state != StateGone {
			n.setGoneLocked(p, now, reasonLeft)
		}
		return
	case TypeHello, TypeInfo, TypeUpdate:
		if !p.hasRecord || m.Seq >= p.recordSeq {
			rec := hostRecord{caps: m.Capabilities, stages: m.Stages, events: m.Events, hash: m.Hash}
			if !p.hasRecord || !rec.equal(p.record) {
				if p.hasRecord && p.state == StateUp {
					n.logger.Debug("peer's capabilities changed", "peer", p.name, "capabilities", len(rec.caps), "stages", len(rec.stages))
				}
				n.changedLocked()
			}
			p.record, p.hasRecord, p.recordSeq = rec, true, m.Seq
			n.heardLocked(p)
		}
		if m.Type == TypeHello && p.proto >= 2 {
			// A version 2 hello asks every node for its record: the
			// sender sends no broadcast query (a third of the broker's
			// work when it joins a large mesh).
			n.enqueueLocked(intent{typ: TypeInfo, to: p.name})
		}
	case TypeHeartbeat:
		// A record or a health summary this node missed (a message lost,
		// or held back by the broker): ask for them again.
		if !p.hasRecord || m.Hash != p.record.hash ||
			m.HealthHash != "" && (p.health == nil || p.health.hash() != m.HealthHash) {
			n.enqueueLocked(intent{typ: TypeQuery, to: p.name})
		}
		switch {
		case p.hasRecord && m.Hash == p.record.hash:
			n.heardLocked(p) // the record held is the peer's now
		case p.heardOn != 0:
			// A change this node missed: what the peer listens to is
			// not known until its answer.
			p.heardOn = 0
			n.changedLocked()
		}
	case TypeQuery:
		n.enqueueLocked(intent{typ: TypeInfo, to: p.name})
		if !p.hasRecord {
			n.enqueueLocked(intent{typ: TypeQuery, to: p.name})
		}
	case TypePing:
		// The broker routed it here, which is all the sender asked.
		if !p.hasRecord {
			n.enqueueLocked(intent{typ: TypeQuery, to: p.name})
		}
	case TypeGone:
		n.verifyGoneLocked(m.Peer)
		if !p.hasRecord {
			n.enqueueLocked(intent{typ: TypeQuery, to: p.name})
		}
	}
	switch {
	case p.state != StateUp:
		n.setUpLocked(p, now)
	case restarted:
		p.since = now
		n.logger.Info("peer restarted", "peer", p.name, "version", p.version, "started_at", p.startedAt)
		n.changedLocked()
	}
}

const reasonLeft = "left"

func (n *Node) setUpLocked(p *peer, now time.Time) {
	prev := p.state
	p.state, p.since, p.reason = StateUp, now, ""
	msg := "peer up"
	switch prev {
	case StateGone:
		msg = "peer is back"
	case StateAbsent:
		msg = "expected peer appeared"
	}
	n.logger.Info(msg, "peer", p.name, "version", p.version, "started_at", p.startedAt)
	n.changedLocked()
}

func (n *Node) setGoneLocked(p *peer, now time.Time, reason string) {
	p.state, p.since, p.reason = StateGone, now, reason
	if reason == reasonLeft {
		n.logger.Info("peer left the mesh", "peer", p.name)
	} else {
		n.logger.Warn("peer gone", "peer", p.name, "reason", reason, "last_seen", p.lastSeen)
	}
	n.changedLocked()
}

// changedLocked wakes the effects goroutine: routes, gone marks, local
// record or metrics may have changed. It wakes the loop too: a new peer,
// or one that changed state, may have a deadline before the loop's.
func (n *Node) changedLocked() {
	n.gen++
	select {
	case n.wakeEffects <- struct{}{}:
	default:
	}
	n.wakeLoopLocked()
}

// wakeLoopLocked makes the loop recompute its next deadline.
func (n *Node) wakeLoopLocked() {
	select {
	case n.wakeLoop <- struct{}{}:
	default:
	}
}

func (n *Node) enqueueLocked(it intent) {
	if n.pendingSet[it] {
		return
	}
	n.pendingSet[it] = true
	n.pending = append(n.pending, it)
	select {
	case n.wakeSend <- struct{}{}:
	default:
	}
}

// setLocalLocked takes what local programs subscribe to now and reports
// whether the local record changed.
func (n *Node) setLocalLocked(subjects []string) bool {
	caps, stages, skipped := localNames(subjects)
	for _, s := range skipped {
		if !n.warnedSkipped[s] && len(n.warnedSkipped) < 1000 {
			n.warnedSkipped[s] = true
			n.logger.Warn("local subscription not advertised: not a valid capability or stage name (dot-separated letters, digits, '-', '_'; at most 128)", "subject", clip(s))
		}
	}
	rec := hostRecord{caps: caps, stages: stages, events: n.local.events, hash: HostHash(caps, stages, n.local.events...)}
	if n.localKnown && rec.equal(n.local) {
		return false
	}
	if n.localKnown {
		n.logger.Info("local capabilities changed",
			"added", added(n.local.caps, caps), "removed", added(caps, n.local.caps),
			"stages_added", added(n.local.stages, stages), "stages_removed", added(stages, n.local.stages))
	}
	n.local, n.localKnown = rec, true
	n.changedLocked()
	return true
}

// added returns the names in b that are not in a (both sorted).
func added(a, b []string) []string {
	var out []string
	for _, s := range b {
		if _, found := slices.BinarySearch(a, s); !found {
			out = append(out, s)
		}
	}
	return out
}

// buildLocked builds the message for it, with the next sequence number.
func (n *Node) buildLocked(it intent) []byte {
	n.seq++
	m := Message{
		V:         typeVersion(it.typ),
		Type:      it.typ,
		Node:      n.cfg.Name,
		To:        it.to,
		StartedAt: n.cfg.StartedAt,
		Seq:       n.seq,
		Proto:     ProtocolVersion,
		Peer:      it.peer,
	}
	switch it.typ {
	case TypeHello, TypeInfo, TypeUpdate:
		m.Health = n.healthForLocked(it.typ)
		m.Version, m.Revision = n.cfg.Version, n.revision
		m.Capabilities, m.Stages, m.Events, m.Hash = n.local.caps, n.local.stages, n.local.events, n.local.hash
		m.HeartbeatMS = n.hbInterval.Milliseconds()
	case TypeHeartbeat:
		m.Health = n.healthForLocked(it.typ)
		if m.Health == nil && n.health != nil {
			m.HealthHash = n.health.hash()
		}
		m.Version, m.Revision, m.Hash = n.cfg.Version, n.revision, n.local.hash
		m.HeartbeatMS = n.hbInterval.Milliseconds()
	}
	body, err := EncodeMessage(&m)
	if err != nil {
		panic("node: encode discovery message: " + err.Error()) // only strings, ints and times: cannot fail
	}
	if n.cfg.Signer != nil {
		body = signBody(body, n.cfg.Signer)
	}
	return body
}
