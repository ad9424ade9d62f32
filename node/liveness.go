package node

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/meshbox/meshbox/internal/wire"
)

// Liveness at scale: probes of a few neighbours on a ring, which ask the
// broker, so a killed peer is noticed within seconds at the same cost at
// any mesh size, and heartbeats whose interval grows with the mesh so a
// node's download and the broker's load stay bounded. See "Liveness at
// scale" in doc.go.
// n.mu is held in every *Locked method.

// Jitter: every periodic message goes out after a random part of its
// interval is taken off, so nodes started together do not stay in step.
const (
	jitterFraction = 0.2 // a period d becomes a delay in [0.8·d, d]
	probeFanout    = 2   // ring successors each node probes
)

// jittered returns d less a random part of at most jitterFraction of it:
// a delay in [(1-jitterFraction)·d, d]. Never more than d, so a peer that
// judges silence by d is never misled.
func jittered(d time.Duration) time.Duration {
	return d - time.Duration(rand.Float64()*jitterFraction*float64(d))
}

// heartbeatFlatMesh is the mesh size up to which a node sends its
// heartbeats every HeartbeatInterval. In a larger mesh the interval grows
// in proportion to the mesh, so that a node hears no more heartbeats a
// second than in a mesh of this size: liveness costs it no more download
// as peers join.
const heartbeatFlatMesh = 10

// firstHeartbeat is when a node's first heartbeat goes out after its
// hello, which announced the interval d: a random moment within d, so
// that the heartbeats of nodes started together (a house after a power
// cut) are spread over the interval from the first one on.
func firstHeartbeat(d time.Duration) time.Duration {
	return max(time.Millisecond, time.Duration(rand.Float64()*float64(d)))
}

// HeartbeatIntervalFor is the heartbeat interval a node of a mesh of size
// nodes uses: base up to heartbeatFlatMesh nodes, base × nodes /
// heartbeatFlatMesh beyond (every broadcast reaches every node, so a node
// receives nodes heartbeats per interval), and at least the interval that
// keeps the broadcast heartbeats of the whole mesh within budget
// deliveries per second (meshBudgetInterval). The result is at most the
// protocol's limit of an hour.
func HeartbeatIntervalFor(nodes int, base time.Duration, budget float64) time.Duration {
	if nodes < 1 {
		return base
	}
	iv := max(base, base*time.Duration(nodes)/heartbeatFlatMesh, meshBudgetInterval(nodes, budget))
	return min(iv, maxHeartbeatMS*time.Millisecond)
}

// meshBudgetInterval is the shortest interval at which the broadcast
// heartbeats of a mesh of nodes stay within budget deliveries per second:
// a mesh of n nodes costs n²/mean-interval deliveries per second (the
// sender's own queue gets its broadcast too), and jitter makes the mean
// interval (1 - jitterFraction/2) of the interval. Zero for no budget.
func meshBudgetInterval(nodes int, budget float64) time.Duration {
	if budget <= 0 {
		return 0
	}
	need := float64(nodes) * float64(nodes) / (budget * (1 - jitterFraction/2))
	return time.Duration(math.Ceil(need*1000)) * time.Millisecond
}

// heartbeatIntervalLocked is the interval for this node's next heartbeat,
// from the number of nodes it sees up (itself included).
func (n *Node) heartbeatIntervalLocked() time.Duration {
	return HeartbeatIntervalFor(n.upNodesLocked(), n.cfg.HeartbeatInterval, n.cfg.HeartbeatBudget)
}

// upNodesLocked is the number of nodes this node sees up, itself included.
func (n *Node) upNodesLocked() int {
	up := 1
	for _, p := range n.peers {
		if p.state == StateUp {
			up++
		}
	}
	return up
}

// revisionHeartbeatLocked brings this node's next heartbeat forward after
// its bindings revision changed, so that its peers' view shows the new
// revision soon: a random moment within the probe interval, or within
// the interval the mesh-wide budget asks for when that is longer (every
// node of the mesh changes its revision at once), never later than the
// heartbeat was due anyway.
func (n *Node) revisionHeartbeatLocked() {
	if !n.started || n.closed {
		return
	}
	spread := max(n.cfg.DiscoveryInterval, meshBudgetInterval(n.upNodesLocked(), n.cfg.HeartbeatBudget))
	at := time.Now().Add(time.Duration(rand.Float64() * float64(spread)))
	if at.Before(n.nextHeartbeat) {
		n.nextHeartbeat = at
		n.wakeLoopLocked()
	}
}

