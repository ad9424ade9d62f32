// Package boltfile opens meshbox's bbolt files (the bindings cache and the
// outbox) one way: with a lock timeout, so a second process is refused
// instead of blocking forever; with bbolt's panics and memory faults on
// damaged pages contained and turned into errors; and with every page
// checked (size against the meta page, every bucket walked, bbolt's own
// tx.Check, then the caller's layout check) before the file is used. A
// damaged file is set aside with SetAside, never deleted. Every file
// records its format (format.go): older formats are migrated forward,
// newer ones refused with a *NewerFormatError.
package boltfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime/debug"
	"time"

	bolt "go.etcd.io/bbolt"
)

// LockedError is returned by Open when another process holds the file.
type LockedError struct {
	Path string
}

func (e *LockedError) Error() string {
	return fmt.Sprintf("%s is in use by another process", e.Path)
}

// CorruptError is returned by Open and Contain when the file is damaged.
type CorruptError struct {
	Path   string
	Reason string
	Err    error
}

func (e *CorruptError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s is damaged: %s: %v", e.Path, e.Reason, e.Err)
	}
	return fmt.Sprintf("%s is damaged: %s", e.Path, e.Reason)
}

func (e *CorruptError) Unwrap() error { return e.Err }

// Options tune Open.
type Options struct {
	// LockTimeout bounds the wait for the file lock; zero means 1s.
	LockTimeout time.Duration
	// ReadOnly opens the file without writing (a shared lock); the file
	// must exist.
	ReadOnly bool
	// Verify, when set, checks the caller's layout inside the verifying
	// read transaction, after bbolt's own check. An error it returns that
	// is not already a *CorruptError or a *NewerFormatError is wrapped in
	// a *CorruptError.
	Verify func(tx *bolt.Tx) error
}

// Open opens or creates the bbolt file at path (mode 0600) and verifies it.
// Errors: *LockedError when another process holds the file; *CorruptError
// for damage of any kind (an empty file, a failed open, a panic or memory
// fault, a failed check); operating system errors (*fs.PathError) as they
// are.
func Open(path string, opts Options) (db *bolt.DB, err error) {
	if opts.LockTimeout <= 0 {
		opts.LockTimeout = time.Second
	}
	fi, statErr := os.Stat(path)
	switch {
	case statErr == nil && fi.Mode().IsRegular() && fi.Size() == 0:
		return nil, &CorruptError{Path: path, Reason: "empty file"}
	case statErr != nil && opts.ReadOnly:
		return nil, statErr
	}
	var file *os.File
	bopts := &bolt.Options{
		Timeout:  opts.LockTimeout,
		ReadOnly: opts.ReadOnly,
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			f, err := os.OpenFile(name, flag, perm)
			file = f
			return f, err
		},
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if db != nil {
				_ = db.Close()
			} else if file != nil {
				_ = file.Close() // releases the lock bbolt took
			}
			db, err = nil, &CorruptError{Path: path, Reason: "bbolt panic", Err: fmt.Errorf("%v", r)}
		}
	}()
	db, err = bolt.Open(path, 0o600, bopts)
	if err != nil {
		var pathErr *fs.PathError
		switch {
		case errors.Is(err, bolt.ErrTimeout):
			return nil, &LockedError{Path: path}
		case errors.As(err, &pathErr):
			return nil, err
		default:
			return nil, &CorruptError{Path: path, Reason: "open", Err: err}
		}
	}
	if err := Check(db, path, opts.Verify); err != nil {
		_ = db.Close()
		return nil, err
	}
	return db, nil
}

// Check verifies an open file: its size against the meta page, every
// reachable page touched (where faults become panics that are contained
// here), bbolt's structural check, then the caller's layout check (nil: none).
// Damage comes back as a *CorruptError. Open runs it; a long-lived owner
// can run it again.
func Check(db *bolt.DB, path string, layout func(*bolt.Tx) error) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	return Contain(path, func() error {
		return db.View(func(tx *bolt.Tx) error {
			if tx.Size() > fi.Size() {
				return &CorruptError{Path: path, Reason: fmt.Sprintf("truncated: %d bytes, database needs %d", fi.Size(), tx.Size())}
			}
			if err := tx.ForEach(func(_ []byte, b *bolt.Bucket) error { return walk(b) }); err != nil {
				return &CorruptError{Path: path, Reason: "walk", Err: err}
			}
			var first error
			for cerr := range tx.Check() { // drained fully so bbolt's goroutine ends
				if first == nil {
					first = cerr
				}
			}
			if first != nil {
				return &CorruptError{Path: path, Reason: "check", Err: first}
			}
			if layout == nil {
				return nil
			}
			if err := layout(tx); err != nil {
				var ce *CorruptError
				var nf *NewerFormatError
				if errors.As(err, &ce) || errors.As(err, &nf) {
					return err
				}
				return &CorruptError{Path: path, Reason: "layout", Err: err}
			}
			return nil
		})
	})
}

func walk(b *bolt.Bucket) error {
	return b.ForEach(func(k, v []byte) error {
		if v == nil {
			if nb := b.Bucket(k); nb != nil {
				return walk(nb)
			}
		}
		return nil
	})
}

// Contain runs fn, turning a bbolt panic or a memory fault on a damaged page
// of the file at path into a *CorruptError.
func Contain(path string, fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = &CorruptError{Path: path, Reason: "bbolt panic", Err: fmt.Errorf("%v", r)}
		}
	}()
	return fn()
}

// SetAside renames a damaged file to <path>.corrupt-<UTC time>[-n] and
// returns the new path. Nothing is deleted: an operator can inspect it.
func SetAside(path string, now time.Time) (string, error) {
	base := path + ".corrupt-" + now.UTC().Format("20060102T150405Z")
	moved := base
	for i := 1; ; i++ {
		if _, err := os.Lstat(moved); errors.Is(err, fs.ErrNotExist) {
			break
		}
		moved = fmt.Sprintf("%s-%d", base, i)
	}
	if err := os.Rename(path, moved); err != nil {
		return "", err
	}
	return moved, nil
}
