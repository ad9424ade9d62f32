package cache

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/meshbox/meshbox/internal/boltfile"
)

// Defaults for StoreOptions.
const (
	DefaultKeep        = 10
	DefaultLockTimeout = time.Second
)

// storeFormat is the cache file's layout version (internal/boltfile
// records it in the meta bucket). A file of an older format is migrated by
// storeMigrations when opened for writing; a newer one is refused with a
// *NewerFormatError. Cache files have recorded format 1 from the
// start.
const storeFormat = 1

// storeMigrations upgrade older cache files, one format at a time.
var storeMigrations []boltfile.Migration

var (
	bucketSnapshots = []byte("snapshots")
)

// StoreOptions configures Open.
type StoreOptions struct {
	// Keep is how many distinct snapshots are kept (default 10).
	Keep int
	// LockTimeout bounds the wait for the file lock (default 1s).
	LockTimeout time.Duration
	// ReadOnly opens an existing file for reading only (meshbox cache):
	// a damaged file is reported, never moved aside.
	ReadOnly bool
	// NoQuarantine returns a *CorruptError for a damaged file instead of
	// moving it aside and starting a fresh one.
	NoQuarantine bool
	// Now is the clock used to name quarantined files (default time.Now).
	Now func() time.Time
}

// Store keeps versioned snapshots of a node's bindings in a bbolt file
// (mode 0600). Its methods are safe for concurrent use; snapshots it
// returns are copies owned by the caller.
type Store struct {
	path        string
	keep        int
	readOnly    bool
	quarantined string
	damage      error

	mu sync.RWMutex // guards db against Close
	db *bolt.DB     // nil once closed
}

// SnapshotMeta describes one stored snapshot without its bindings.
type SnapshotMeta struct {
	Seq         uint64    `json:"seq"` // position in the store, increasing
	Revision    int64     `json:"revision"`
	Hash        string    `json:"hash"`
	FetchedAt   time.Time `json:"fetched_at"`
	Source      string    `json:"source"`
	Node        string    `json:"node"`
	Nodes       int       `json:"nodes"`
	Settings    int       `json:"settings"`
	Assignments int       `json:"assignments"`
	Overrides   int       `json:"overrides"`
	Grants      int       `json:"grants"`
}

// Open opens (creating if needed) the cache file at path. A file held by
// another process gives a *LockedError. A file that fails to open or
// verify (bad meta pages, wrong magic, truncation, damaged pages, records
// that do not decode or match their hash; bbolt panics and memory faults
// included) is renamed to path+".corrupt-<UTC timestamp>" and a fresh file
// is created in its place; Quarantined then names the moved file. With
// ReadOnly or NoQuarantine the damage is returned as a *CorruptError instead.
// A file of a newer format (written by a newer meshbox) is refused with a
// *NewerFormatError and left untouched; an older one is migrated.
func Open(path string, opts StoreOptions) (*Store, error) {
	if opts.Keep <= 0 {
		opts.Keep = DefaultKeep
	}
	if opts.LockTimeout <= 0 {
		opts.LockTimeout = DefaultLockTimeout
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Store{path: path, keep: opts.Keep, readOnly: opts.ReadOnly}
	if !opts.ReadOnly {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("open cache: %w", err)
		}
	}
	db, err := openChecked(path, opts)
	var corrupt *CorruptError
	if errors.As(err, &corrupt) && !opts.ReadOnly && !opts.NoQuarantine {
		moved, qerr := boltfile.SetAside(path, opts.Now())
		if qerr != nil {
			return nil, fmt.Errorf("open cache: set aside damaged file: %w (damage: %v)", qerr, err)
		}
		s.quarantined, s.damage = moved, err
		db, err = openChecked(path, opts)
	}
	if err != nil {
		return nil, err
	}
	if !opts.ReadOnly {
		if err := os.Chmod(path, 0o600); err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("open cache: %w", err)
		}
		err := db.Update(func(tx *bolt.Tx) error {
			if _, err := boltfile.Upgrade(tx, path, "cache", 1, storeFormat, storeMigrations); err != nil {
				return err
			}
			_, err := tx.CreateBucketIfNotExists(bucketSnapshots)
			return err
		})
		if err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("open cache: %w", err)
		}
	}
	s.db = db
	return s, nil
}

// Path returns the cache file's path.
func (s *Store) Path() string { return s.path }

// Quarantined returns where a damaged cache file was moved by Open, or ""
// if the file was sound.
func (s *Store) Quarantined() string { return s.quarantined }

// Damage returns why Open set the old file aside (a *CorruptError), or nil.
func (s *Store) Damage() error { return s.damage }

