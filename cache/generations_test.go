package cache

import (
	"slices"
	"testing"
	"time"
)

// Bindings list every node's credential generations, sorted; bindings
// without any (an older database or cache file) hash as before them and
// list none, and any generation changes the hash.
func TestSenderGenerations(t *testing.T) {
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	old := Bindings{Node: "alpha", Nodes: []NodeRecord{{Name: "alpha"}, {Name: "beta"}}}
	if g := old.SenderGenerations(); g != nil {
		t.Errorf("bindings without generations: got %v, want nil (not loaded)", g)
	}
	before := NewSnapshot(1, at, "db", old).Hash
	withGens := Bindings{Node: "alpha", Nodes: []NodeRecord{{Name: "beta", Generations: []int{3, 2}}, {Name: "alpha", Generations: []int{1}}, {Name: "hub"}}}
	snap := NewSnapshot(1, at, "db", withGens)
	got := snap.Bindings.SenderGenerations()
	if !slices.Equal(got["alpha"], []int{1}) || !slices.Equal(got["beta"], []int{2, 3}) || len(got) != 3 {
		t.Errorf("generations: got %v, want alpha [1], beta [2 3], hub []", got)
	}
	if _, ok := got["hub"]; !ok {
		t.Errorf("generations: got %v, want hub listed without any", got)
	}
	if snap.Hash == before {
		t.Error("generations do not change the hash")
	}
	// Bindings without generations hash as they did before generations
	// existed: cache files written then still verify.
	if want := "61edd0ceccba60ad5b6b6784d06c43b1c624a13bf3ae1b5341d9858bbc936ef2"; before != want {
		t.Errorf("hash of bindings without generations: got %s, want %s (the hash before generations)", before, want)
	}
	rotated := withGens
	rotated.Nodes = []NodeRecord{{Name: "beta", Generations: []int{3}}, {Name: "alpha", Generations: []int{1}}, {Name: "hub"}}
	if rotated.Hash() == snap.Hash {
		t.Error("a revoked generation does not change the hash")
	}
	if d := Diff(withGens, rotated); len(d) != 1 || d[0].Kind != KindNode || d[0].Key != "beta" {
		t.Errorf("diff of a revoked generation: got %v, want node beta changed", d.Strings())
	}
}
