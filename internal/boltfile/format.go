package boltfile

import (
	"fmt"
	"strconv"

	bolt "go.etcd.io/bbolt"
)

// Every meshbox bbolt file records the version of its layout (its format)
// as a decimal number under key "format" of bucket "meta". A binary reads
// the formats up to its own: an older file is migrated forward in the
// transaction that opens it for writing; a newer one is refused with a
// *NewerFormatError, never read as if it were the format this binary knows.

var (
	bucketMeta = []byte("meta")
	keyFormat  = []byte("format")
)

// NewerFormatError is returned when a file was written in a format newer
// than this binary reads: by a newer meshbox, before a downgrade. Open and
// Check pass it through as it is (it is not damage: the file is not set
// aside).
type NewerFormatError struct {
	Path      string
	What      string // "cache", "outbox"
	Format    int    // the file's format
	Supported int    // the newest format this binary reads
}

func (e *NewerFormatError) Error() string {
	return fmt.Sprintf("%s %s has format %d, written by a newer meshbox; this meshbox reads formats up to %d: "+
		"run the newer meshbox again (or move the file aside, losing what it holds)", e.What, e.Path, e.Format, e.Supported)
}

// Format returns the format recorded in tx's file: 0 when the file records
// none (a new, empty file), legacy when the meta bucket exists without a
// format (a file from before formats were recorded). A format that is not
// a positive number is a *CorruptError.
func Format(tx *bolt.Tx, path string, legacy int) (int, error) {
	var v []byte
	if meta := tx.Bucket(bucketMeta); meta != nil {
		v = meta.Get(keyFormat)
	}
	if v == nil {
		if k, _ := tx.Cursor().First(); k == nil {
			return 0, nil // no bucket at all: a new file
		}
		return legacy, nil
	}
	f, err := strconv.Atoi(string(v))
	if err != nil || f <= 0 {
		return 0, &CorruptError{Path: path, Reason: fmt.Sprintf("format %.20q is not a positive number", v)}
	}
	return f, nil
}

// CheckFormat returns a *NewerFormatError when the file's format (see
// Format) is newer than supported. Layout checks call it first, so a newer
// file is refused before its records are judged.
func CheckFormat(tx *bolt.Tx, path, what string, legacy, supported int) error {
	f, err := Format(tx, path, legacy)
	if err != nil {
		return err
	}
	if f > supported {
		return &NewerFormatError{Path: path, What: what, Format: f, Supported: supported}
	}
	return nil
}

// Migration upgrades a file from format From to From+1 inside the opening
// write transaction.
type Migration struct {
	From int
	Step func(tx *bolt.Tx) error
}

// Upgrade brings the file to format current in tx: a new file, or one of
// the legacy format that records none, is stamped current; an older one runs every migration from its format on, in order,
// then is stamped current; a newer one is a *NewerFormatError. It returns
// the format the file had (0 for a new file). Each format below current
// needs its migration (From = that format); a missing one is an error, so
// a format bump without its migration cannot go unnoticed.
func Upgrade(tx *bolt.Tx, path, what string, legacy, current int, migrations []Migration) (int, error) {
	from, err := Format(tx, path, legacy)
	if err != nil {
		return 0, err
	}
	if from > current {
		return from, &NewerFormatError{Path: path, What: what, Format: from, Supported: current}
	}
	if from > 0 {
		for f := from; f < current; f++ {
			i := -1
			for j, m := range migrations {
				if m.From == f {
					i = j
				}
			}
			if i < 0 {
				return from, fmt.Errorf("%s %s: no migration from format %d", what, path, f)
			}
			if err := migrations[i].Step(tx); err != nil {
				return from, fmt.Errorf("%s %s: migrate format %d to %d: %w", what, path, f, f+1, err)
			}
		}
	}
	meta := tx.Bucket(bucketMeta)
	if from == current && meta != nil && meta.Get(keyFormat) != nil {
		return from, nil
	}
	meta, err = tx.CreateBucketIfNotExists(bucketMeta)
	if err != nil {
		return from, err
	}
	return from, meta.Put(keyFormat, []byte(strconv.Itoa(current)))
}
