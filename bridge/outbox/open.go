package outbox

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/meshbox/meshbox/internal/boltfile"
	bolt "go.etcd.io/bbolt"
)

// Open opens or creates the outbox at path (and its directory, mode 0700)
// and starts its writer goroutine, which exits after Close. A file locked
// by another process is a *LockedError; a file of a newer format (written
// by a newer meshbox) is a *NewerFormatError and stays untouched; a
// damaged file (see boltfile.Open: every page is checked, then the
// outbox's layout) is set aside (renamed with a .corrupt-<time> suffix),
// reported by Warning, and replaced by an empty outbox.
func Open(path string, opts Options) (*Outbox, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	closeWait := opts.CloseWait
	if closeWait <= 0 {
		closeWait = defaultCloseWait
	}
	o := &Outbox{path: path, log: log, maxBytes: opts.MaxBytes,
		onCommit: opts.OnCommit, beforeCommit: opts.BeforeCommit, closeWait: closeWait,
		w: writerLink{ops: make(chan writeOp, queueLen), quit: make(chan struct{}), closing: make(chan struct{}),
			done: make(chan struct{})}}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	err := o.open()
	var ce *boltfile.CorruptError
	if errors.As(err, &ce) {
		moved, qerr := boltfile.SetAside(path, time.Now())
		if qerr != nil {
			return nil, fmt.Errorf("outbox %s is damaged (%v) and cannot be set aside: %w", path, ce, qerr)
		}
		o.warning = fmt.Sprintf("outbox file was damaged (%v); set aside as %s, its messages were not sent", ce, moved)
		log.Error("outbox damaged, set aside", "path", path, "moved_to", moved, "err", ce.Error())
		err = o.open()
	}
	if err != nil {
		return nil, err
	}
	go o.writer() // exits after Close, once what was queued before it is committed
	return o, nil
}

// open opens the file through boltfile (lock timeout, contained panics,
// every page and the layout checked) and scans it.
func (o *Outbox) open() error {
	db, err := boltfile.Open(o.path, boltfile.Options{LockTimeout: lockTimeout,
		Verify: func(tx *bolt.Tx) error { return verifyLayout(tx, o.path) }})
	var le *boltfile.LockedError
	switch {
	case errors.As(err, &le):
		return &LockedError{Dir: filepath.Dir(o.path)}
	case err != nil:
		var ce *boltfile.CorruptError
		if errors.As(err, &ce) {
			return err
		}
		return fmt.Errorf("open outbox: %w", err)
	}
	o.db = db
	if err := boltfile.Contain(o.path, o.scan); err != nil {
		_ = db.Close()
		o.db = nil
		return err
	}
	return nil
}

// format is the outbox file's format: its layout and the encoding of its
// records (internal/boltfile records it in the meta bucket). Outbox files
// from before formats were recorded are format 1. An older file is
// migrated by migrations at open; a newer one is refused with a
// *NewerFormatError, never read.
const format = 1

// migrations upgrade older outbox files, one format at a time.
var migrations []boltfile.Migration

// verifyLayout checks that the file is an outbox of a format this binary
// reads (a newer one is a *NewerFormatError, before any record is judged):
// only the outbox's buckets at the top, no nested buckets among the
// records, and a published mark of 8 bytes. Undecodable records are not
// damage: scan moves them to the quarantine bucket.
func verifyLayout(tx *bolt.Tx, path string) error {
	if err := boltfile.CheckFormat(tx, path, "outbox", 1, format); err != nil {
		return err
	}
	return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
		switch string(name) {
		case string(bucketRecords):
			return b.ForEach(func(k, v []byte) error {
				if v == nil {
					return fmt.Errorf("records: nested bucket %q", k)
				}
				return nil
			})
		case string(bucketMeta):
			if v := b.Get(keyPublished); v != nil && len(v) != 8 {
				return fmt.Errorf("meta: published mark of %d bytes, want 8", len(v))
			}
			return nil
		case string(bucketQuarantine):
			return nil
		default:
			return fmt.Errorf("unknown bucket %q: not an outbox", name)
		}
	})
}

// scan creates the buckets, moves undecodable records to the quarantine
// bucket, and loads the counters.
func (o *Outbox) scan() error {
	var bad int
	err := o.db.Update(func(tx *bolt.Tx) error {
		if _, err := boltfile.Upgrade(tx, o.path, "outbox", 1, format, migrations); err != nil {
			return err
		}
		recs, err := tx.CreateBucketIfNotExists(bucketRecords)
		if err != nil {
			return err
		}
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if v := meta.Get(keyPublished); len(v) == 8 {
			o.c.published = binary.BigEndian.Uint64(v)
		}
		var quarantine [][2][]byte
		c := recs.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if len(k) != 8 {
				quarantine = append(quarantine, [2][]byte{append([]byte(nil), k...), append([]byte(nil), v...)})
				continue
			}
			seq := binary.BigEndian.Uint64(k)
			r, derr := decodeRecord(seq, v)
			if derr != nil {
				quarantine = append(quarantine, [2][]byte{append([]byte(nil), k...), append([]byte(nil), v...)})
				continue
			}
			if r.Kind != Local {
				o.meshAtOpen++
			}
			o.c.depth++
			o.c.bytes += int64(len(v))
			o.c.lastSeq = max(o.c.lastSeq, seq)
		}
		if len(quarantine) > 0 {
			q, err := tx.CreateBucketIfNotExists(bucketQuarantine)
			if err != nil {
				return err
			}
			for _, kv := range quarantine {
				if err := q.Put(kv[0], kv[1]); err != nil {
					return err
				}
				if err := recs.Delete(kv[0]); err != nil {
					return err
				}
			}
			bad = len(quarantine)
		}
		return nil
	})
	var nf *NewerFormatError
	if errors.As(err, &nf) {
		return err
	}
	if err != nil {
		return &boltfile.CorruptError{Path: o.path, Reason: "scan", Err: err}
	}
	if bad > 0 {
		o.warning = fmt.Sprintf("%d undecodable outbox records moved to the quarantine bucket", bad)
		o.log.Error("outbox records quarantined", "count", bad, "path", o.path)
	}
	return nil
}