// Close closes the file. It is idempotent.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.db == nil {
		return nil
	}
	err := s.db.Close()
	s.db = nil
	if err != nil {
		return fmt.Errorf("close cache: %w", err)
	}
	return nil
}

// Put stores snap. A snapshot with the same content (hash and node) as the
// newest one replaces it, refreshing its revision, fetch time and source;
// anything else is appended, and the oldest snapshots beyond Keep are
// dropped. The hash is computed when empty and checked otherwise.
func (s *Store) Put(snap Snapshot) error {
	snap.Bindings = snap.Bindings.Normalize()
	h := hashNormalized(snap.Bindings)
	if snap.Hash == "" {
		snap.Hash = h
	} else if snap.Hash != h {
		return fmt.Errorf("store snapshot: hash %s does not match its bindings (%s)", ShortHash(snap.Hash), ShortHash(h))
	}
	data, err := json.Marshal(snap)
	if err != nil {
		return fmt.Errorf("store snapshot: %w", err)
	}
	return s.update("store snapshot", func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSnapshots)
		if b == nil {
			return &CorruptError{Path: s.path, Reason: "snapshots bucket missing"}
		}
		if k, v := b.Cursor().Last(); k != nil {
			var last snapshotHeader
			if json.Unmarshal(v, &last) == nil && last.Hash == snap.Hash && last.Bindings.Node == snap.Bindings.Node {
				return b.Put(k, data)
			}
		}
		seq, err := b.NextSequence()
		if err != nil {
			return err
		}
		if err := b.Put(seqKey(seq), data); err != nil {
			return err
		}
		excess := -s.keep
		c := b.Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			excess++
		}
		for k, _ := c.First(); k != nil && excess > 0; k, _ = c.First() {
			if err := b.Delete(k); err != nil {
				return err
			}
			excess--
		}
		return nil
	})
}

// Latest returns the newest snapshot, or ErrNoSnapshot.
func (s *Store) Latest() (Snapshot, error) {
	var snap Snapshot
	err := s.view("read cached snapshot", func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSnapshots)
		if b == nil {
			return ErrNoSnapshot
		}
		k, v := b.Cursor().Last()
		if k == nil {
			return ErrNoSnapshot
		}
		var err error
		snap, err = s.decode(k, v)
		return err
	})
	return snap, err
}

// Get returns the newest stored snapshot at revision rev, or ErrNoSnapshot.
func (s *Store) Get(rev int64) (Snapshot, error) {
	var snap Snapshot
	err := s.view("read cached snapshot", func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSnapshots)
		if b == nil {
			return ErrNoSnapshot
		}
		c := b.Cursor()
		for k, v := c.Last(); k != nil; k, v = c.Prev() {
			var h snapshotHeader
			if err := json.Unmarshal(v, &h); err != nil {
				return &CorruptError{Path: s.path, Reason: fmt.Sprintf("snapshot %d does not decode", binary.BigEndian.Uint64(k)), Err: err}
			}
			if h.Revision == rev {
				var err error
				snap, err = s.decode(k, v)
				return err
			}
		}
		return fmt.Errorf("%w at revision %d", ErrNoSnapshot, rev)
	})
	return snap, err
}

// History describes the stored snapshots, newest first.
func (s *Store) History() ([]SnapshotMeta, error) {
	var out []SnapshotMeta
	err := s.view("read cache history", func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSnapshots)
		if b == nil {
			return nil
		}
		c := b.Cursor()
		for k, v := c.Last(); k != nil; k, v = c.Prev() {
			snap, err := s.decode(k, v)
			if err != nil {
				return err
			}
			b := snap.Bindings
			out = append(out, SnapshotMeta{
				Seq: binary.BigEndian.Uint64(k), Revision: snap.Revision, Hash: snap.Hash,
				FetchedAt: snap.FetchedAt, Source: snap.Source, Node: b.Node,
				Nodes: len(b.Nodes), Settings: len(b.Settings), Assignments: len(b.Assignments),
				Overrides: len(b.Overrides), Grants: len(b.Grants),
			})
		}
		return nil
	})
	return out, err
}

// Verify re-checks the whole file: bbolt's page structure and every
// snapshot's encoding and hash. Damage is returned as a *CorruptError.
func (s *Store) Verify() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.db == nil {
		return fmt.Errorf("verify cache: %w", ErrClosed)
	}
	return verify(s.db, s.path)
}

// snapshotHeader is the part of a stored snapshot needed to pick one.
type snapshotHeader struct {
	Revision int64  `json:"revision"`
	Hash     string `json:"hash"`
	Bindings struct {
		Node string `json:"node"`
	} `json:"bindings"`
}

func (s *Store) decode(k, v []byte) (Snapshot, error) {
	return decodeSnapshot(s.path, k, v)
}

