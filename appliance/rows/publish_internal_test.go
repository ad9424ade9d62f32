package rows

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/meshbox/meshbox/internal/seal"
)

// The log message of pending writes, spliced from the stored bodies,
// opens as the batch of those changes; a damaged body is left out and
// counted, and the rest still open.
func TestChangesBatchOpens(t *testing.T) {
	e := &Engine{cfg: Config{Node: "alpha"}}
	e.m = newMetrics(e)
	changes := []Change{
		{Table: "jobs", Row: "42", Cells: CellsOf(map[string]WireCell{"status": {Stamp: 7, Node: "alpha", Value: []byte("queued")}})},
		{Table: "jobs", Row: "43", Cells: CellsOf(map[string]WireCell{"owner": {Stamp: 8, Node: "alpha", Deleted: true}})},
	}
	var bodies [][]byte
	for _, c := range changes {
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		bodies = append(bodies, b)
	}
	k := seal.NewContentKey()
	ring, err := seal.NewKeyring([]seal.ContentKey{k}, k.ID)
	if err != nil {
		t.Fatal(err)
	}
	sealer, err := ring.SealerFor("")
	if err != nil {
		t.Fatal(err)
	}
	open := func(pt []byte) *batch {
		t.Helper()
		b, err := openBatch(nil, ring, "jobs", sealer.ID(), sealer.Seal(nil, sealAD("jobs", sealer.ID()), pt))
		if err != nil {
			t.Fatalf("%v: %s", err, pt)
		}
		return b
	}
	b := open(e.changesBatch(bodies, 0))
	if b.V != 1 || b.Kind != kindChanges || b.Node != "alpha" || !reflect.DeepEqual(b.Changes, changes) {
		t.Fatalf("opened %+v; want the changes %+v of alpha", b, changes)
	}
	b = open(e.changesBatch([][]byte{[]byte(`{"table":"jobs","row":`), bodies[1]}, 0))
	if !reflect.DeepEqual(b.Changes, changes[1:]) {
		t.Fatalf("with a damaged body: %+v; want only the second change", b.Changes)
	}
	if n := counterValue(t, e.m.errors.WithLabelValues("store")); n != 1 {
		t.Fatalf("store errors %v, want 1", n)
	}
	if b := open(e.changesBatch(nil, 7)); len(b.Changes) != 0 || b.Join != 7 {
		t.Fatalf("no bodies: %+v", b)
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// A node knows its own log messages by their whole sealed bytes: the
// same bytes once (a second copy, a replay, is opened and applied like
// any message: the same changes again), never a message that differs.
func TestOwnMessagesByTheirBytes(t *testing.T) {
	e := &Engine{}
	body := []byte("sealed batch of alpha")
	e.noteOwn(body, 128)
	if _, ok := e.takeOwn([]byte("sealed batch of alphA")); ok {
		t.Fatal("a message that differs by a byte taken for the node's own")
	}
	if n, ok := e.takeOwn(body); !ok || n != 128 {
		t.Fatalf("its own message: %d, %v; want 128, true", n, ok)
	}
	if _, ok := e.takeOwn(body); ok {
		t.Fatal("a replay of its own message skipped; it must be opened like any message")
	}
	for i := range maxOwn + 10 { // never read back: bounded
		e.noteOwn(fmt.Appendf(nil, "m%d", i), 1)
	}
	if len(e.own) > maxOwn {
		t.Fatalf("remembers %d messages, at most %d", len(e.own), maxOwn)
	}
}
