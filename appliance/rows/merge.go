package rows

import (
	"bytes"
	"encoding/binary"
	"errors"

	bolt "go.etcd.io/bbolt"
)

// Merging changes into a table's cells (one key a row: rowvalue.go),
// field by field: of two versions of a field, the one that wins (Cell.Wins)
// is kept and the other goes to history.

// merger merges changes into a table's cells within one transaction.
type merger struct {
	cells, history *bolt.Bucket
	// tail is the last row cells holds ("": none, or not kept): a row
	// after it (a joiner's snapshot, rows new to the table in key order)
	// is known to be new without a lookup.
	tail  string
	track bool
	// key is the row's key, read and put (bbolt copies keys it keeps).
	key []byte
	// arena holds the values put, a chunk at a time: bbolt keeps them,
	// uncopied, until the commit.
	arena []byte
}

// preEncode makes each change's stored value (Change.stored), the
// changes' values in one allocation. The reader's opening runs side by
// side on the cores, its commit on one: a joiner's snapshot spent a
// sixth of its commits encoding rows new to the table. A change of a
// binary part has it already (decodeBinaryPart).
func preEncode(changes []Change) {
	size := 0
	for i := range changes {
		if changes[i].stored != nil {
			continue
		}
		for j := range changes[i].Cells {
			c := &changes[i].Cells[j]
			size += entrySize(c.Field, &c.WireCell)
		}
	}
	buf := make([]byte, 0, size)
	for i := range changes {
		ch := &changes[i]
		if len(ch.Cells) == 0 || ch.stored != nil {
			continue
		}
		start := len(buf)
		for j := range ch.Cells {
			buf = appendCellEntry(buf, ch.Cells[j].Field, ch.Cells[j].cell())
		}
		ch.stored = buf[start:len(buf):len(buf)]
	}
}

// arenaChunk is the size of a merger's chunks of values.
const arenaChunk = 64 << 10

// newMerger returns a merger of cells and history; with track, it keeps
// the tail (the calls of one transaction, nothing else putting into
// cells meanwhile).
func newMerger(cells, history *bolt.Bucket, track bool) *merger {
	m := &merger{cells: cells, history: history, track: track}
	if track {
		k, _ := cells.Cursor().Last()
		m.tail = string(k)
	}
	return m
}

// after reports whether row is after the table's last row, so new.
func (m *merger) after(row string) bool { return m.tail != "" && row > m.tail }

// room returns a slice of the arena with capacity for n bytes.
func (m *merger) room(n int) []byte {
	if len(m.arena)+n > cap(m.arena) {
		m.arena = make([]byte, 0, max(n, arenaChunk))
	}
	return m.arena[len(m.arena):len(m.arena)]
}

// put stores value (a slice room gave) as row's and keeps it in the arena.
func (m *merger) put(row string, value []byte) error {
	if n := len(m.arena) + len(value); n <= cap(m.arena) {
		m.arena = m.arena[:n]
	}
	return m.putValue(row, value)
}

// putValue stores value as row's; bbolt keeps it until the commit.
func (m *merger) putValue(row string, value []byte) error {
	m.key = append(m.key[:0], row...)
	if err := m.cells.Put(m.key, value); err != nil {
		return err
	}
	if m.track && row > m.tail {
		m.tail = row
	}
	return nil
}

// merge stores the cells of ch that win, the versions they replace going
// to history: it returns what won and how the table's live rows changed
// (-1, 0, 1). A row new to the table is put without reading anything.
func (m *merger) merge(ch Change) (Applied, int, error) {
	if !ch.Cells.inOrder() {
		return Applied{}, 0, errCellsOrder
	}
	size := 0
	for i := range ch.Cells {
		if len(ch.Cells[i].Field) > 255 || len(ch.Cells[i].Node) > 255 {
			return Applied{}, 0, errors.New("a field or node name longer than 255 bytes")
		}
		size += entrySize(ch.Cells[i].Field, &ch.Cells[i].WireCell)
	}
	var old []byte
	if !m.after(ch.Row) {
		m.key = append(m.key[:0], ch.Row...)
		old = m.cells.Get(m.key)
	}
	if old == nil {
		return m.mergeNew(ch, size)
	}
	return m.mergeHeld(ch, old, size)
}

