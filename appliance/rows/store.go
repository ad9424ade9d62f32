package rows

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/meshbox/meshbox/internal/boltfile"
	bolt "go.etcd.io/bbolt"
)

// Store is a node's replica of its tables, in one bbolt file
// (<data>/rows.db). Each table is a bucket holding:
//
//	row_cells  row -> the winning version of each of its fields (rowvalue.go)
//	history    row \x00 field \x00 stamp -> versions replaced, newest kept (historyKeep)
//	pending    seq -> a local write not yet confirmed by the broker (JSON Change)
//	meta       offset -> the next offset of the table's log to read
//	           rows, pending -> the live rows and the pending writes, kept
//	           with every change (status reads them on every call; a
//	           count by scanning cost a table of 100,000 rows 50 ms)
//
// Every write is one bbolt transaction committed (fsynced) before it is
// acknowledged; concurrent writes share a commit (Store.update).
type Store struct {
	db *bolt.DB

	// Writes are committed by one goroutine (commit): each commit takes
	// every write queued while the one before it ran, so a lone writer
	// waits for nothing but its own commit, and concurrent writers share
	// commits as the disk's pace makes them queue.
	queue  chan commitCall
	mu     sync.RWMutex
	closed bool
	calls  sync.WaitGroup // update calls in progress
	quit   chan struct{}
	exited chan struct{}
}

var (
	bCells   = []byte("row_cells")
	bHistory = []byte("history")
	bPending = []byte("pending")
	bMeta    = []byte("meta")
	// kOffset is named anew with the layout of one key a row (kOldOffset
	// before): a store an older meshbox opens again (a downgrade) holds no
	// offset it knows, so it reads the log again into the cells it knows,
	// instead of taking their absence for an empty table it has read.
	kOffset  = []byte("read_offset")
	kRows    = []byte("rows")
	kPending = []byte("pending")
)

// initialMmap is the store's first memory map (address space, not
// memory): a store smaller than it is never mapped again. Each time bbolt
// maps a growing file again, it copies every key and value a commit in
// progress holds (a joiner's commits of a snapshot spent a third of
// their time so) and waits for every read to end.
const initialMmap = 256 << 20

// historyKeep is how many replaced versions of a field the store keeps.
const historyKeep = 16

// pageSize is the page size of a store this node creates (bbolt keeps a
// store's own). A joiner's snapshot of 100,000 rows took 1.6 µs of CPU a
// row to commit in 4 KiB pages, 1.1-1.2 in 16 KiB and 1.0 in 32 KiB
// (fewer pages to split, branch and write; BenchmarkStoreApplySnapshot);
// a commit of one small write rewrites a page of its rows, so bigger
// pages write more to the disk for each (an SD card's wear): 16 KiB takes
// most of the gain for four times the bytes. A store made before keeps
// its 4 KiB pages.
const pageSize = 16 << 10

// OpenStore opens (creating) the store at path.
func OpenStore(path string) (*Store, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, InitialMmapSize: initialMmap, PageSize: pageSize})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("open rows store %s: in use by another meshbox process", path)
		}
		return nil, fmt.Errorf("open rows store %s: %w", path, err)
	}
	if err := db.Update(migrateCells); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open rows store %s: move its cells to one key a row: %w", path, err)
	}
	if err := db.Update(countAll); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open rows store %s: count its rows: %w", path, err)
	}
	st := &Store{db: db, queue: make(chan commitCall), quit: make(chan struct{}), exited: make(chan struct{})}
	go st.commit() // until Close
	return st, nil
}

// Change is the versions of some fields of one row of one table: a write
// of this node, or one read from the table's log.
type Change struct {
	Table string `json:"table"`
	Row   string `json:"row"`
	Cells Cells  `json:"cells"`
	// stored is Cells as a stored row's value (rowvalue.go), when the
	// reader made it beside the opening (preEncode): a row new to the
	// table is then put as it is.
	stored []byte
}

