package rows

import (
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"sort"
	"strings"
)

// Cells are the fields a change names and their versions, in field
// order (bytewise, as the store's keys sort), each field once: a slice,
// not a map, so that a joiner decoding a snapshot of 100,000 rows makes
// no map a row (a map of two fields cost more than the rest of a row's
// decoding). On the wire they are a JSON object keyed by field, as a
// map[string]WireCell is: nodes of every version read each other's.
type Cells []FieldCell

// FieldCell is one field of a change and its version.
type FieldCell struct {
	Field string
	WireCell
}

// CellsOf returns m's fields in order (nil: nil).
func CellsOf(m map[string]WireCell) Cells {
	if m == nil {
		return nil
	}
	cs := make(Cells, 0, len(m))
	for _, f := range slices.Sorted(maps.Keys(m)) {
		cs = append(cs, FieldCell{Field: f, WireCell: m[f]})
	}
	return cs
}

// Map returns cs by field (nil: nil).
func (cs Cells) Map() map[string]WireCell {
	if cs == nil {
		return nil
	}
	m := make(map[string]WireCell, len(cs))
	for _, c := range cs {
		m[c.Field] = c.WireCell
	}
	return m
}

// index is where field is in cs, or would be, and whether it is.
func (cs Cells) index(field string) (int, bool) {
	if len(cs) <= 8 {
		for i, c := range cs {
			if c.Field >= field {
				return i, c.Field == field
			}
		}
		return len(cs), false
	}
	i := sort.Search(len(cs), func(i int) bool { return cs[i].Field >= field })
	return i, i < len(cs) && cs[i].Field == field
}

// Get returns field's version.
func (cs Cells) Get(field string) (WireCell, bool) {
	if i, ok := cs.index(field); ok {
		return cs[i].WireCell, true
	}
	return WireCell{}, false
}

// With returns a copy of cs with field's version w (added or replaced).
func (cs Cells) With(field string, w WireCell) Cells {
	i, ok := cs.index(field)
	out := make(Cells, 0, len(cs)+1)
	out = append(out, cs[:i]...)
	out = append(out, FieldCell{Field: field, WireCell: w})
	if ok {
		i++
	}
	return append(out, cs[i:]...)
}

// inOrder reports whether cs holds each field once, in order, as every
// Cells must.
func (cs Cells) inOrder() bool {
	for i := 1; i < len(cs); i++ {
		if cs[i-1].Field >= cs[i].Field {
			return false
		}
	}
	return true
}

// errCellsOrder refuses Cells not in order (a caller's mistake: CellsOf
// and the decoders make them in order).
var errCellsOrder = errors.New("a change's cells are not in field order, each once")

// sortCells puts cs in order, the later of a field named twice kept.
func sortCells(cs Cells) Cells {
	if cs.inOrder() {
		return cs
	}
	slices.SortStableFunc(cs, func(a, b FieldCell) int { return strings.Compare(a.Field, b.Field) })
	out := cs[:0]
	for i, c := range cs {
		if i+1 < len(cs) && cs[i+1].Field == c.Field {
			continue
		}
		out = append(out, c)
	}
	return out
}

// MarshalJSON encodes cs as encoding/json encodes the map of them.
func (cs Cells) MarshalJSON() ([]byte, error) {
	if cs == nil {
		return []byte("null"), nil
	}
	return appendCells(nil, sortCells(slices.Clone(cs))), nil
}

// UnmarshalJSON decodes cs as encoding/json decodes into the map of
// them: null makes it nil, an object adds its fields to those cs holds
// (a field named twice: the later wins).
func (cs *Cells) UnmarshalJSON(data []byte) error {
	m := cs.Map()
	if err := json.Unmarshal(data, &m); err != nil {
		return err
	}
	*cs = CellsOf(m)
	return nil
}