// mergeNew stores every cell of ch as a new row's.
func (m *merger) mergeNew(ch Change, size int) (Applied, int, error) {
	if len(ch.Cells) == 0 {
		return Applied{}, 0, nil
	}
	live := false
	for i := range ch.Cells {
		live = live || !ch.Cells[i].Deleted
	}
	var err error
	if ch.stored != nil {
		err = m.putValue(ch.Row, ch.stored)
	} else {
		v := m.room(size)
		for i := range ch.Cells {
			v = appendCellEntry(v, ch.Cells[i].Field, ch.Cells[i].cell())
		}
		err = m.put(ch.Row, v)
	}
	if err != nil {
		return Applied{}, 0, err
	}
	a := Applied{Table: ch.Table, Row: ch.Row, change: ch.Cells, n: len(ch.Cells)}
	if live {
		return a, 1, nil
	}
	return a, 0, nil
}

// mergeHeld merges ch into the row held, whose value is old: one walk of
// both, in field order, into the row's new value.
func (m *merger) mergeHeld(ch Change, old []byte, size int) (Applied, int, error) {
	v := m.room(len(old) + size)
	var wonBuf [8]string
	won := wonBuf[:0] // the fields that won
	liveBefore, liveAfter := false, false
	i := 0
	// newer adds ch's cells of fields before field (all: all that are
	// left), which the row does not hold.
	newer := func(field string, all bool) {
		for ; i < len(ch.Cells) && (all || ch.Cells[i].Field < field); i++ {
			v = appendCellEntry(v, ch.Cells[i].Field, ch.Cells[i].cell())
			liveAfter = liveAfter || !ch.Cells[i].Deleted
			won = append(won, ch.Cells[i].Field)
		}
	}
	for rest := old; len(rest) > 0; {
		f, held, next, err := nextEntry(rest)
		if err != nil {
			return Applied{}, 0, err
		}
		rest = next
		heldDeleted := cellDeleted(held)
		liveBefore = liveBefore || !heldDeleted
		newer(string(f), false)
		if i == len(ch.Cells) || ch.Cells[i].Field != string(f) {
			v = appendEntry(v, string(f), held) // a field ch does not name
			liveAfter = liveAfter || !heldDeleted
			continue
		}
		w := &ch.Cells[i]
		i++
		c := w.cell()
		hStamp, hNode := Stamp(binary.BigEndian.Uint64(held)), held[10:10+int(held[9])]
		if c.Stamp < hStamp || c.Stamp == hStamp && c.Node <= string(hNode) { // c does not win
			if c.Stamp != hStamp || c.Node != string(hNode) { // not the same version again
				if err := keepHistory(m.history, cellKey(ch.Row, w.Field), c.Stamp, c.encode(nil)); err != nil {
					return Applied{}, 0, err
				}
			}
			v = appendEntry(v, w.Field, held)
			liveAfter = liveAfter || !heldDeleted
			continue
		}
		if err := keepHistory(m.history, cellKey(ch.Row, w.Field), hStamp, bytes.Clone(held)); err != nil {
			return Applied{}, 0, err
		}
		v = appendCellEntry(v, w.Field, c)
		liveAfter = liveAfter || !c.Deleted
		won = append(won, w.Field)
	}
	newer("", true)
	if len(won) == 0 {
		return Applied{}, 0, nil
	}
	if err := m.put(ch.Row, v); err != nil {
		return Applied{}, 0, err
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

// putChange merges ch and keeps the table's row count: it returns what
// won (zero: nothing).
func (m *merger) putChange(meta *bolt.Bucket, ch Change) (Applied, error) {
	won, d, err := m.merge(ch)
	if err != nil || d == 0 {
		return won, err
	}
	return won, addCount(meta, kRows, d)
}
