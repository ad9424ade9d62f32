package rows

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Cell is one version of one field of a row: its value (none when the
// field was deleted: a tombstone), when it was written (Stamp) and by
// which node. Fields converge on their own: of two versions, the one
// with the larger stamp wins, and of equal stamps (two nodes' clocks in
// the same millisecond and counter) the larger node name.
type Cell struct {
	Stamp   Stamp
	Node    string
	Deleted bool
	Value   []byte
}

// Wins reports whether c replaces o (o is the version held).
func (c Cell) Wins(o Cell) bool {
	if c.Stamp != o.Stamp {
		return c.Stamp > o.Stamp
	}
	return c.Node > o.Node
}

// Limits of names and sizes.
const (
	MaxTableLen = 64
	MaxRowLen   = 200
	MaxFieldLen = 64
	// MaxValueLen is the largest value of a field; MaxRowBytes the most a
	// write of one row may carry (its fields' names and values). Bytes
	// belong in blobs; rows hold status, ownership and references.
	MaxValueLen = 16 << 10
	MaxRowBytes = 64 << 10
	// MaxFields is the most fields one write may name.
	MaxFields = 64
)

// The characters of names: checked byte by byte (every write checks a
// row and its fields; a regular expression cost more than the rest of
// the check).
func nameChars(s string, first, rest func(c byte) bool) bool {
	for i := 0; i < len(s); i++ {
		ok := rest
		if i == 0 {
			ok = first
		}
		if !ok(s[i]) {
			return false
		}
	}
	return true
}

func isLowerDigit(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }
func isAlnum(c byte) bool      { return isLowerDigit(c) || c >= 'A' && c <= 'Z' }
func isTableChar(c byte) bool  { return isLowerDigit(c) || c == '_' || c == '-' }
func isFieldChar(c byte) bool  { return isAlnum(c) || c == '_' || c == '-' }
func isRowFirst(c byte) bool   { return isFieldChar(c) || c == '=' }
func isRowChar(c byte) bool    { return isRowFirst(c) || c == '.' }

// ErrBadInput wraps every refusal of a name, a size or a request.
var ErrBadInput = errors.New("bad input")

// ValidTable checks a table name: lowercase letters, digits, '_' and '-',
// starting with a letter or digit, at most MaxTableLen bytes.
func ValidTable(t string) error {
	if len(t) == 0 || len(t) > MaxTableLen || !nameChars(t, isLowerDigit, isTableChar) {
		return fmt.Errorf("%w: table %q: a table name is 1 to %d lowercase letters, digits, '_' or '-', starting with a letter or digit", ErrBadInput, t, MaxTableLen)
	}
	return nil
}

// ValidRow checks a row key: letters, digits, '_', '-', '=' and '.', not
// starting with '.', at most MaxRowLen bytes.
func ValidRow(r string) error {
	if len(r) == 0 || len(r) > MaxRowLen || !nameChars(r, isRowFirst, isRowChar) {
		return fmt.Errorf("%w: row %q: a row key is 1 to %d letters, digits, '_', '-', '=' or '.', not starting with '.'", ErrBadInput, r, MaxRowLen)
	}
	return nil
}

// ValidField checks a field name: letters, digits, '_' and '-', at most
// MaxFieldLen bytes.
func ValidField(f string) error {
	if len(f) == 0 || len(f) > MaxFieldLen || !nameChars(f, isFieldChar, isFieldChar) {
		return fmt.Errorf("%w: field %q: a field name is 1 to %d letters, digits, '_' or '-'", ErrBadInput, f, MaxFieldLen)
	}
	return nil
}

// CheckWrite checks a write of row (set: new values; del: fields
// deleted) against the limits of one write: the names, at least one and
// at most MaxFields fields, no field both set and deleted, values of at
// most MaxValueLen and MaxRowBytes in all.
func CheckWrite(row string, set map[string][]byte, del []string) error {
	if err := ValidRow(row); err != nil {
		return err
	}
	if len(set)+len(del) == 0 {
		return fmt.Errorf("%w: a write sets or deletes at least one field", ErrBadInput)
	}
	if len(set)+len(del) > MaxFields {
		return fmt.Errorf("%w: %d fields in one write, at most %d", ErrBadInput, len(set)+len(del), MaxFields)
	}
	size := len(row)
	for f, v := range set {
		if err := ValidField(f); err != nil {
			return err
		}
		if len(v) > MaxValueLen {
			return fmt.Errorf("%w: field %s: value of %d bytes, at most %d (bytes belong in a blob; a row holds its reference)", ErrBadInput, f, len(v), MaxValueLen)
		}
		size += len(f) + len(v)
	}
	for _, f := range del {
		if err := ValidField(f); err != nil {
			return err
		}
		if _, both := set[f]; both {
			return fmt.Errorf("%w: field %s both set and deleted", ErrBadInput, f)
		}
		size += len(f)
	}
	if size > MaxRowBytes {
		return fmt.Errorf("%w: a write of %d bytes, at most %d", ErrBadInput, size, MaxRowBytes)
	}
	return nil
}

// encode appends c's stored form: stamp, flags, node, value.
func (c Cell) encode(dst []byte) []byte {
	dst = binary.BigEndian.AppendUint64(dst, uint64(c.Stamp))
	var flags byte
	if c.Deleted {
		flags = 1
	}
	dst = append(dst, flags, byte(len(c.Node)))
	dst = append(dst, c.Node...)
	return append(dst, c.Value...)
}

// decodeCell reads a stored cell. The value aliases b.
func decodeCell(b []byte) (Cell, error) {
	if len(b) < 10 || len(b) < 10+int(b[9]) {
		return Cell{}, errors.New("stored cell too short")
	}
	c := Cell{Stamp: Stamp(binary.BigEndian.Uint64(b)), Deleted: b[8]&1 != 0}
	n := int(b[9])
	c.Node = string(b[10 : 10+n])
	if !c.Deleted {
		c.Value = b[10+n:]
	}
	return c, nil
}
