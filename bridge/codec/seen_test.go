package codec

import (
	"strconv"
	"testing"
)

func TestHandedOut(t *testing.T) {
	h := NewHandedOut(3)
	for _, id := range []string{"a", "b", "c"} {
		if h.Add(id) {
			t.Fatalf("add(%q) the first time: got seen, want new", id)
		}
	}
	if !h.Add("a") {
		t.Fatal(`add("a") again: got new, want seen`)
	}
	h.Add("d") // evicts the oldest, "a"
	if h.Add("a") {
		t.Fatal(`add("a") after eviction: got seen, want new`)
	}
	if got := len(h.Set); got != 3 {
		t.Fatalf("remembered: got %d ids, want the bound 3", got)
	}
	big := NewHandedOut(100)
	for i := range 1000 {
		big.Add(strconv.Itoa(i))
	}
	if len(big.Set) != 100 || len(big.Ring) != 100 {
		t.Fatalf("got %d ids in the set and %d in the ring, want 100 each", len(big.Set), len(big.Ring))
	}
	if !big.Add("999") || big.Add("0") {
		t.Fatal("want the newest ids remembered and the oldest forgotten")
	}
}