// WireCell is a Cell as a change carries it.
type WireCell struct {
	Stamp   Stamp  `json:"t"`
	Node    string `json:"n"`
	Deleted bool   `json:"d,omitempty"`
	Value   []byte `json:"v,omitempty"`
}

func (w WireCell) cell() Cell {
	return Cell{Stamp: w.Stamp, Node: w.Node, Deleted: w.Deleted, Value: w.Value}
}

func cellKey(row, field string) []byte {
	k := make([]byte, 0, len(row)+1+len(field))
	k = append(k, row...)
	k = append(k, 0)
	return append(k, field...)
}

// tableBuckets returns table's buckets, creating them.
func tableBuckets(tx *bolt.Tx, table string) (cells, history, pending, meta *bolt.Bucket, err error) {
	tb, err := tx.CreateBucketIfNotExists([]byte(table))
	if err != nil {
		return
	}
	bs := make([]*bolt.Bucket, 4)
	for i, name := range [][]byte{bCells, bHistory, bPending, bMeta} {
		if bs[i], err = tb.CreateBucketIfNotExists(name); err != nil {
			return
		}
	}
	// A table new since the store opened (OpenStore counted the others)
	// starts its counts at 0.
	if bs[3].Get(kRows) == nil {
		if err = setCount(bs[3], kRows, 0); err == nil {
			err = setCount(bs[3], kPending, 0)
		}
	}
	return bs[0], bs[1], bs[2], bs[3], err
}

// keepHistory records a version that lost (stamped stamp, stored as
// enc) of the field whose cell key is k, keeping the newest historyKeep
// of the field.
func keepHistory(history *bolt.Bucket, k []byte, stamp Stamp, enc []byte) error {
	hk := binary.BigEndian.AppendUint64(append(append([]byte{}, k...), 0), uint64(stamp))
	if err := history.Put(hk, enc); err != nil {
		return err
	}
	prefix := append(append([]byte{}, k...), 0)
	var keys [][]byte
	cur := history.Cursor()
	for hk, _ := cur.Seek(prefix); hk != nil && bytes.HasPrefix(hk, prefix); hk, _ = cur.Next() {
		keys = append(keys, append([]byte{}, hk...))
	}
	for i := 0; i < len(keys)-historyKeep; i++ {
		if err := history.Delete(keys[i]); err != nil {
			return err
		}
	}
	return nil
}

// Write stores a local write of ch (every cell wins: its stamp is newer
// than any this node saw) and queues it for the broker, in one committed
// transaction.
func (s *Store) Write(ch Change) error { return s.WriteMany([]Change{ch}) }

// WriteMany is Write of several changes of one table, all in one
// transaction: all are stored, or none.
func (s *Store) WriteMany(changes []Change) error {
	if len(changes) == 0 {
		return nil
	}
	table := changes[0].Table
	bodies := make([][]byte, len(changes))
	for i := range changes {
		if changes[i].Table != table {
			return fmt.Errorf("write many: changes of tables %s and %s", table, changes[i].Table)
		}
		bodies[i] = appendChange(nil, &changes[i])
	}
	return s.update(func(tx *bolt.Tx) error {
		cells, history, pending, meta, err := tableBuckets(tx, table)
		if err != nil {
			return err
		}
		rows := 0
		m := newMerger(cells, history, true)
		for i, ch := range changes {
			_, d, err := m.merge(ch)
			if err != nil {
				return err
			}
			rows += d
			seq, err := pending.NextSequence()
			if err != nil {
				return err
			}
			if err := pending.Put(binary.BigEndian.AppendUint64(nil, seq), bodies[i]); err != nil {
				return err
			}
		}
		if err := addCount(meta, kRows, rows); err != nil {
			return err
		}
		return addCount(meta, kPending, len(changes))
	})
}

// Applied is a change that won, wholly or in part. Its cells are made
// only when asked for (Won): a joiner applies rows by the hundred
// thousand, and most no one watches.
type Applied struct {
	Table string
	Row   string
	// change: the change's cells; won: those that won when some lost
	// (nil: every cell of change won); n: how many won.
	change Cells
	won    map[string]Cell
	n      int
}

