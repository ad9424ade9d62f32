package completed

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

// The store keeps at most MaxEntries ids of a stage (the oldest go first),
// prunes ids past the window, and keeps what it holds across a reopen.
func TestCompletedBoundsAndPrunes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "completed.db")
	c, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	p := DedupePolicy{Window: time.Hour, MaxEntries: 3}
	t0 := time.Now()
	for i := range 5 {
		if err := c.Done("s", fmt.Sprintf("id%d", i), t0.Add(time.Duration(i)*time.Second), p); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.Held("s"); got != 3 {
		t.Fatalf("held: got %d, want 3 (MaxEntries)", got)
	}
	for i, want := range []bool{false, false, true, true, true} {
		hit, err := c.Seen("s", fmt.Sprintf("id%d", i), t0.Add(-p.Window))
		if err != nil || hit != want {
			t.Errorf("id%d seen: got %v %v, want %v", i, hit, err, want)
		}
	}
	if hit, _ := c.Seen("s", "id4", t0.Add(10*time.Second)); hit {
		t.Error("id4 seen although it completed before since")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	c, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.Held("s"); got != 3 {
		t.Fatalf("held after reopen: got %d, want 3", got)
	}
	// An hour and 3 s later, id2 and id3 are past the window; id4 is not.
	if err := c.PruneAll(t0.Add(time.Hour+3500*time.Millisecond), map[string]DedupePolicy{"s": p}); err != nil {
		t.Fatal(err)
	}
	if got := c.Held("s"); got != 1 {
		t.Errorf("held after pruning: got %d, want 1", got)
	}
	if hit, _ := c.Seen("s", "id4", t0.Add(-p.Window)); !hit {
		t.Error("id4 pruned although inside its window")
	}
	if hit, _ := c.Seen("s", "id3", t0.Add(-p.Window)); hit {
		t.Error("id3 kept although past its window")
	}
}
