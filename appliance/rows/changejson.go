package rows

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"slices"
	"strconv"
	"unicode/utf8"
)

// The JSON of changes and log batches, written and read by hand:
// encoding/json's reflection cost more than the rest of a write, and a
// joining node spent most of its time decoding snapshots.
//
// The writer makes what encoding/json makes of the same values (keys in
// the struct's order, a change's fields sorted, the same escapes). The
// reader takes that form only, exactly as written (known keys spelt as
// written, each once; a change's fields sorted; plain ASCII strings
// without escapes; whole numbers), into zero values; anything else, a peer's odd but valid
// encoding included, goes to encoding/json. Every message therefore
// reads the same on every node, whichever way it is decoded.

// changeJSON and batchJSON are Change and batch without their methods:
// what encoding/json decodes when the hand-written reader declines.
type (
	changeJSON Change
	batchJSON  batch
)

// MarshalJSON encodes c as encoding/json would without the method.
func (c Change) MarshalJSON() ([]byte, error) { return appendChange(nil, &c), nil }

// MarshalJSON encodes b as encoding/json would without the method.
func (b batch) MarshalJSON() ([]byte, error) { return appendBatch(nil, &b), nil }

// UnmarshalJSON decodes c, by hand when data has the writer's form.
func (c *Change) UnmarshalJSON(data []byte) error {
	if c.Table == "" && c.Row == "" && c.Cells == nil {
		r := jsonReader{b: data}
		var v Change
		if r.change(&v) && r.end() {
			*c = v
			return nil
		}
	}
	return json.Unmarshal(data, (*changeJSON)(c))
}

// UnmarshalJSON decodes b, by hand when data has the writer's form.
func (b *batch) UnmarshalJSON(data []byte) error {
	if b.zero() {
		return decodeBatch(data, b)
	}
	return json.Unmarshal(data, (*batchJSON)(b))
}

// decodeBatch decodes data into b, which is zero, as json.Unmarshal
// does, without encoding/json's two passes over data before the
// hand-written reader runs (UnmarshalJSON is called after them).
func decodeBatch(data []byte, b *batch) error {
	r := jsonReader{b: data}
	var v batch
	if r.batch(&v) && r.end() {
		*b = v
		return nil
	}
	return json.Unmarshal(data, (*batchJSON)(b))
}

func (b *batch) zero() bool {
	return b.V == 0 && b.Kind == "" && b.Node == "" && b.Snap == "" && b.Part == 0 && b.Parts == 0 &&
		b.Join == 0 && b.Changes == nil && b.From == 0
}

// appendBatch appends b's JSON to dst.
func appendBatch(dst []byte, b *batch) []byte {
	if dst == nil {
		// Room for all of it: a snapshot's part grows to 256 KiB.
		n := 128 + len(b.Kind) + len(b.Node) + len(b.Snap)
		for i := range b.Changes {
			n += 32 + len(b.Changes[i].Table) + len(b.Changes[i].Row)
			for _, w := range b.Changes[i].Cells {
				n += 48 + len(w.Field) + len(w.Node) + base64.StdEncoding.EncodedLen(len(w.Value))
			}
		}
		dst = make([]byte, 0, n)
	}
	dst = append(dst, `{"v":`...)
	dst = strconv.AppendInt(dst, int64(b.V), 10)
	dst = append(dst, `,"kind":`...)
	dst = appendJSONString(dst, b.Kind)
	dst = append(dst, `,"node":`...)
	dst = appendJSONString(dst, b.Node)
	if b.Snap != "" {
		dst = append(dst, `,"snap":`...)
		dst = appendJSONString(dst, b.Snap)
	}
	if b.Part != 0 {
		dst = append(dst, `,"part":`...)
		dst = strconv.AppendInt(dst, int64(b.Part), 10)
	}
	if b.Parts != 0 {
		dst = append(dst, `,"parts":`...)
		dst = strconv.AppendInt(dst, int64(b.Parts), 10)
	}
	if b.Join != 0 {
		dst = append(dst, `,"join":`...)
		dst = strconv.AppendUint(dst, b.Join, 10)
	}
	dst = append(dst, `,"changes":`...)
	if b.Changes == nil {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, '[')
		for i := range b.Changes {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendChange(dst, &b.Changes[i])
		}
		dst = append(dst, ']')
	}
	if b.From != 0 {
		dst = append(dst, `,"from":`...)
		dst = strconv.AppendUint(dst, b.From, 10)
	}
	return append(dst, '}')
}

// appendChange appends c's JSON to dst.
func appendChange(dst []byte, c *Change) []byte {
	dst = append(dst, `{"table":`...)
	dst = appendJSONString(dst, c.Table)
	dst = append(dst, `,"row":`...)
	dst = appendJSONString(dst, c.Row)
	dst = append(dst, `,"cells":`...)
	if c.Cells == nil {
		return append(dst, "null}"...)
	}
	cs := c.Cells
	if !cs.inOrder() {
		cs = sortCells(slices.Clone(cs))
	}
	return append(appendCells(dst, cs), '}')
}

// appendCells appends the JSON object of cs, which is in order.
func appendCells(dst []byte, cs Cells) []byte {
	dst = append(dst, '{')
	for i := range cs {
		if i > 0 {
			dst = append(dst, ',')
		}
		w := &cs[i]
		dst = appendJSONString(dst, w.Field)
		dst = append(dst, `:{"t":`...)
		dst = strconv.AppendUint(dst, uint64(w.Stamp), 10)
		dst = append(dst, `,"n":`...)
		dst = appendJSONString(dst, w.Node)
		if w.Deleted {
			dst = append(dst, `,"d":true`...)
		}
		if len(w.Value) > 0 {
			dst = append(dst, `,"v":"`...)
			dst = base64.StdEncoding.AppendEncode(dst, w.Value)
			dst = append(dst, '"')
		}
		dst = append(dst, '}')
	}
	return append(dst, '}')
}

// appendJSONString appends s quoted as encoding/json quotes it (HTML
// characters and U+2028/U+2029 escaped, invalid UTF-8 as U+FFFD).
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

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
