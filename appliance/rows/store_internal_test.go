package rows

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// scanCounts counts table's live rows and pending writes by reading
// them all: the oracle of the counts the store keeps.
func scanCounts(t *testing.T, s *Store, table string) (rows, pending int) {
	t.Helper()
	if err := s.Rows(table, "", func(_ string, cells map[string]Cell) bool {
		for _, c := range cells {
			if !c.Deleted {
				rows++
				break
			}
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	seqs, _, err := s.Pending(table, 0, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	return rows, len(seqs)
}

// The counts the store keeps follow every local write, every change
// applied from the log (winning or not, deleting or reviving a row) and
// every confirm (again or not); a store whose counts are missing (one
// written before they were kept) is counted when it opens.
func TestStoreCounts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rows.db")
	s, err := OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(7, 8))
	fields := []string{"a", "b", "c"}
	var stamp Stamp = 1000
	var offset uint64
	check := func(step string) {
		t.Helper()
		gr, gp, err := s.Counts("jobs")
		if err != nil {
			t.Fatal(err)
		}
		wr, wp := scanCounts(t, s, "jobs")
		if gr != wr || gp != wp {
			t.Fatalf("after %s: counts rows %d pending %d; the table holds %d and %d", step, gr, gp, wr, wp)
		}
	}
	change := func(node string) Change {
		stamp += Stamp(r.IntN(3)) // equal stamps too: ties broken by node
		cells := map[string]WireCell{}
		for _, f := range fields {
			switch r.IntN(3) {
			case 0:
				cells[f] = WireCell{Stamp: stamp, Node: node, Value: []byte("v")}
			case 1:
				cells[f] = WireCell{Stamp: stamp, Node: node, Deleted: true}
			}
		}
		if len(cells) == 0 {
			cells["a"] = WireCell{Stamp: stamp, Node: node, Deleted: true}
		}
		return Change{Table: "jobs", Row: fmt.Sprintf("r%d", r.IntN(30)), Cells: CellsOf(cells)}
	}
	for i := range 600 {
		switch r.IntN(4) {
		case 0, 1:
			if err := s.Write(change("alpha")); err != nil {
				t.Fatal(err)
			}
		case 2:
			var batch []Change
			for range 1 + r.IntN(5) {
				ch := change("beta")
				if r.IntN(4) == 0 { // an old change, which loses
					for i := range ch.Cells {
						ch.Cells[i].Stamp -= 50
					}
				}
				batch = append(batch, ch)
			}
			offset += uint64(len(batch))
			if _, err := s.Apply("jobs", batch, offset); err != nil {
				t.Fatal(err)
			}
		case 3:
			seqs, _, err := s.Pending("jobs", 0, 1+r.IntN(8))
			if err != nil {
				t.Fatal(err)
			}
			if len(seqs) > 0 {
				seqs = append(seqs, seqs[0]) // confirmed twice
			}
			if err := s.Confirmed("jobs", seqs); err != nil {
				t.Fatal(err)
			}
		}
		check(fmt.Sprintf("step %d", i))
	}
	rows, _ := scanCounts(t, s, "jobs")
	if rows == 0 {
		t.Fatal("no live row at the end: the test exercised too little")
	}
	// A store from before the counts: they are missing, and wrong ones
	// must not be trusted either way.
	if err := s.db.Update(func(tx *bolt.Tx) error {
		m := tx.Bucket([]byte("jobs")).Bucket(bMeta)
		if err := m.Delete(kRows); err != nil {
			return err
		}
		return m.Delete(kPending)
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = OpenStore(path); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	check("reopening a store without counts")
	if err := s.Write(change("alpha")); err != nil {
		t.Fatal(err)
	}
	check("a write after reopening")
}

// Writes share commits: of many at once, those that fail fail alone and
// the others are committed; a write after Close is refused, and Close
// waits for those in progress.
func TestStoreSharedCommits(t *testing.T) {
	s, err := OpenStore(filepath.Join(t.TempDir(), "rows.db"))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 300)
	for i := range errs {
		wg.Go(func() {
			errs[i] = s.update(func(tx *bolt.Tx) error {
				b, err := tx.CreateBucketIfNotExists([]byte("t"))
				if err != nil {
					return err
				}
				if err := b.Put(fmt.Appendf(nil, "k%03d", i), []byte("v")); err != nil {
					return err
				}
				if i%7 == 0 {
					return fmt.Errorf("write %d fails", i)
				}
				return nil
			})
		})
	}
	wg.Wait()
	if err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("t"))
		for i, e := range errs {
			has := b != nil && b.Get(fmt.Appendf(nil, "k%03d", i)) != nil
			if (i%7 == 0) != (e != nil) || has == (e != nil) {
				t.Errorf("write %d: err %v, committed %v", i, e, has)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.update(func(*bolt.Tx) error { return nil }); !errors.Is(err, errStoreClosed) {
		t.Fatalf("a write after Close: %v, want %v", err, errStoreClosed)
	}
}

// The store merges as the rule says, field by field (the larger stamp,
// then the larger node, wins), on rows of few fields and of many, rows
// new and held, in field order: checked against a model of the rule
// after every write, batch and change applied.
func TestStoreMergeModel(t *testing.T) {
	s, err := OpenStore(filepath.Join(t.TempDir(), "rows.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r := rand.New(rand.NewPCG(3, 4))
	model := map[string]map[string]Cell{}
	merge := func(ch Change) {
		if model[ch.Row] == nil {
			model[ch.Row] = map[string]Cell{}
		}
		for _, w := range ch.Cells {
			if old, ok := model[ch.Row][w.Field]; !ok || w.cell().Wins(old) {
				model[ch.Row][w.Field] = w.cell()
			}
		}
	}
	change := func(stamp Stamp, node string) Change {
		n := r.IntN(4)
		row := fmt.Sprintf("r%d", n)
		fields := 3 // rows r0 and r1 have few fields, r2 and r3 many
		if n >= 2 {
			fields = 74
		}
		cells := map[string]WireCell{}
		for range 1 + r.IntN(6) {
			f := fmt.Sprintf("f%02d", r.IntN(fields))
			cells[f] = WireCell{Stamp: stamp, Node: node, Deleted: r.IntN(3) == 0, Value: []byte(f)}
		}
		return Change{Table: "jobs", Row: row, Cells: CellsOf(cells)}
	}
	for i := range 400 {
		stamp := Stamp(1000 + i/2 - r.IntN(20)) // ties and older versions too
		switch r.IntN(3) {
		case 0:
			var batch []Change
			for range 1 + r.IntN(3) {
				ch := change(stamp, "beta")
				ch.Cells = slices.Clone(ch.Cells)
				batch = append(batch, ch)
				merge(ch)
			}
			if _, err := s.Apply("jobs", batch, uint64(i)); err != nil {
				t.Fatal(err)
			}
		case 1:
			ch := change(stamp, "alpha")
			merge(ch)
			if err := s.Write(ch); err != nil {
				t.Fatal(err)
			}
		case 2:
			var batch []Change
			for range 1 + r.IntN(4) {
				ch := change(stamp, "alpha")
				batch = append(batch, ch)
				merge(ch)
			}
			if err := s.WriteMany(batch); err != nil {
				t.Fatal(err)
			}
		}
		live := 0
		for row, want := range model {
			got, err := s.Row("jobs", row)
			if err != nil {
				t.Fatal(err)
			}
			if !maps.EqualFunc(got, want, func(a, b Cell) bool {
				return a.Stamp == b.Stamp && a.Node == b.Node && a.Deleted == b.Deleted && (a.Deleted || string(a.Value) == string(b.Value))
			}) {
				t.Fatalf("step %d, row %s:\ngot  %v\nwant %v", i, row, got, want)
			}
			for _, c := range want {
				if !c.Deleted {
					live++
					break
				}
			}
		}
		if rows, _, _ := s.Counts("jobs"); rows != live {
			t.Fatalf("step %d: counted %d live rows, the model has %d", i, rows, live)
		}
	}
	if err := s.WriteMany([]Change{{Table: "jobs", Row: "x", Cells: CellsOf(map[string]WireCell{"a": {Stamp: 1, Node: "alpha"}})}, {Table: "other", Row: "x"}}); err == nil {
		t.Fatal("a batch of two tables' changes was stored")
	}
}

// The verifier's run may commit before the reader's run that carries the
// snapshot's claims: a version the log made, attested first, is not
// undone when its claim arrives after (a false snapshot_disagrees on an
// honest snapshot). Control: a claim no change attests is undone.
func TestStoreAttestBeforeClaim(t *testing.T) {
	s, err := OpenStore(filepath.Join(t.TempDir(), "rows.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	const table = "jobs"
	v := Change{Table: table, Row: "r1", Cells: CellsOf(map[string]WireCell{"f": {Stamp: 100, Node: "x", Value: []byte("by x")}})}
	forged := Change{Table: table, Row: "r2", Cells: CellsOf(map[string]WireCell{"f": {Stamp: 101, Node: "x", Value: []byte("not by x")}})}
	// The verifier reads x's change to r1 in the log before the snapshot.
	run := verifierRun()
	run.changes, run.attest, run.next = []Change{v}, []Change{v}, 1
	if _, err := s.applyLog(table, run); err != nil {
		t.Fatal(err)
	}
	// Then the reader commits the snapshot's part, from another sender,
	// claiming both versions in x's name.
	snap := logApply{progress: kOffset, next: 10, changes: []Change{v, forged}, claims: snapshotClaims([]Change{v, forged}, "y")}
	if _, err := s.applyLog(table, snap); err != nil {
		t.Fatal(err)
	}
	undone, left, err := s.settleClaims(table, true)
	if err != nil {
		t.Fatal(err)
	}
	if undone != 1 || left != 0 {
		t.Fatalf("undone %d, left %d: want the forged version alone undone (1, 0)", undone, left)
	}
	if got, err := s.Row(table, "r1"); err != nil || string(got["f"].Value) != "by x" {
		t.Fatalf("r1 after the check: %v, %v; want x's version kept", got, err)
	}
	if got, _ := s.Row(table, "r2"); got["f"].Value != nil && !got["f"].Deleted {
		t.Fatalf("r2 after the check: %v; want the version no change made undone", got)
	}
}
