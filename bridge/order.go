package bridge

import (
	"container/heap"
	"time"
)

// Commands in order per key. A command may carry a Meshbox-Order-Key
// (sealed with it): the commands of one stage with the same key reach
// this node's handler one at a time, in their queue's order, while other
// keys and commands without one run beside them, on the one stage queue.
// The broker delivers in queue order on the session's consume channel,
// numbering the deliveries 1, 2, 3, ... (delivery tags, shared by the
// event consumer and every stage consumer); but each consumer has a
// reader goroutine of its own, and a stage may have several consumers
// (flow.go), so two readers may present commands out of order. So a keyed
// command waits until every delivery with a lower tag has been read (its
// keyed commands registered): then, in tag order, it goes to the handler
// if no command of its key is there, or waits behind the last one. When a
// command leaves the handler (answered, failed, timed out, given back),
// the next of its key goes. A command that fails and is retried leaves
// its place: it comes back behind those that were waiting. Across nodes
// hosting one stage there is no order: each node keeps the order of what
// it was given.
type orderBook struct {
	next    uint64          // the lowest delivery tag not read yet
	read    map[uint64]bool // tags above next read already
	pending cmdHeap         // keyed commands read, waiting for the tags below theirs
	// lines: per stage and key with a command at the handler, the
	// commands waiting behind it (present: one is at the handler).
	lines   map[string][]*cmdCall
	seqNext uint64 // numbers the keyed commands as read, for their place in a batch
}

// cmdHeap orders keyed commands by delivery tag, then by their place in
// a batch.
type cmdHeap []*cmdCall

func (h cmdHeap) Len() int { return len(h) }
func (h cmdHeap) Less(i, j int) bool {
	if h[i].ack.Tag != h[j].ack.Tag {
		return h[i].ack.Tag < h[j].ack.Tag
	}
	return h[i].seq < h[j].seq
}
func (h cmdHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *cmdHeap) Push(x any)   { *h = append(*h, x.(*cmdCall)) }
func (h *cmdHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}

// orderedArrive takes a keyed command its reader read: it waits for the
// deliveries below it (orderedSeen).
func (s *session) orderedArrive(c *cmdCall) {
	s.local.mu.Lock()
	o := &s.local.order
	o.seqNext++
	c.seq = o.seqNext
	heap.Push(&o.pending, c)
	s.local.mu.Unlock()
}

// orderedSeen records that the delivery tag has been read whole (its
// keyed commands registered) and hands on the keyed commands that no
// lower tag holds back any more. Every reader of the consume channel
// calls it for each delivery.
func (s *session) orderedSeen(tag uint64) {
	s.local.mu.Lock()
	o := &s.local.order
	if o.next == 0 {
		o.next = 1
	}
	switch {
	case tag == o.next:
		o.next++
		for o.read[o.next] {
			delete(o.read, o.next)
			o.next++
		}
	case tag > o.next:
		if o.read == nil {
			o.read = map[uint64]bool{}
		}
		o.read[tag] = true
	}
	var now []*cmdCall
	for len(o.pending) > 0 && o.pending[0].ack.Tag < o.next {
		c := heap.Pop(&o.pending).(*cmdCall)
		line, busy := o.lines[c.order]
		if busy {
			o.lines[c.order] = append(line, c)
			continue
		}
		if o.lines == nil {
			o.lines = map[string][]*cmdCall{}
		}
		o.lines[c.order] = nil
		now = append(now, c)
	}
	ended := s.local.ended
	s.local.mu.Unlock()
	if ended {
		return // the broker takes them back
	}
	for _, c := range now {
		s.orderedStart(c)
	}
}

// orderedNext hands the handler the next command of c's order key, now
// that c has left it (answered, failed, timed out or given back).
func (s *session) orderedNext(c *cmdCall) {
	if c.order == "" {
		return
	}
	s.local.mu.Lock()
	o := &s.local.order
	line, ok := o.lines[c.order]
	if !ok || s.local.ended {
		s.local.mu.Unlock()
		return
	}
	if len(line) == 0 {
		delete(o.lines, c.order)
		s.local.mu.Unlock()
		return
	}
	next := line[0]
	o.lines[c.order] = line[1:]
	s.local.mu.Unlock()
	s.orderedStart(next)
}

// orderedStart sends a keyed command to the handler: its attempt starts
// now (the wait was not its handler's).
func (s *session) orderedStart(c *cmdCall) {
	now := time.Now()
	c.started, c.deadline = now, now.Add(s.b.cfg.CommandTimeout)
	s.sendCmd(newID(), c)
}

// waiting counts the keyed commands not at the handler yet.
// local.mu held.
func (o *orderBook) waiting() int {
	n := len(o.pending)
	for _, line := range o.lines {
		n += len(line)
	}
	return n
}
