// Package completed keeps the message ids of commands that completed on
// this node, per stage, in a bbolt file of its own, so that a stage that
// dedupes acks a delivery of a completed id without calling its handler.
// A Store is safe for concurrent use. It dedupes per node, not across the
// mesh.
package completed

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/meshbox/meshbox/internal/boltfile"
	bolt "go.etcd.io/bbolt"
)

// Format is the layout of the completed-ids file: bucket meta
// (the format), and per stage a bucket "stage:<name>" holding bucket ids
// (message id -> completion time, 8 bytes of Unix nanoseconds) and bucket
// order (completion time + message id -> nothing), oldest first.
const Format = 1

var (
	BucketIDs   = []byte("ids")
	BucketOrder = []byte("order")
)

func StageBucket(stage string) []byte { return []byte("stage:" + stage) }

// DedupePolicy is a stage's idempotency at the node.
type DedupePolicy struct {
	// Window is how long a completed id is remembered (at least 1s, at
	// most 90 days).
	Window time.Duration
	// MaxEntries bounds the ids remembered for the stage (1..10,000,000).
	MaxEntries int
}

// Store is the store of completed message ids. Its methods are safe
// for concurrent use; counts is guarded by mu.
type Store struct {
	db     *bolt.DB
	path   string
	mu     sync.Mutex
	counts map[string]int // ids held per stage
	// writing are the ids whose completion is being written (stage, NUL,
	// id): seen already, so that a delivery right behind the completion
	// is not let through before the write commits.
	writing map[string]bool
}

// Open opens or creates the completed-ids file at path.
func Open(path string) (*Store, error) {
	db, err := boltfile.Open(path, boltfile.Options{Verify: func(tx *bolt.Tx) error {
		return boltfile.CheckFormat(tx, path, "completed ids", Format, Format)
	}})
	if err != nil {
		return nil, fmt.Errorf("open completed ids: %w", err)
	}
	c := &Store{db: db, path: path, counts: map[string]int{}, writing: map[string]bool{}}
	err = db.Update(func(tx *bolt.Tx) error {
		if _, err := boltfile.Upgrade(tx, path, "completed ids", Format, Format, nil); err != nil {
			return err
		}
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			stage, ok := bytes.CutPrefix(name, []byte("stage:"))
			if !ok {
				return nil
			}
			if ids := b.Bucket(BucketIDs); ids != nil {
				c.counts[string(stage)] = ids.Stats().KeyN
			}
			return nil
		})
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open completed ids: %w", err)
	}
	return c, nil
}

// begin marks id of stage as completed now, before done writes it.
func (c *Store) Begin(stage, id string) {
	if id == "" {
		return
	}
	c.mu.Lock()
	c.writing[stage+"\x00"+id] = true
	c.mu.Unlock()
}

// seen reports whether id completed for stage after since (or is being
// written).
func (c *Store) Seen(stage, id string, since time.Time) (bool, error) {
	c.mu.Lock()
	hit := c.writing[stage+"\x00"+id]
	c.mu.Unlock()
	if hit {
		return true, nil
	}
	err := c.db.View(func(tx *bolt.Tx) error {
		sb := tx.Bucket(StageBucket(stage))
		if sb == nil {
			return nil
		}
		ids := sb.Bucket(BucketIDs)
		if ids == nil {
			return nil
		}
		v := ids.Get([]byte(id))
		if len(v) == 8 && int64(binary.BigEndian.Uint64(v)) > since.UnixNano() {
			hit = true
		}
		return nil
	})
	return hit, err
}

// done records that id completed for stage at now, pruning what p no
// longer keeps. Concurrent calls share a commit (bolt's Batch).
func (c *Store) Done(stage, id string, now time.Time, p DedupePolicy) error {
	if id == "" {
		return errors.New("completed ids: empty message id")
	}
	var added int
	err := c.db.Batch(func(tx *bolt.Tx) error {
		added = 0
		sb, err := tx.CreateBucketIfNotExists(StageBucket(stage))
		if err != nil {
			return err
		}
		ids, err := sb.CreateBucketIfNotExists(BucketIDs)
		if err != nil {
			return err
		}
		order, err := sb.CreateBucketIfNotExists(BucketOrder)
		if err != nil {
			return err
		}
		if old := ids.Get([]byte(id)); len(old) == 8 {
			if err := order.Delete(OrderKey(old, id)); err != nil {
				return err
			}
			added--
		}
		var t [8]byte
		binary.BigEndian.PutUint64(t[:], uint64(now.UnixNano()))
		if err := ids.Put([]byte(id), t[:]); err != nil {
			return err
		}
		if err := order.Put(OrderKey(t[:], id), nil); err != nil {
			return err
		}
		added++
		c.mu.Lock()
		held := c.counts[stage] + added
		c.mu.Unlock()
		n, err := Prune(ids, order, now.Add(-p.Window), held-p.MaxEntries)
		added -= n
		return err
	})
	c.mu.Lock()
	delete(c.writing, stage+"\x00"+id)
	if err == nil {
		c.counts[stage] += added
	}
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("completed ids: %w", err)
	}
	return nil
}

// pruneAll removes, for every stage in policies, the ids older than its
// window.
func (c *Store) PruneAll(now time.Time, policies map[string]DedupePolicy) error {
	for stage, p := range policies {
		var removed int
		err := c.db.Update(func(tx *bolt.Tx) error {
			removed = 0
			sb := tx.Bucket(StageBucket(stage))
			if sb == nil || sb.Bucket(BucketIDs) == nil || sb.Bucket(BucketOrder) == nil {
				return nil
			}
			var err error
			removed, err = Prune(sb.Bucket(BucketIDs), sb.Bucket(BucketOrder), now.Add(-p.Window), 0)
			return err
		})
		if err != nil {
			return fmt.Errorf("completed ids: prune %s: %w", stage, err)
		}
		c.mu.Lock()
		c.counts[stage] -= removed
		c.mu.Unlock()
	}
	return nil
}

// Prune deletes the oldest ids: those completed before cutoff, and at
// least excess of them. It returns how many it deleted.
func Prune(ids, order *bolt.Bucket, cutoff time.Time, excess int) (int, error) {
	n := 0
	cur := order.Cursor()
	for k, _ := cur.First(); len(k) >= 8; k, _ = cur.First() {
		if n >= excess && int64(binary.BigEndian.Uint64(k[:8])) >= cutoff.UnixNano() {
			break
		}
		if err := ids.Delete(k[8:]); err != nil {
			return n, err
		}
		if err := order.Delete(k); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

func OrderKey(t []byte, id string) []byte {
	k := make([]byte, 0, 8+len(id))
	return append(append(k, t...), id...)
}

// held is how many ids stage holds.
func (c *Store) Held(stage string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[stage]
}

func (c *Store) Close() error { return c.db.Close() }

// PruneEvery is how often the ids past their window are pruned.
const PruneEvery = time.Minute

// CopyTo writes a consistent copy of the completed ids to path (a new
// file, mode 0600) while the store stays in use: a backup of a running
// node.
func (c *Store) CopyTo(path string) error { return boltfile.Copy(c.db, path) }
