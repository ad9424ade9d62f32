package appliance

import (
	"log/slog"
	"testing"

	"github.com/meshbox/meshbox/appliance/keys"
)

// TestErrorRingConditionEnds: the ring keeps warnings and errors at the
// level they were logged; the ones about a condition leave it when the
// condition ends, the others stay.
func TestErrorRingConditionEnds(t *testing.T) {
	ring := newErrorRing(10)
	log := slog.New(&ringHandler{next: slog.DiscardHandler, ring: ring}).With("component", "keys")
	log.Info("not kept")
	log.Warn("this node lacks a content key of the mesh", "key", "k1", conditionKey, keys.LacksCondition("k1"))
	log.Warn("this node lacks a content key of the mesh", "key", "k2", conditionKey, keys.LacksCondition("k2"))
	log.Error("something else broke", "err", "boom")

	got := ring.recent()
	if len(got) != 3 || got[0].Level != "ERROR" || got[1].Level != "WARN" || got[2].Level != "WARN" {
		t.Fatalf("recent: got %+v, want an ERROR and two WARNs, newest first", got)
	}
	ring.end(keys.LacksCondition("k1"))
	got = ring.recent()
	if len(got) != 2 || got[0].Message != "something else broke" || got[1].Message != "this node lacks a content key of the mesh" {
		t.Fatalf("after k1 arrived: got %+v, want the error and k2's warning", got)
	}
	ring.end(keys.LacksCondition("k2"))
	ring.end("no such condition")
	if got = ring.recent(); len(got) != 1 || got[0].Detail != "boom" {
		t.Fatalf("after k2 arrived: got %+v, want the error alone", got)
	}
}
