package node

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
