package names

import (
	"errors"
	"fmt"
)

// ErrInvalid is wrapped by every *Error.
var ErrInvalid = errors.New("invalid name")

// The rule a rejected name breaks; every *Error wraps exactly one.
var (
	// ErrEmpty means the name is empty.
	ErrEmpty = errors.New("empty")
	// ErrTooLong means the name (or one DNS label of a public name) is
	// longer than its kind allows.
	ErrTooLong = errors.New("too long")
	// ErrByte means a byte is outside the kind's alphabet.
	ErrByte = errors.New("byte not allowed")
	// ErrToken means a dot-separated name has an empty token or label
	// (a leading, trailing or doubled '.').
	ErrToken = errors.New("empty token")
	// ErrStart means the name, or a label of a public name, starts (or for
	// a label, ends) with a byte it may not start or end with.
	ErrStart = errors.New("bad first or last byte")
)

// Error reports a name that breaks the rules of its kind.
type Error struct {
	Kind   Kind   // what the name was meant to be
	Name   string // the rejected name
	Pos    int    // byte offset of the fault in Name; -1 when the whole name is at fault
	Reason string // what is wrong, for people: "byte 3 (0xc3) is not in [A-Za-z0-9_.-]"
	Err    error  // the rule broken: ErrEmpty, ErrTooLong, ErrByte, ErrToken or ErrStart
}

// maxShown bounds how much of a rejected name an error message repeats.
const maxShown = 80

func (e *Error) Error() string {
	n := e.Name
	more := ""
	if len(n) > maxShown {
		n, more = n[:maxShown], "..."
	}
	return fmt.Sprintf("%s %q%s: %s", e.Kind, n, more, e.Reason)
}

// Unwrap returns ErrInvalid and the rule broken.
func (e *Error) Unwrap() []error { return []error{ErrInvalid, e.Err} }
