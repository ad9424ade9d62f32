package outbox

import (
	"errors"

	"github.com/meshbox/meshbox/internal/boltfile"
)

// Errors returned by Open.
var (
	// ErrLocked means another process holds the outbox file. Open returns
	// it wrapped in a *LockedError.
	ErrLocked = errors.New("outbox is in use by another meshbox process")
)

// Errors returned by Reserve, passed to the done callbacks of changes, and
// returned by Wait, Sync and Close.
var (
	// ErrFull is returned by Reserve when the record would take the outbox
	// past Options.MaxBytes; the record must not be put.
	ErrFull = errors.New("outbox full")
	// ErrClosed is passed to the done callback of a change queued after
	// Close began, or still waiting for room in the queue then.
	ErrClosed = errors.New("outbox closed")
	// ErrStuck is returned (wrapped) by Close when the writer did not
	// finish its last commit within Options.CloseWait: the disk hangs.
	// What was not committed may be lost.
	ErrStuck = errors.New("outbox writer stuck")
)

// LockedError is returned by Open when another process holds the outbox
// file. Dir is the directory of the file: the data directory of the node
// that holds it.
type LockedError struct {
	Dir string
}

func (e *LockedError) Error() string {
	return "data directory " + e.Dir + " is in use by another meshbox process"
}

// Unwrap returns ErrLocked.
func (e *LockedError) Unwrap() error { return ErrLocked }

// NewerFormatError is returned by Open when the file was written in a
// newer format than this binary reads (by a newer meshbox, before a
// downgrade). It names the file and both formats; the file and the records
// in it are left untouched.
type NewerFormatError = boltfile.NewerFormatError
