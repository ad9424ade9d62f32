package rows

import (
	"encoding/binary"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// A store of the layout before (one key a field) opens with its cells
// moved to one key a row: every row, field, version and tombstone as it
// was, the history and the counts too, and merges go on from there.
func TestStoreMigratesCells(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rows.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	old := map[string]map[string]Cell{
		"a":   {"f": {Stamp: 5, Node: "x", Value: []byte("a.f")}, "g": {Stamp: 6, Node: "y", Deleted: true}},
		"a.b": {"f": {Stamp: 7, Node: "x", Value: []byte{}}},
		"b":   {"g": {Stamp: 8, Node: "y", Deleted: true}}, // all deleted: not live
		"c":   {"z": {Stamp: 9, Node: "zz", Value: []byte("c.z")}},
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		for _, table := range []string{"jobs", "other"} {
			tb, err := tx.CreateBucket([]byte(table))
			if err != nil {
				return err
			}
			cells, err := tb.CreateBucket(bCellsByField)
			if err != nil {
				return err
			}
			for row, fs := range old {
				for f, c := range fs {
					if err := cells.Put(cellKey(row, f), c.encode(nil)); err != nil {
						return err
					}
				}
			}
			h, err := tb.CreateBucket(bHistory)
			if err != nil {
				return err
			}
			replaced := Cell{Stamp: 4, Node: "x", Value: []byte("before")}
			if err := h.Put(binary.BigEndian.AppendUint64(append(cellKey("a", "f"), 0), 4), replaced.encode(nil)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	for range 2 { // opened again: nothing more to move
		s, err := OpenStore(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, table := range []string{"jobs", "other"} {
			got := map[string]map[string]Cell{}
			if err := s.Rows(table, "", func(row string, cells map[string]Cell) bool {
				got[row] = cells
				return true
			}); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, old) {
				t.Fatalf("%s after the move:\ngot  %v\nwant %v", table, got, old)
			}
			if rows, _, _ := s.Counts(table); rows != 3 {
				t.Fatalf("%s: %d live rows, want 3", table, rows)
			}
			if row, err := s.Row(table, "a"); err != nil || !reflect.DeepEqual(row, old["a"]) {
				t.Fatalf("%s row a: %v, %v", table, row, err)
			}
			if h, err := s.History(table, "a", "f"); err != nil || len(h) != 2 || string(h[1].Value) != "before" {
				t.Fatalf("%s history of a.f: %v, %v", table, h, err)
			}
		}
		if err := s.db.View(func(tx *bolt.Tx) error {
			if sub(tx, "jobs", bCellsByField) != nil {
				t.Error("the cells of the layout before are still there")
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	s, err := OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Apply("jobs", []Change{
		{Table: "jobs", Row: "b", Cells: CellsOf(map[string]WireCell{"f": {Stamp: 10, Node: "x", Value: []byte("new")}})},
		{Table: "jobs", Row: "a", Cells: CellsOf(map[string]WireCell{"f": {Stamp: 3, Node: "x", Value: []byte("old")}, "h": {Stamp: 11, Node: "x", Value: []byte("a.h")}})},
	}, 1); err != nil {
		t.Fatal(err)
	}
	row, _ := s.Row("jobs", "a")
	if string(row["f"].Value) != "a.f" || string(row["h"].Value) != "a.h" || !row["g"].Deleted || len(row) != 3 {
		t.Fatalf("row a after a merge: %v", row)
	}
	if rows, _, _ := s.Counts("jobs"); rows != 4 {
		t.Fatalf("%d live rows after b came back, want 4", rows)
	}
}

// A row's value reads as written, and a damaged one is refused, not
// read past its end.
func TestRowValue(t *testing.T) {
	var v []byte
	v = appendCellEntry(v, "a", Cell{Stamp: 1, Node: "n", Value: []byte("x")})
	v = appendCellEntry(v, "b", Cell{Stamp: 2, Node: "m", Deleted: true})
	if c, err := rowCell(v, "b"); err != nil || len(c) != 11 || !cellDeleted(c) {
		t.Fatalf("rowCell b: %x, %v", c, err)
	}
	if c, err := rowCell(v, "c"); err != nil || c != nil {
		t.Fatalf("rowCell c: %x, %v", c, err)
	}
	first := len(appendCellEntry(nil, "a", Cell{Stamp: 1, Node: "n", Value: []byte("x")}))
	if !valueLive(v) || valueLive(v[first:]) {
		t.Fatal("valueLive")
	}
	for n := range len(v) {
		if n == 0 || n == first {
			continue // whole entries
		}
		if err := rowEntries(v[:n], func(_, _ []byte) bool { return true }); err == nil {
			t.Fatalf("a value cut at %d read without error", n)
		}
	}
}

// The reader's offset moves with the cells, to a key an older meshbox
// does not know: opened by one again (a downgrade), the store says it
// read nothing, and that meshbox reads the log again instead of taking
// the cells it cannot see for an empty table. Upgraded again, what the
// older meshbox wrote last replaces the cells of before the downgrade.
func TestStoreMigratesTheOffsetAndSurvivesADowngrade(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rows.db")
	oldStore := func(value string, offset uint64) {
		t.Helper()
		db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Update(func(tx *bolt.Tx) error {
			tb, err := tx.CreateBucketIfNotExists([]byte("jobs"))
			if err != nil {
				return err
			}
			cells, err := tb.CreateBucketIfNotExists(bCellsByField)
			if err != nil {
				return err
			}
			c := Cell{Stamp: Stamp(offset), Node: "x", Value: []byte(value)}
			if err := cells.Put(cellKey("a", "f"), c.encode(nil)); err != nil {
				return err
			}
			m, err := tb.CreateBucketIfNotExists(bMeta)
			if err != nil {
				return err
			}
			// What an older meshbox sees: no offset of its own after an
			// upgrade moved it.
			if v := m.Get(kOldOffset); v != nil {
				t.Errorf("an older meshbox finds offset %x after the upgrade; want none", v)
			}
			return m.Put(kOldOffset, binary.BigEndian.AppendUint64(nil, offset))
		}); err != nil {
			t.Fatal(err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
	check := func(value string, offset uint64) {
		t.Helper()
		s, err := OpenStore(path)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		got, ok, err := s.Offset("jobs")
		if err != nil || !ok || got != offset {
			t.Errorf("offset after the upgrade: %d %v %v, want %d", got, ok, err, offset)
		}
		row, err := s.Row("jobs", "a")
		if err != nil || string(row["f"].Value) != value || len(row) != 1 {
			t.Errorf("row a after the upgrade: %v %v, want f=%s", row, err, value)
		}
	}
	oldStore("before", 7)
	check("before", 7)
	oldStore("after the downgrade", 9) // the older meshbox read the log again
	check("after the downgrade", 9)
}