// probeRingLocked probes this node's successors on the ring of up peers
// (sorted by name, this node included): each node watches the next
// probeFanout, so every node is watched by about probeFanout others and a
// probe costs the mesh about probeFanout·n deliveries per interval.
func (n *Node) probeRingLocked() {
	if n.linkDown {
		// Nothing to learn about peers while the broker is away for this
		// node too; try the link again instead (a heartbeat: when it gets
		// through, hello and query follow), so a node whose link came up
		// unannounced does not wait for its next heartbeat.
		n.enqueueLocked(intent{typ: TypeHeartbeat})
		return
	}
	for _, name := range n.ringSuccessorsLocked(probeFanout) {
		n.enqueueLocked(n.probeIntentLocked(n.peers[name], true))
	}
}

// ringSuccessorsLocked returns up to k names of up peers that follow this
// node's name on the ring, nearest first. It is linear in the peers.
func (n *Node) ringSuccessorsLocked(k int) []string {
	self := n.cfg.Name
	after := make([]string, 0, k) // the k smallest names above self
	wrap := make([]string, 0, k)  // the k smallest names overall
	insert := func(list []string, name string) []string {
		i := len(list)
		for i > 0 && list[i-1] > name {
			i--
		}
		if i >= k {
			return list
		}
		if len(list) < k {
			list = append(list, "")
		}
		copy(list[i+1:], list[i:len(list)-1])
		list[i] = name
		return list
	}
	for name, p := range n.peers {
		if p.state != StateUp {
			continue
		}
		if name > self {
			after = insert(after, name)
		}
		wrap = insert(wrap, name)
	}
	out := after
	for _, name := range wrap {
		if len(out) == k {
			break
		}
		if name < self {
			out = append(out, name)
		}
	}
	return out
}

// probeIntentLocked is how p is asked whether it is still connected: a
// probe that carries nothing (Link.ProbeNode) for a peer of version 5 or
// later, whose link drops it unread; a ping for a peer of version 2 to 4
// (which reads it and does not answer); an addressed query for a version
// 1 peer (which knows no ping and answers the query with an info). What
// counts is the broker's answer to the publish: no route, or nothing.
func (n *Node) probeIntentLocked(p *peer, announce bool) intent {
	switch {
	case p.proto >= ProbeProtocolVersion:
		return intent{typ: typeProbe, to: p.name, announce: announce}
	case p.proto >= typeVersion(TypePing):
		return intent{typ: TypePing, to: p.name, announce: announce}
	}
	return intent{typ: TypeQuery, to: p.name, announce: announce}
}

// typeProbe is a probe's intent type: no discovery message, but the
// system key the link sends it with.
const typeProbe = wire.ProbeKey

// probeReturned handles a probe (it, written at sentAt) that the broker
// returned unroutable.
func (n *Node) probeReturned(it intent, sentAt time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	n.noRouteLocked(it, sentAt)
}

// noRouteLocked handles an addressed message the broker could not route:
// its addressee has no system queue, so its connection to the broker is
// gone (the queue is exclusive to it). Unless the peer spoke after the
// message was sent (it reconnected meanwhile), it is gone now; a ring
// probe then tells the mesh (a gone message), whose nodes check for
// themselves.
func (n *Node) noRouteLocked(it intent, sentAt time.Time) {
	p := n.peers[it.to]
	if p == nil || p.state != StateUp || p.lastSeen.After(sentAt) {
		return
	}
	n.setGoneLocked(p, time.Now(), reasonNotConnected)
	if it.announce {
		n.enqueueLocked(intent{typ: TypeGone, peer: p.name})
	}
}

const reasonNotConnected = "not connected to the broker"

// verifyGoneLocked handles another node's claim that peer is gone. The
// claim is not taken on trust: this node probes peer itself, and only
// the broker's "no route" marks it gone.
func (n *Node) verifyGoneLocked(name string) {
	if name == n.cfg.Name {
		return // the broker routes to us; whoever probes us will see it
	}
	p := n.peers[name]
	if p == nil || p.state != StateUp {
		return
	}
	n.enqueueLocked(n.probeIntentLocked(p, false))
}
