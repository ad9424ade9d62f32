package codec

import (
	"hash/maphash"
	"sync"
)

// HandedOutLen is how many command ids a node remembers having handed to
// its local handlers: far more than can be in flight (a stage holds at most
// MaxStagePrefetch unacked commands), at 8 bytes of hash and a map entry
// each.
const HandedOutLen = 32768

// HandedOut remembers the ids of the last commands this node handed to a
// local handler, across sessions. A broker killed at the wrong moment can
// lose its record of a delivery; the message then comes again without a
// redelivered flag or a delivery count, looking new. The node still knows
// it handed that id out and marks the new delivery as a possible duplicate.
// Ids are kept as 64-bit hashes: a collision can only mark a first
// Delivery as a possible duplicate, which handlers must tolerate anyway.
// Safe for concurrent use.
type HandedOut struct {
	seed maphash.Seed

	mu   sync.Mutex
	Ring []uint64
	next int
	Set  map[uint64]struct{}
}

func NewHandedOut(n int) *HandedOut {
	return &HandedOut{seed: maphash.MakeSeed(), Ring: make([]uint64, 0, n), Set: make(map[uint64]struct{}, n)}
}

// add records id and reports whether it was recorded already.
func (h *HandedOut) Add(id string) bool {
	k := maphash.String(h.seed, id)
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.Set[k]; ok {
		return true
	}
	if len(h.Ring) < cap(h.Ring) {
		h.Ring = append(h.Ring, k)
	} else {
		delete(h.Set, h.Ring[h.next])
		h.Ring[h.next] = k
		h.next = (h.next + 1) % len(h.Ring)
	}
	h.Set[k] = struct{}{}
	return false
}
