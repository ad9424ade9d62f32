package bridge

import (
	"strconv"
	"testing"
)

func TestHandedOut(t *testing.T) {
	h := newHandedOut(3)
	for _, id := range []string{"a", "b", "c"} {
		if h.add(id) {
			t.Fatalf("add(%q) the first time: got seen, want new", id)
		}
	}
	if !h.add("a") {
		t.Fatal(`add("a") again: got new, want seen`)
	}
	h.add("d") // evicts the oldest, "a"
	if h.add("a") {
		t.Fatal(`add("a") after eviction: got seen, want new`)
	}
	if got := len(h.set); got != 3 {
		t.Fatalf("remembered: got %d ids, want the bound 3", got)
	}
	big := newHandedOut(100)
	for i := range 1000 {
		big.add(strconv.Itoa(i))
	}
	if len(big.set) != 100 || len(big.ring) != 100 {
		t.Fatalf("got %d ids in the set and %d in the ring, want 100 each", len(big.set), len(big.ring))
	}
	if !big.add("999") || big.add("0") {
		t.Fatal("want the newest ids remembered and the oldest forgotten")
	}
}
