package programs

import "errors"

// Errors of Store.Get, Store.Put and Store.Remove.
var (
	// ErrNotFound means no program of that name is defined.
	ErrNotFound = errors.New("no such program")
	// ErrInvalid is wrapped by every error about a program's definition.
	ErrInvalid = errors.New("invalid program")
)