// Won returns the cells that won, by field.
func (a Applied) Won() map[string]Cell {
	if a.won != nil {
		return a.won
	}
	m := make(map[string]Cell, len(a.change))
	for _, w := range a.change {
		m[w.Field] = w.cell()
	}
	return m
}

// Count is how many cells won.
func (a Applied) Count() int { return a.n }

// appliedAll is a change of which every cell won (a local write).
func appliedAll(ch Change) Applied {
	return Applied{Table: ch.Table, Row: ch.Row, change: ch.Cells, n: len(ch.Cells)}
}

// Apply merges changes read from table's log and records next, the
// offset to read from after them, in one committed transaction. It
// returns the cells that won.
func (s *Store) Apply(table string, changes []Change, next uint64) ([]Applied, error) {
	r, err := s.applyLog(table, logApply{changes: changes, progress: kOffset, next: next})
	return r.applied, err
}

// Offset returns the next offset of table's log to read (0 and false:
// never read).
func (s *Store) Offset(table string) (uint64, bool, error) {
	var off uint64
	var ok bool
	err := s.db.View(func(tx *bolt.Tx) error {
		tb := tx.Bucket([]byte(table))
		if tb == nil {
			return nil
		}
		if m := tb.Bucket(bMeta); m != nil {
			if v := m.Get(kOffset); len(v) == 8 {
				off, ok = binary.BigEndian.Uint64(v), true
			}
		}
		return nil
	})
	return off, ok, err
}

// Row returns the cells of row, tombstones included (nil: no such row).
func (s *Store) Row(table, row string) (map[string]Cell, error) {
	var out map[string]Cell
	err := s.db.View(func(tx *bolt.Tx) error {
		cells := sub(tx, table, bCells)
		if cells == nil || row == "" {
			return nil
		}
		var err error
		out, err = rowCells(cells.Get([]byte(row)), nil, nil)
		return err
	})
	return out, err
}

// Rows calls fn for each row of table whose key starts with prefix, in
// key order, with its cells (tombstones included), until fn returns
// false.
func (s *Store) Rows(table, prefix string, fn func(row string, cells map[string]Cell) bool) error {
	return s.RowsAfter(table, prefix, "", fn)
}

// RowsAfter is Rows from the first row whose key sorts after after ("":
// from the first): where the previous page of a list ended.
func (s *Store) RowsAfter(table, prefix, after string, fn func(row string, cells map[string]Cell) bool) error {
	start := []byte(prefix)
	if after != "" {
		// after\0 is the least key after after.
		if from := append([]byte(after), 0); bytes.Compare(from, start) > 0 {
			start = from
		}
	}
	return s.db.View(func(tx *bolt.Tx) error {
		cells := sub(tx, table, bCells)
		if cells == nil {
			return nil
		}
		// A node's name and a value are copied out of the transaction
		// once: names repeat from row to row, and values share chunks.
		names := map[string]string{}
		var values []byte
		cur := cells.Cursor()
		for k, v := cur.Seek(start); k != nil && bytes.HasPrefix(k, []byte(prefix)); k, v = cur.Next() {
			row, err := rowCellsInto(v, names, &values)
			if err != nil {
				return err
			}
			if row != nil && !fn(string(k), row) {
				return nil
			}
		}
		return nil
	})
}

// rowCells decodes a row's value v into its cells by field (nil: v holds
// none), copied out of the transaction: each node's name once in names,
// values into the chunks of *values (names and values nil: a row alone).
func rowCells(v []byte, names map[string]string, values *[]byte) (map[string]Cell, error) {
	if values == nil {
		b := make([]byte, 0, len(v)) // room for all its values
		values = &b
	}
	return rowCellsInto(v, names, values)
}

