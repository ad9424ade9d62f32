package rows

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Store is a node's replica of its tables, in one bbolt file
// (<data>/rows.db). Each table is a bucket holding:
//
//	cells    row \x00 field -> the winning version (Cell.encode)
//	history  row \x00 field \x00 stamp -> versions replaced, newest kept (historyKeep)
//	pending  seq -> a local write not yet confirmed by the broker (JSON Change)
//	meta     offset -> the next offset of the table's log to read
//	         rows, pending -> the live rows and the pending writes, kept
//	         with every change (status reads them on every call; a
//	         count by scanning cost a table of 100,000 rows 50 ms)
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
	bCells   = []byte("cells")
	bHistory = []byte("history")
	bPending = []byte("pending")
	bMeta    = []byte("meta")
	kOffset  = []byte("offset")
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

// OpenStore opens (creating) the store at path.
func OpenStore(path string) (*Store, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, InitialMmapSize: initialMmap})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("open rows store %s: in use by another meshbox process", path)
		}
		return nil, fmt.Errorf("open rows store %s: %w", path, err)
	}
	if err := db.Update(countAll); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open rows store %s: count its rows: %w", path, err)
	}
	st := &Store{db: db, queue: make(chan commitCall), quit: make(chan struct{}), exited: make(chan struct{})}
	go st.commit() // until Close
	return st, nil
}

// putChange stores the cells of ch that win and keeps the table's row
// count: it returns what won (zero: nothing). tail is as mergeChange's.
func putChange(cells, history, meta *bolt.Bucket, ch Change, tail *[]byte) (Applied, error) {
	won, d, err := mergeChange(cells, history, ch, tail)
	if err != nil || d == 0 {
		return won, err
	}
	return won, addCount(meta, kRows, d)
}

// cellsTail is the last key of cells (nil: none), a copy: the tail a
// transaction's mergeChange calls start from.
func cellsTail(cells *bolt.Bucket) []byte {
	k, _ := cells.Cursor().Last()
	return bytes.Clone(k)
}

// rowScan bounds the cells of a row mergeChange walks through for the
// versions ch replaces; past it, it looks the rest up one by one.
const rowScan = 32

// mergeChange stores the cells of ch that win, the versions they replace
// going to history: it returns what won and how the table's live rows
// changed (-1, 0, 1). It reads the row's cells once, in one walk from
// its first, and keeps each key and stored version of a change in one
// allocation. tail, if not nil, is the last key cells holds, kept by the
// calls of one transaction: a row after it (a joiner's snapshot, rows
// new to the table in key order) is known to be new without a lookup.
func mergeChange(cells, history *bolt.Bucket, ch Change, tail *[]byte) (Applied, int, error) {
	if !ch.Cells.inOrder() {
		return Applied{}, 0, errCellsOrder
	}
	size := 0
	for _, w := range ch.Cells {
		size += 2*(len(ch.Row)+1+len(w.Field)) + 10 + len(w.Node) + len(w.Value)
	}
	arena := make([]byte, 0, size)
	prefix := cellKey(ch.Row, "")
	// The versions the row holds of ch's fields; whether another field
	// of it is live.
	type version struct {
		field string
		v     []byte
	}
	var heldBuf [4]version
	held := heldBuf[:0]
	othersLive, complete := false, true
	newRow := tail != nil && *tail != nil && bytes.Compare(prefix, *tail) > 0
	n := 0
	var k, v []byte
	var cur *bolt.Cursor
	if !newRow {
		cur = cells.Cursor()
		k, v = cur.Seek(prefix)
	}
	for ; k != nil && bytes.HasPrefix(k, prefix); k, v = cur.Next() {
		if _, named := ch.Cells.index(string(k[len(prefix):])); named {
			held = append(held, version{string(k[len(prefix):]), v})
		} else if len(v) > 8 && v[8]&1 == 0 {
			othersLive = true
		}
		if n++; n >= rowScan && othersLive {
			complete = false
			break
		}
	}
	var wonBuf [8]string
	won := wonBuf[:0] // the fields that won
	liveBefore, liveAfter := othersLive, othersLive
	for _, w := range ch.Cells {
		f, c := w.Field, w.cell()
		var old []byte
		if i := slices.IndexFunc(held, func(h version) bool { return h.field == f }); i >= 0 {
			old = held[i].v
		} else if !complete {
			old = cells.Get(cellKey(ch.Row, f))
		}
		finalLive := !c.Deleted
		if old != nil {
			// The version held, read in place (its node's name is not
			// copied to compare it).
			if len(old) < 10 || len(old) < 10+int(old[9]) {
				return Applied{}, 0, errors.New("stored cell too short")
			}
			oStamp, oDeleted, oNode := Stamp(binary.BigEndian.Uint64(old)), old[8]&1 != 0, old[10:10+int(old[9])]
			liveBefore = liveBefore || !oDeleted
			if c.Stamp < oStamp || c.Stamp == oStamp && c.Node <= string(oNode) { // c does not win
				if c.Stamp != oStamp || c.Node != string(oNode) { // not the same version again
					if err := keepHistory(history, cellKey(ch.Row, f), c.Stamp, c.encode(nil)); err != nil {
						return Applied{}, 0, err
					}
				}
				liveAfter = liveAfter || !oDeleted
				continue
			}
			if err := keepHistory(history, cellKey(ch.Row, f), oStamp, bytes.Clone(old)); err != nil {
				return Applied{}, 0, err
			}
		}
		liveAfter = liveAfter || finalLive
		start := len(arena)
		arena = append(append(append(arena, ch.Row...), 0), f...)
		k := arena[start:len(arena):len(arena)]
		start = len(arena)
		arena = c.encode(arena)
		if err := cells.Put(k, arena[start:len(arena):len(arena)]); err != nil {
			return Applied{}, 0, err
		}
		if tail != nil && bytes.Compare(k, *tail) > 0 {
			*tail = k
		}
		won = append(won, f)
	}
	if len(won) == 0 {
		return Applied{}, 0, nil
	}
	a := Applied{Table: ch.Table, Row: ch.Row, change: ch.Cells, n: len(won)}
	if len(won) < len(ch.Cells) {
		a.won = make(map[string]Cell, len(won))
		for _, f := range won {
			w, _ := ch.Cells.Get(f)
			a.won[f] = w.cell()
		}
	}
	switch {
	case liveAfter && !liveBefore:
		return a, 1, nil
	case liveBefore && !liveAfter:
		return a, -1, nil
	}
	return a, 0, nil
}

