package bridge

import (
	"hash/maphash"
	"sync"
)

// handedOutLen is how many command ids a node remembers having handed to
// its local handlers: far more than can be in flight (a stage holds at most
// MaxStagePrefetch unacked commands), at 8 bytes of hash and a map entry
// each.
const handedOutLen = 32768

// handedOut remembers the ids of the last commands this node handed to a
// local handler, across sessions. A broker killed at the wrong moment can
// lose its record of a delivery; the message then comes again without a
// redelivered flag or a delivery count, looking new. The node still knows
// it handed that id out and marks the new delivery as a possible duplicate.
// Ids are kept as 64-bit hashes: a collision can only mark a first
// delivery as a possible duplicate, which handlers must tolerate anyway.
// Safe for concurrent use.
type handedOut struct {
	seed maphash.Seed

	mu   sync.Mutex
	ring []uint64
	next int
	set  map[uint64]struct{}
}

func newHandedOut(n int) *handedOut {
	return &handedOut{seed: maphash.MakeSeed(), ring: make([]uint64, 0, n), set: make(map[uint64]struct{}, n)}
}

// add records id and reports whether it was recorded already.
func (h *handedOut) add(id string) bool {
	k := maphash.String(h.seed, id)
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.set[k]; ok {
		return true
	}
	if len(h.ring) < cap(h.ring) {
		h.ring = append(h.ring, k)
	} else {
		delete(h.set, h.ring[h.next])
		h.ring[h.next] = k
		h.next = (h.next + 1) % len(h.ring)
	}
	h.set[k] = struct{}{}
	return false
}