func decodeSnapshot(path string, k, v []byte) (Snapshot, error) {
	var snap Snapshot
	if len(k) != 8 {
		return Snapshot{}, &CorruptError{Path: path, Reason: fmt.Sprintf("snapshot key %x is not a sequence number", k)}
	}
	seq := binary.BigEndian.Uint64(k)
	if err := json.Unmarshal(v, &snap); err != nil {
		return Snapshot{}, &CorruptError{Path: path, Reason: fmt.Sprintf("snapshot %d does not decode", seq), Err: err}
	}
	snap.Bindings = snap.Bindings.Normalize()
	if h := hashNormalized(snap.Bindings); h != snap.Hash {
		return Snapshot{}, &CorruptError{Path: path, Reason: fmt.Sprintf("snapshot %d (revision %d) does not match its hash", seq, snap.Revision)}
	}
	return snap, nil
}

// view runs fn in a read transaction, containing bbolt panics and memory
// faults as *CorruptError.
func (s *Store) view(op string, fn func(*bolt.Tx) error) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.db == nil {
		return fmt.Errorf("%s: %w", op, ErrClosed)
	}
	return s.contain(op, func() error { return s.db.View(fn) })
}

func (s *Store) update(op string, fn func(*bolt.Tx) error) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.db == nil {
		return fmt.Errorf("%s: %w", op, ErrClosed)
	}
	if s.readOnly {
		return fmt.Errorf("%s: cache opened read-only", op)
	}
	return s.contain(op, func() error { return s.db.Update(fn) })
}

func (s *Store) contain(op string, fn func() error) error {
	if err := boltfile.Contain(s.path, fn); err != nil {
		if errors.Is(err, ErrNoSnapshot) {
			return err
		}
		var damaged *boltfile.CorruptError
		if errors.As(err, &damaged) {
			err = &CorruptError{Path: s.path, Reason: damaged.Reason, Err: damaged.Err}
		}
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

func seqKey(seq uint64) []byte {
	k := make([]byte, 8)
	binary.BigEndian.PutUint64(k, seq)
	return k
}

// openChecked opens path with bbolt and verifies it (internal/boltfile does
// the opening and the structural checks; layout adds the cache's own).
// Damage of any kind, panics and memory faults included, comes back as a
// *CorruptError; a held lock as a *LockedError; operating system errors as
// they are.
func openChecked(path string, opts StoreOptions) (*bolt.DB, error) {
	db, err := boltfile.Open(path, boltfile.Options{
		LockTimeout: opts.LockTimeout,
		ReadOnly:    opts.ReadOnly,
		Verify:      func(tx *bolt.Tx) error { return layout(tx, path) },
	})
	if err != nil {
		return nil, fileError("open cache", path, err)
	}
	return db, nil
}

// verify re-checks an open cache file.
func verify(db *bolt.DB, path string) error {
	if err := boltfile.Check(db, path, func(tx *bolt.Tx) error { return layout(tx, path) }); err != nil {
		return fileError("verify cache", path, err)
	}
	return nil
}

// layout checks the cache's own layout: a format this binary reads (a
// newer one is a *NewerFormatError, before any record is judged)
// and every snapshot decoding and matching its hash.
func layout(tx *bolt.Tx, path string) error {
	if err := boltfile.CheckFormat(tx, path, "cache", 1, storeFormat); err != nil {
		return err
	}
	if b := tx.Bucket(bucketSnapshots); b != nil {
		return b.ForEach(func(k, v []byte) error {
			_, err := decodeSnapshot(path, k, v)
			return err
		})
	}
	return nil
}

// fileError turns internal/boltfile's errors into the cache's own: a
// *LockedError naming the data directory, a *CorruptError (the cache's
// own when the layout check made one), a *NewerFormatError as it is, or
// err wrapped with op.
func fileError(op, path string, err error) error {
	var own *CorruptError
	if errors.As(err, &own) {
		return own
	}
	var newer *NewerFormatError
	if errors.As(err, &newer) {
		return newer // names the file and both formats already
	}
	var locked *boltfile.LockedError
	if errors.As(err, &locked) {
		return &LockedError{Dir: filepath.Dir(path)}
	}
	var damaged *boltfile.CorruptError
	if errors.As(err, &damaged) {
		return &CorruptError{Path: path, Reason: damaged.Reason, Err: damaged.Err}
	}
	return fmt.Errorf("%s: %w", op, err)
}

// CopyTo writes a consistent copy of the cache to path (a new file, mode
// 0600) while the store stays in use: a backup of a running node.
func (s *Store) CopyTo(path string) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.db == nil {
		return fmt.Errorf("copy cache: %w", ErrClosed)
	}
	return boltfile.Copy(s.db, path)
}
