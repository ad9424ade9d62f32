package cache

import (
	"errors"
	"fmt"

	"github.com/meshbox/meshbox/internal/boltfile"
)

// Errors returned by Open.
var (
	// ErrLocked is returned when another process holds the cache file.
	ErrLocked = errors.New("cache file is in use by another meshbox process")
	// ErrCorrupt is returned (wrapped in a *CorruptError) when the cache
	// file or one of its snapshots fails to open or verify.
	ErrCorrupt = errors.New("cache file is damaged")
)

// Errors returned by Store reads.
var (
	// ErrNoSnapshot is returned when the store holds no matching snapshot.
	ErrNoSnapshot = errors.New("no cached snapshot")
	// ErrClosed is returned by operations on a closed Store or Manager.
	ErrClosed = errors.New("closed")
)

// Errors a Source returns.
var (
	// ErrSourceNewer is wrapped by a Source's load error when the source
	// (the mesh database) has a schema newer than this binary knows. The
	// manager keeps running from the cached bindings and says so in its
	// status warning until a load succeeds.
	ErrSourceNewer = errors.New("the mesh database's schema is newer than this meshbox")
)

// Errors returned by name validation.
var (
	// ErrInvalidName is wrapped by every *NameError.
	ErrInvalidName = errors.New("invalid name")
)

// Errors returned by NewManager.
var (
	// ErrConfig is wrapped by every configuration error of NewManager.
	ErrConfig = errors.New("invalid bindings manager config")
)

// LockedError reports that the data directory is used by another process.
type LockedError struct {
	Dir string // the data directory holding the cache file
}

func (e *LockedError) Error() string {
	return fmt.Sprintf("data directory %s is in use by another meshbox process", e.Dir)
}

// Unwrap returns ErrLocked.
func (e *LockedError) Unwrap() error { return ErrLocked }

// CorruptError reports a damaged cache file and why it was judged damaged.
type CorruptError struct {
	Path   string // the damaged file
	Reason string // what failed: open, check, decode, hash
	Err    error  // the underlying error, if any
}

func (e *CorruptError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("cache file %s is damaged (%s): %v", e.Path, e.Reason, e.Err)
	}
	return fmt.Sprintf("cache file %s is damaged (%s)", e.Path, e.Reason)
}

// Unwrap returns ErrCorrupt and the underlying error.
func (e *CorruptError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrCorrupt, e.Err}
	}
	return []error{ErrCorrupt}
}

// NameError reports a name or value that fails validation.
type NameError struct {
	Field  string // which input: "node name", "module name", "setting key", ...
	Value  string // the rejected input (truncated for display)
	Reason string // what rule it breaks
	Err    error  // for a name: the *names.Error that rejected it
}

func (e *NameError) Error() string {
	v := e.Value
	if len(v) > 80 {
		v = v[:80] + "..."
	}
	return fmt.Sprintf("invalid %s %q: %s", e.Field, v, e.Reason)
}

// Unwrap returns ErrInvalidName and, for a name, the *names.Error.
func (e *NameError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrInvalidName, e.Err}
	}
	return []error{ErrInvalidName}
}

// NewerFormatError is returned by Open for a cache file written in a newer
// format than this binary reads (by a newer meshbox, before a downgrade).
// It names the file and both formats; the file is left untouched.
type NewerFormatError = boltfile.NewerFormatError
