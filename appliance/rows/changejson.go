package rows

import (
	"encoding/base64"
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