func rowCellsInto(v []byte, names map[string]string, values *[]byte) (map[string]Cell, error) {
	var out map[string]Cell
	err := rowEntries(v, func(f, enc []byte) bool {
		if out == nil {
			out = make(map[string]Cell, 4)
		}
		c := Cell{Stamp: Stamp(binary.BigEndian.Uint64(enc)), Deleted: cellDeleted(enc)}
		node := enc[10 : 10+int(enc[9])]
		if c.Node = names[string(node)]; c.Node == "" && len(node) > 0 {
			c.Node = string(node)
			if names != nil && len(names) < 256 {
				names[c.Node] = c.Node
			}
		}
		if !c.Deleted {
			val := enc[10+len(node):]
			if len(*values)+len(val) > cap(*values) {
				*values = make([]byte, 0, max(len(val), valueChunk))
			}
			*values = append(*values, val...)
			c.Value = (*values)[len(*values)-len(val) : len(*values) : len(*values)]
		}
		out[string(f)] = c
		return true
	})
	return out, err
}

// History returns the versions of row.field this node holds, newest
// first: the winner, then those it replaced (at most historyKeep).
func (s *Store) History(table, row, field string) ([]Cell, error) {
	var out []Cell
	err := s.db.View(func(tx *bolt.Tx) error {
		k := cellKey(row, field)
		if cells := sub(tx, table, bCells); cells != nil && row != "" {
			enc, err := rowCell(cells.Get([]byte(row)), field)
			if err != nil {
				return err
			}
			if enc != nil {
				c, err := decodeCell(enc)
				if err != nil {
					return err
				}
				c.Value = bytes.Clone(c.Value)
				out = append(out, c)
			}
		}
		if h := sub(tx, table, bHistory); h != nil {
			prefix := append(k, 0)
			cur := h.Cursor()
			for hk, v := cur.Seek(prefix); hk != nil && bytes.HasPrefix(hk, prefix); hk, v = cur.Next() {
				c, err := decodeCell(v)
				if err != nil {
					return err
				}
				c.Value = bytes.Clone(c.Value)
				out = append(out, c)
			}
		}
		return nil
	})
	sort.SliceStable(out, func(i, j int) bool { return out[i].Wins(out[j]) })
	return out, err
}

// Pending returns up to n local writes of table not yet confirmed by the
// broker, oldest first, from sequence after on.
func (s *Store) Pending(table string, after uint64, n int) (seqs []uint64, changes [][]byte, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		p := sub(tx, table, bPending)
		if p == nil {
			return nil
		}
		cur := p.Cursor()
		for k, v := cur.Seek(binary.BigEndian.AppendUint64(nil, after+1)); k != nil && len(seqs) < n; k, v = cur.Next() {
			seqs = append(seqs, binary.BigEndian.Uint64(k))
			changes = append(changes, bytes.Clone(v))
		}
		return nil
	})
	return seqs, changes, err
}

// Confirmed deletes table's pending writes seqs: the broker has them.
func (s *Store) Confirmed(table string, seqs []uint64) error {
	return s.update(func(tx *bolt.Tx) error {
		p, meta := sub(tx, table, bPending), sub(tx, table, bMeta)
		if p == nil || meta == nil {
			return nil
		}
		n := 0
		for _, q := range seqs {
			k := binary.BigEndian.AppendUint64(nil, q)
			if p.Get(k) == nil {
				continue // confirmed before
			}
			if err := p.Delete(k); err != nil {
				return err
			}
			n++
		}
		return addCount(meta, kPending, -n)
	})
}

// Tables returns the tables the store holds.
func (s *Store) Tables() ([]string, error) {
	var out []string
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
			out = append(out, string(name))
			return nil
		})
	})
	return out, err
}

func sub(tx *bolt.Tx, table string, name []byte) *bolt.Bucket {
	tb := tx.Bucket([]byte(table))
	if tb == nil {
		return nil
	}
	return tb.Bucket(name)
}

// CopyTo writes a consistent copy of the store to path (a new file, mode
// 0600) while it stays in use: its cells and its read offsets as one
// commit left them. A backup of a running node.
func (s *Store) CopyTo(path string) error { return boltfile.Copy(s.db, path) }
