package codec

import (
	"errors"
)

var (
	// ErrBadInput means a message or a name was malformed.
	ErrBadInput = errors.New("bad input")
)
