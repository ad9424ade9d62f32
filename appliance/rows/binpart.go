package rows

import (
	"encoding/binary"
	"errors"
)

// A snapshot's part in binary (batch version 2). A joiner reads a whole
// table of them: in JSON, a value is base64 and every cell names its
// keys, and reading that was half of a joiner's opening; in binary a row
// is its name and its cells as the store keeps them (rowvalue.go), the
// values read in place. Changes stay JSON (version 1): they are small,
// and a program's word on the wire is easy to read in them.
//
// The plaintext is
//
//	binaryPart (a byte no JSON starts with)
//	uvarint length, the batch's JSON without its changes ("v":2)
//	each row: uvarint length, row; uvarint length, its cells (entries
//	of rowvalue.go: field length (a byte), field, cell length
//	(uvarint), cell (Cell.encode: stamp, flags, node length, node,
//	value))
//
// A part decodes into the same batch a JSON one does, and openBatch
// checks it by the same rules. A meshbox of before version 2 refuses
// such a part (it does not open): it joins from the log instead.

// binaryPart is the first byte of a part in binary.
const binaryPart = 0x02

// snapshotV is the version of a snapshot's parts this node writes.
const snapshotV = 2

var errPartDamaged = errors.New("binary snapshot part damaged")

// appendBinaryPart appends b (a snapshot's part) in binary to dst.
func appendBinaryPart(dst []byte, b *batch) []byte {
	head := *b
	head.Changes = nil
	h := appendBatch(nil, &head)
	dst = append(dst, binaryPart)
	dst = binary.AppendUvarint(dst, uint64(len(h)))
	dst = append(dst, h...)
	for i := range b.Changes {
		ch := &b.Changes[i]
		dst = binary.AppendUvarint(dst, uint64(len(ch.Row)))
		dst = append(dst, ch.Row...)
		size := 0
		for j := range ch.Cells {
			c := &ch.Cells[j]
			n := 10 + len(c.Node) + len(c.Value)
			size += 1 + len(c.Field) + uvarintLen(uint64(n)) + n
		}
		dst = binary.AppendUvarint(dst, uint64(size))
		for j := range ch.Cells {
			dst = appendCellEntry(dst, ch.Cells[j].Field, ch.Cells[j].cell())
		}
	}
	return dst
}

func uvarintLen(v uint64) int {
	n := 1
	for ; v >= 0x80; v >>= 7 {
		n++
	}
	return n
}

// decodeBinaryPart reads a part in binary of table's log into b. Values
// alias data; names repeat, and are kept once.
func decodeBinaryPart(data []byte, table string, b *batch) error {
	if len(data) == 0 || data[0] != binaryPart {
		return errPartDamaged
	}
	data = data[1:]
	n, k := binary.Uvarint(data)
	if k <= 0 || n > uint64(len(data)-k) {
		return errPartDamaged
	}
	var head batch
	if err := decodeBatch(data[k:k+int(n)], &head); err != nil {
		return err
	}
	if head.Changes != nil {
		return errors.New("binary snapshot part: changes in its head")
	}
	*b = head
	data = data[k+int(n):]
	var names []string
	name := func(s []byte) string {
		for _, n := range names {
			if string(s) == n {
				return n
			}
		}
		n := string(s)
		if len(names) < maxNames {
			names = append(names, n)
		}
		return n
	}
	// A row is at least 14 bytes (two lengths, a byte of row, one cell).
	b.Changes = make([]Change, 0, len(data)/64)
	var cells Cells
	for len(data) > 0 {
		row, rest, ok := lengthPrefixed(data)
		if !ok {
			return errPartDamaged
		}
		v, rest, ok := lengthPrefixed(rest)
		if !ok {
			return errPartDamaged
		}
		data = rest
		start := len(cells)
		// The row's cells are its stored value as they are, unless a
		// length in them is longer than it need be.
		stored, canonical := v, true
		for len(v) > 0 {
			f, c, next, err := nextEntry(v)
			if err != nil {
				return errPartDamaged
			}
			canonical = canonical && len(v)-len(next) == 1+len(f)+uvarintLen(uint64(len(c)))+len(c)
			v = next
			if c[8] > 1 {
				return errors.New("binary snapshot part: a cell's flags unknown")
			}
			if len(cells) == cap(cells) {
				grown := make(Cells, len(cells)-start, max(cellChunk, 2*(len(cells)-start)))
				copy(grown, cells[start:])
				cells, start = grown, 0
			}
			node := int(c[9])
			w := WireCell{Stamp: Stamp(binary.BigEndian.Uint64(c)), Deleted: c[8] == 1, Node: name(c[10 : 10+node])}
			if len(c) > 10+node {
				w.Value = c[10+node : len(c) : len(c)]
			}
			cells = append(cells, FieldCell{Field: name(f), WireCell: w})
		}
		if len(cells) == start {
			return errors.New("binary snapshot part: a row without cells")
		}
		ch := Change{Table: table, Row: string(row), Cells: cells[start:len(cells):len(cells)]}
		if canonical {
			ch.stored = stored[:len(stored):len(stored)]
		}
		b.Changes = append(b.Changes, ch)
	}
	return nil
}

// lengthPrefixed splits a uvarint length and as many bytes off data.
func lengthPrefixed(data []byte) (v, rest []byte, ok bool) {
	n, k := binary.Uvarint(data)
	if k <= 0 || n > uint64(len(data)-k) {
		return nil, nil, false
	}
	return data[k : k+int(n)], data[k+int(n):], true
}
