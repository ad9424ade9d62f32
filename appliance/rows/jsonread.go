package rows

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"strconv"
)

// The hand-written reader of changes and log batches (changejson.go says
// which form it takes).

// jsonReader reads the writer's form of JSON from b; each method reports
// false for anything else, and the caller leaves the input to
// encoding/json.
type jsonReader struct {
	b []byte
	i int
	// names holds the strings read so far that repeat from change to
	// change (tables, fields, nodes): one allocation each, not one a cell.
	names []string
	// values is where values are decoded to, a chunk at a time: one
	// allocation for many cells.
	values []byte
	// cells is where changes' cells are read to, a chunk at a time.
	cells Cells
}

// cellChunk is the most cells a chunk of them holds.
const cellChunk = 1024

// valueChunk is the size of the chunks values are decoded to.
const valueChunk = 32 << 10

func (r *jsonReader) ws() {
	for r.i < len(r.b) {
		switch r.b[r.i] {
		case ' ', '\t', '\n', '\r':
			r.i++
		default:
			return
		}
	}
}

// next skips white space and takes c if it comes next.
func (r *jsonReader) next(c byte) bool {
	if r.i < len(r.b) && r.b[r.i] == c { // the writer puts no space
		r.i++
		return true
	}
	r.ws()
	if r.i < len(r.b) && r.b[r.i] == c {
		r.i++
		return true
	}
	return false
}

// end reports whether only white space is left.
func (r *jsonReader) end() bool {
	r.ws()
	return r.i == len(r.b)
}

// str reads a string of printable ASCII without escapes; it aliases b.
func (r *jsonReader) str() ([]byte, bool) {
	if !r.next('"') {
		return nil, false
	}
	start := r.i
	end := bytes.IndexByte(r.b[start:], '"')
	if end < 0 {
		return nil, false
	}
	s := r.b[start : start+end]
	if !plainASCII(s) {
		return nil, false
	}
	r.i = start + end + 1
	return s, true
}

// plainASCII reports whether s is printable ASCII without '\\': eight
// bytes at a time (a value's base64 is most of a batch).
func plainASCII(s []byte) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	for len(s) >= 8 {
		w := binary.LittleEndian.Uint64(s)
		below := (w - 0x20*ones) &^ w       // a byte below 0x20 (or one of 0x80 and up)
		above := (w + (0x80-0x7f)*ones) | w // a byte of 0x7f and up
		bs := w ^ ('\\' * ones)
		slash := (bs - ones) &^ bs // a '\\'
		if (below|above|slash)&highs != 0 {
			return false
		}
		s = s[8:]
	}
	for _, c := range s {
		if c < 0x20 || c >= 0x7f || c == '\\' {
			return false
		}
	}
	return true
}

func (r *jsonReader) string() (string, bool) {
	s, ok := r.str()
	return string(s), ok
}

// name is string for a name that repeats (a table, a field, a node):
// the few a batch holds are compared, not hashed, and kept once.
func (r *jsonReader) name() (string, bool) {
	s, ok := r.str()
	if !ok {
		return "", false
	}
	for _, n := range r.names {
		if string(s) == n {
			return n, true
		}
	}
	n := string(s)
	if len(r.names) < maxNames {
		r.names = append(r.names, n)
	}
	return n, true
}

// maxNames bounds the names a reader keeps.
const maxNames = 16

// key reads an object's key and its colon: its index in names (-1: not
// one of them).
func (r *jsonReader) key(names []string) int {
	k, ok := r.str()
	if !ok || !r.next(':') {
		return -1
	}
	for i, n := range names {
		if string(k) == n {
			return i
		}
	}
	return -1
}