// Change is the versions of some fields of one row of one table: a write
// of this node, or one read from the table's log.
type Change struct {
	Table string `json:"table"`
	Row   string `json:"row"`
	Cells Cells  `json:"cells"`
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

func splitCellKey(k []byte) (row, field string) {
	i := bytes.IndexByte(k, 0)
	if i < 0 {
		return string(k), ""
	}
	return string(k[:i]), string(k[i+1:])
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
		for i, ch := range changes {
			_, d, err := mergeChange(cells, history, ch, nil)
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
		if cells == nil {
			return nil
		}
		prefix := append([]byte(row), 0)
		cur := cells.Cursor()
		for k, v := cur.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = cur.Next() {
			c, err := decodeCell(v)
			if err != nil {
				return err
			}
			c.Value = bytes.Clone(c.Value)
			if out == nil {
				out = map[string]Cell{}
			}
			_, f := splitCellKey(k)
			out[f] = c
		}
		return nil
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
		// A row's cells are keyed row\0field, and row keys hold no byte
		// below '-': after\1 sorts past every cell of after and before
		// every row that follows it.
		if from := append([]byte(after), 1); bytes.Compare(from, start) > 0 {
			start = from
		}
	}
	return s.db.View(func(tx *bolt.Tx) error {
		cells := sub(tx, table, bCells)
		if cells == nil {
			return nil
		}
		cur := cells.Cursor()
		var row string
		var cur_ map[string]Cell
		// A row, a node's name and a value are copied out of the
		// transaction once: names repeat from row to row, and values
		// share chunks.
		nodes := map[string]string{}
		var values []byte
		for k, v := cur.Seek(start); k != nil && bytes.HasPrefix(k, []byte(prefix)); k, v = cur.Next() {
			r, f := k, []byte(nil)
			if i := bytes.IndexByte(k, 0); i >= 0 {
				r, f = k[:i], k[i+1:]
			}
			if cur_ != nil && string(r) != row {
				if !fn(row, cur_) {
					return nil
				}
				cur_ = nil
			}
			if cur_ == nil {
				row, cur_ = string(r), make(map[string]Cell, 4)
			}
			if len(v) < 10 || len(v) < 10+int(v[9]) {
				return errors.New("stored cell too short")
			}
			c := Cell{Stamp: Stamp(binary.BigEndian.Uint64(v)), Deleted: v[8]&1 != 0}
			node := v[10 : 10+int(v[9])]
			if c.Node = nodes[string(node)]; c.Node == "" && len(node) > 0 {
				c.Node = string(node)
				if len(nodes) < 256 {
					nodes[c.Node] = c.Node
				}
			}
			if !c.Deleted {
				val := v[10+len(node):]
				if len(values)+len(val) > cap(values) {
					values = make([]byte, 0, max(len(val), valueChunk))
				}
				values = append(values, val...)
				c.Value = values[len(values)-len(val) : len(values) : len(values)]
			}
			cur_[string(f)] = c
		}
		if cur_ != nil {
			fn(row, cur_)
		}
		return nil
	})
}

// History returns the versions of row.field this node holds, newest
// first: the winner, then those it replaced (at most historyKeep).
func (s *Store) History(table, row, field string) ([]Cell, error) {
	var out []Cell
	err := s.db.View(func(tx *bolt.Tx) error {
		k := cellKey(row, field)
		if cells := sub(tx, table, bCells); cells != nil {
			if v := cells.Get(k); v != nil {
				c, err := decodeCell(v)
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
