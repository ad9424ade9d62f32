package rows

import (
	"bytes"
	"encoding/binary"
	"errors"

	bolt "go.etcd.io/bbolt"
)

// A row's cells are stored under one key, the row's, in its table's
// cells bucket: its entries in field order, each
//
//	field length (a byte), field, cell length (uvarint), cell (Cell.encode)
//
// One key a row, not one a field: a joiner's snapshot of 100,000 rows of
// two fields cost bbolt 200,000 puts (a B+tree descent, a key copied and
// an element inserted each), half its merging; a row costs one now. A
// write of some fields of a row rewrites the row's value: rows hold
// status, ownership and references (bytes belong in blobs), so that is
// small. Stores of the layout before (one key a field, row \x00 field,
// in a bucket named cells) are moved to this one when opened
// (migrateCells); a store moved is not read by a meshbox of before.

// errCellsDamaged refuses a stored row that does not decode.
var errCellsDamaged = errors.New("stored row damaged")

// appendEntry appends an entry of field, whose stored cell is enc.
func appendEntry(dst []byte, field string, enc []byte) []byte {
	dst = append(dst, byte(len(field)))
	dst = append(dst, field...)
	dst = binary.AppendUvarint(dst, uint64(len(enc)))
	return append(dst, enc...)
}

// appendCellEntry appends an entry of field holding c.
func appendCellEntry(dst []byte, field string, c Cell) []byte {
	dst = append(dst, byte(len(field)))
	dst = append(dst, field...)
	dst = binary.AppendUvarint(dst, uint64(10+len(c.Node)+len(c.Value)))
	return c.encode(dst)
}

// entrySize bounds the size of an entry of field holding w.
func entrySize(field string, w *WireCell) int {
	return 1 + len(field) + binary.MaxVarintLen64 + 10 + len(w.Node) + len(w.Value)
}

// nextEntry splits the first entry off a row's value v: its field, its
// stored cell (at least its head: stamp, flags, node) and the rest.
func nextEntry(v []byte) (field, cell, rest []byte, err error) {
	if len(v) < 1 || len(v) < 1+int(v[0]) {
		return nil, nil, nil, errCellsDamaged
	}
	field, v = v[1:1+int(v[0])], v[1+int(v[0]):]
	n, k := binary.Uvarint(v)
	if k <= 0 || n > uint64(len(v)-k) {
		return nil, nil, nil, errCellsDamaged
	}
	cell, rest = v[k:k+int(n)], v[k+int(n):]
	if len(cell) < 10 || len(cell) < 10+int(cell[9]) {
		return nil, nil, nil, errCellsDamaged
	}
	return field, cell, rest, nil
}

// rowEntries calls fn with each field of a row's value v and its stored
// cell, in field order, until fn returns false.
func rowEntries(v []byte, fn func(field, cell []byte) bool) error {
	for len(v) > 0 {
		f, c, rest, err := nextEntry(v)
		if err != nil {
			return err
		}
		if !fn(f, c) {
			return nil
		}
		v = rest
	}
	return nil
}

// rowCell returns the stored cell of field in a row's value v (nil:
// none).
func rowCell(v []byte, field string) ([]byte, error) {
	var found []byte
	err := rowEntries(v, func(f, c []byte) bool {
		if string(f) == field {
			found = c
		}
		return string(f) < field
	})
	return found, err
}

// cellDeleted reports whether a stored cell is a tombstone.
func cellDeleted(c []byte) bool { return c[8]&1 != 0 }

// valueLive reports whether a row's value holds a field not deleted.
func valueLive(v []byte) bool {
	live := false
	_ = rowEntries(v, func(_, c []byte) bool {
		live = !cellDeleted(c)
		return !live
	})
	return live
}

// bCellsByField is the cells bucket of the layout before: row \x00
// field -> the field's cell; kOldOffset the reader's offset then.
var (
	bCellsByField = []byte("cells")
	kOldOffset    = []byte("offset")
)

// migrateCells moves every table of the store from the layout of one
// key a field to one key a row (in the transaction that opens it), and
// its offset to kOffset. A store an older meshbox wrote to after this
// one (a downgrade, then an upgrade again) holds both layouts: the older
// one is what that meshbox read last, and replaces the other.
func migrateCells(tx *bolt.Tx) error {
	return tx.ForEach(func(name []byte, tb *bolt.Bucket) error {
		if m := tb.Bucket(bMeta); m != nil {
			if v := m.Get(kOldOffset); v != nil {
				if err := m.Put(kOffset, bytes.Clone(v)); err != nil {
					return err
				}
				if err := m.Delete(kOldOffset); err != nil {
					return err
				}
			}
		}
		old := tb.Bucket(bCellsByField)
		if old == nil {
			return nil
		}
		if tb.Bucket(bCells) != nil {
			if err := tb.DeleteBucket(bCells); err != nil {
				return err
			}
		}
		cells, err := tb.CreateBucket(bCells)
		if err != nil {
			return err
		}
		cells.FillPercent = 0.9 // filled in key order
		var row, value []byte
		put := func() error {
			if row == nil {
				return nil
			}
			// bbolt holds the value until the commit: not reused.
			return cells.Put(row, value)
		}
		cur := old.Cursor()
		for k, v := cur.First(); k != nil; k, v = cur.Next() {
			r, f, ok := bytes.Cut(k, []byte{0})
			if !ok || len(r) == 0 || len(f) > 255 || len(v) < 10 || len(v) < 10+int(v[9]) {
				continue // damaged: no read could take it either
			}
			if !bytes.Equal(r, row) {
				if err := put(); err != nil {
					return err
				}
				row, value = bytes.Clone(r), nil
			}
			value = appendEntry(value, string(f), v)
		}
		if err := put(); err != nil {
			return err
		}
		return tb.DeleteBucket(bCellsByField)
	})
}