// uint reads a whole number without sign, leading zeros or exponent that
// is at most max.
func (r *jsonReader) uint(max uint64) (uint64, bool) {
	r.ws()
	start := r.i
	var n uint64
	for ; r.i < len(r.b) && r.b[r.i] >= '0' && r.b[r.i] <= '9'; r.i++ {
		d := uint64(r.b[r.i] - '0')
		if n > (max-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	switch {
	case r.i == start, r.b[start] == '0' && r.i-start > 1:
		return 0, false
	case r.i < len(r.b) && (r.b[r.i] == '.' || r.b[r.i] == 'e' || r.b[r.i] == 'E'):
		return 0, false
	}
	return n, true
}

func (r *jsonReader) int() (int, bool) {
	n, ok := r.uint(1<<(strconv.IntSize-1) - 1)
	return int(n), ok
}

// literal takes the word w (true, false, null) if it comes next.
func (r *jsonReader) literal(w string) bool {
	r.ws()
	if len(r.b)-r.i >= len(w) && string(r.b[r.i:r.i+len(w)]) == w {
		r.i += len(w)
		return true
	}
	return false
}

// has reports whether w comes next, as is.
func (r *jsonReader) has(w string) bool {
	return len(r.b)-r.i >= len(w) && string(r.b[r.i:r.i+len(w)]) == w
}

// object reads an object, calling member for each key (once each, of
// the known keys numbered by name); member reads the value.
func (r *jsonReader) object(names []string, member func(k int) bool) bool {
	if !r.next('{') {
		return false
	}
	if r.next('}') {
		return true
	}
	var seen uint64
	for {
		n := r.key(names)
		if n < 0 || seen&(1<<n) != 0 || !member(n) {
			return false
		}
		seen |= 1 << n
		if r.next('}') {
			return true
		}
		if !r.next(',') {
			return false
		}
	}
}

var (
	changeKeys = []string{"table", "row", "cells"}
	cellKeys   = []string{"t", "n", "d", "v"}
	batchKeys  = []string{"v", "kind", "node", "snap", "part", "parts", "join", "changes", "from"}
)

// change reads a change: the writer's form (keys table, row, cells, in
// that order, without space) by a shorter way, anything else as an object.
func (r *jsonReader) change(c *Change) bool {
	if start := r.i; r.has(`{"table":`) {
		r.i += len(`{"table":`)
		if r.changeAsWritten(c) {
			return true
		}
		r.i, *c = start, Change{}
	}
	return r.object(changeKeys, func(k int) bool {
		switch k {
		case 0:
			var ok bool
			c.Table, ok = r.name()
			return ok
		case 1:
			var ok bool
			c.Row, ok = r.string()
			return ok
		}
		return r.changeCells(c)
	})
}

// changeAsWritten reads the rest of a change in the writer's form after
// its {"table":.
func (r *jsonReader) changeAsWritten(c *Change) bool {
	var ok bool
	if c.Table, ok = r.name(); !ok || !r.has(`,"row":`) {
		return false
	}
	r.i += len(`,"row":`)
	if c.Row, ok = r.string(); !ok || !r.has(`,"cells":`) {
		return false
	}
	r.i += len(`,"cells":`)
	return r.changeCells(c) && r.next('}')
}

// changeCells reads a change's cells.
func (r *jsonReader) changeCells(c *Change) bool {
	if r.literal("null") {
		return true
	}
	if !r.next('{') {
		return false
	}
	if r.next('}') {
		c.Cells = Cells{}
		return true
	}
	// The cells of every change share r.cells, a chunk at a time.
	start := len(r.cells)
	for {
		f, ok := r.name()
		if !ok || !r.next(':') {
			return false
		}
		if len(r.cells) > start && r.cells[len(r.cells)-1].Field >= f {
			return false // not in order, or named twice
		}
		if len(r.cells) == cap(r.cells) {
			start = r.moreCells(start)
		}
		r.cells = append(r.cells, FieldCell{Field: f})
		if !r.cell(&r.cells[len(r.cells)-1].WireCell) {
			return false
		}
		if r.next('}') {
			c.Cells = r.cells[start:len(r.cells):len(r.cells)]
			return true
		}
		if !r.next(',') {
			return false
		}
	}
}

// moreCells starts a new chunk of cells, the cells of the change being
// read (from start) moved to it; it returns their new start.
func (r *jsonReader) moreCells(start int) int {
	n := len(r.cells) - start
	chunk := make(Cells, n, max(min(2*cap(r.cells), cellChunk), 2*n, 8))
	copy(chunk, r.cells[start:])
	r.cells = chunk
	return 0
}

// cell reads a cell: the writer's form (keys t, n, d if true, v if
// not empty, in that order, without space) by a shorter way, anything
// else as an object.
func (r *jsonReader) cell(w *WireCell) bool {
	if start := r.i; r.has(`{"t":`) {
		r.i += len(`{"t":`)
		if r.cellAsWritten(w) {
			return true
		}
		r.i, *w = start, WireCell{}
	}
	return r.object(cellKeys, func(k int) bool {
		switch k {
		case 0:
			n, ok := r.uint(1<<64 - 1)
			w.Stamp = Stamp(n)
			return ok
		case 1:
			var ok bool
			w.Node, ok = r.name()
			return ok
		case 2:
			if r.literal("true") {
				w.Deleted = true
				return true
			}
			return r.literal("false")
		}
		if r.literal("null") {
			return true
		}
		return r.value(w)
	})
}

// cellAsWritten reads the rest of a cell in the writer's form after its
// {"t":.
func (r *jsonReader) cellAsWritten(w *WireCell) bool {
	n, ok := r.uint(1<<64 - 1)
	if !ok || !r.has(`,"n":`) {
		return false
	}
	w.Stamp = Stamp(n)
	r.i += len(`,"n":`)
	if w.Node, ok = r.name(); !ok {
		return false
	}
	if r.has(`,"d":true`) {
		r.i += len(`,"d":true`)
		w.Deleted = true
	}
	if r.has(`,"v":"`) {
		r.i += len(`,"v":`)
		if !r.value(w) {
			return false
		}
	}
	return r.next('}')
}

// value reads a cell's value, a string of base64, into r.values.
func (r *jsonReader) value(w *WireCell) bool {
	s, ok := r.str()
	if !ok {
		return false
	}
	if len(s) == 0 {
		w.Value = []byte{}
		return true
	}
	n := base64.StdEncoding.DecodedLen(len(s))
	if len(r.values)+n > cap(r.values) {
		r.values = make([]byte, 0, max(n, valueChunk))
	}
	v := r.values[len(r.values) : len(r.values)+n]
	n, err := base64.StdEncoding.Decode(v, s)
	w.Value = v[:n:n]
	r.values = r.values[:len(r.values)+n]
	return err == nil
}

func (r *jsonReader) batch(b *batch) bool {
	return r.object(batchKeys, func(k int) bool {
		var ok bool
		switch k {
		case 0:
			b.V, ok = r.int()
		case 1:
			b.Kind, ok = r.string()
		case 2:
			b.Node, ok = r.string()
		case 3:
			b.Snap, ok = r.string()
		case 4:
			b.Part, ok = r.int()
		case 5:
			b.Parts, ok = r.int()
		case 6:
			b.Join, ok = r.uint(1<<64 - 1)
		case 8:
			b.From, ok = r.uint(1<<64 - 1)
		case 7:
			if r.literal("null") {
				return true
			}
			if !r.next('[') {
				return false
			}
			// Room for most: a snapshot's part holds thousands (a
			// change of two short fields is some 250 bytes).
			b.Changes = make([]Change, 0, (len(r.b)-r.i)/192)
			if r.next(']') {
				return true
			}
			for {
				b.Changes = append(b.Changes, Change{})
				if !r.change(&b.Changes[len(b.Changes)-1]) {
					return false
				}
				if r.next(']') {
					return true
				}
				if !r.next(',') {
					return false
				}
			}
		}
		return ok
	})
}
