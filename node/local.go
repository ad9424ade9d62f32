package node

import "time"

// SetLocal tells the node what local programs subscribe to on its NATS
// server: the cap.* and work.* subjects of every connection but the
// node's own (the appliance's watcher of local interest computes them, for
// the bridge and the node alike). Other subjects and wildcards are
// ignored. When the capabilities or stages it names differ from the last
// ones, peers get an update at once. It may be called before Start (the
// hello then carries them) and after Close (ignored).
func (n *Node) SetLocal(subjects []string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	if n.setLocalLocked(subjects) && n.started {
		n.enqueueLocked(intent{typ: TypeUpdate})
	}
}

// LinkUp says the link to the broker has just connected (after a start, a
// reconnect or a resource alarm). While publishing fails the node does not
// poll the link; this is how it learns to try again: a heartbeat goes out
// at once, and when it gets through, hello and query follow. When no
// publish failed (a reconnect between two messages), a hello goes out: the
// node's system queue was gone for a moment, and a peer that probed it
// then holds it gone. Safe to call at any time; ignored before Start and
// after Close.
func (n *Node) LinkUp() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed || !n.started {
		return
	}
	n.linkUps++
	n.linkUpAt = time.Now()
	n.changedLocked() // no peer's record is current on this connection yet (Listeners)
	if n.waitLink {
		n.waitLink = false
		n.wakeLoopLocked() // the heartbeat and probe deadlines count again
	}
	if n.linkDown {
		n.enqueueLocked(intent{typ: TypeHeartbeat})
	} else if n.everSent {
		n.enqueueLocked(intent{typ: TypeHello})
	}
}
