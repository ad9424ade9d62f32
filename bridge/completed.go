package bridge

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/meshbox/meshbox/internal/boltfile"
)

// Idempotency at the node. A stage named in Config.Dedupe has this node
// remember the message ids of its commands that completed here (the
// handler replied with a result): a later delivery of an id that completed
// within the stage's window is acked without calling the handler again
// (meshbox_commands_deduplicated_total{stage}). The ids live in a bbolt
// file of their own (Config.CompletedPath), so they survive a restart; ids
// older than the window are pruned, and a stage keeps at most MaxEntries
// (the oldest go first).
//
// This dedupes per node, not across the mesh: a command retried on
// another node hosting the stage (its handler here lost the lease, or this
// node went away) runs there again, because no node knows what another
// completed without asking it, and asking a node that may be gone would
// make every command wait on it. Convergence is not exactly once: a
// handler whose effects must happen once still needs idempotency at the
// system it changes, keyed by Meshbox-Msg-Id. Two deliveries of one id at
// the same time (a submitter sending it twice quickly) may both run; the
// window covers a delivery that arrives after the first completed.

// completedFormat is the layout of the completed-ids file: bucket meta
// (the format), and per stage a bucket "stage:<name>" holding bucket ids
// (message id -> completion time, 8 bytes of Unix nanoseconds) and bucket
// order (completion time + message id -> nothing), oldest first.
const completedFormat = 1

var (
	bucketIDs   = []byte("ids")
	bucketOrder = []byte("order")
)

func stageBucket(stage string) []byte { return []byte("stage:" + stage) }

// DedupePolicy is a stage's idempotency at the node.
type DedupePolicy struct {
	// Window is how long a completed id is remembered (at least 1s, at
	// most 90 days).
	Window time.Duration
	// MaxEntries bounds the ids remembered for the stage (1..10,000,000).
	MaxEntries int
}

// completed is the store of completed message ids. Its methods are safe
// for concurrent use; counts is guarded by mu.
type completed struct {
	db     *bolt.DB
	path   string
	mu     sync.Mutex
	counts map[string]int // ids held per stage
	// writing are the ids whose completion is being written (stage, NUL,
	// id): seen already, so that a delivery right behind the completion
	// is not let through before the write commits.
	writing map[string]bool
}

// openCompleted opens or creates the completed-ids file at path.
func openCompleted(path string) (*completed, error) {
	db, err := boltfile.Open(path, boltfile.Options{Verify: func(tx *bolt.Tx) error {
		return boltfile.CheckFormat(tx, path, "completed ids", completedFormat, completedFormat)
	}})
	if err != nil {
		return nil, fmt.Errorf("open completed ids: %w", err)
	}
	c := &completed{db: db, path: path, counts: map[string]int{}, writing: map[string]bool{}}
	err = db.Update(func(tx *bolt.Tx) error {
		if _, err := boltfile.Upgrade(tx, path, "completed ids", completedFormat, completedFormat, nil); err != nil {
			return err
		}
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			stage, ok := bytes.CutPrefix(name, []byte("stage:"))
			if !ok {
				return nil
			}
			if ids := b.Bucket(bucketIDs); ids != nil {
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
func (c *completed) begin(stage, id string) {
	if id == "" {
		return
	}
	c.mu.Lock()
	c.writing[stage+"\x00"+id] = true
	c.mu.Unlock()
}

// seen reports whether id completed for stage after since (or is being
// written).
func (c *completed) seen(stage, id string, since time.Time) (bool, error) {
	c.mu.Lock()
	hit := c.writing[stage+"\x00"+id]
	c.mu.Unlock()
	if hit {
		return true, nil
	}
	err := c.db.View(func(tx *bolt.Tx) error {
		sb := tx.Bucket(stageBucket(stage))
		if sb == nil {
			return nil
		}
		ids := sb.Bucket(bucketIDs)
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
func (c *completed) done(stage, id string, now time.Time, p DedupePolicy) error {
	if id == "" {
		return errors.New("completed ids: empty message id")
	}
	var added int
	err := c.db.Batch(func(tx *bolt.Tx) error {
		added = 0
		sb, err := tx.CreateBucketIfNotExists(stageBucket(stage))
		if err != nil {
			return err
		}
		ids, err := sb.CreateBucketIfNotExists(bucketIDs)
		if err != nil {
			return err
		}
		order, err := sb.CreateBucketIfNotExists(bucketOrder)
		if err != nil {
			return err
		}
		if old := ids.Get([]byte(id)); len(old) == 8 {
			if err := order.Delete(orderKey(old, id)); err != nil {
				return err
			}
			added--
		}
		var t [8]byte
		binary.BigEndian.PutUint64(t[:], uint64(now.UnixNano()))
		if err := ids.Put([]byte(id), t[:]); err != nil {
			return err
		}
		if err := order.Put(orderKey(t[:], id), nil); err != nil {
			return err
		}
		added++
		c.mu.Lock()
		held := c.counts[stage] + added
		c.mu.Unlock()
		n, err := prune(ids, order, now.Add(-p.Window), held-p.MaxEntries)
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
func (c *completed) pruneAll(now time.Time, policies map[string]DedupePolicy) error {
	for stage, p := range policies {
		var removed int
		err := c.db.Update(func(tx *bolt.Tx) error {
			removed = 0
			sb := tx.Bucket(stageBucket(stage))
			if sb == nil || sb.Bucket(bucketIDs) == nil || sb.Bucket(bucketOrder) == nil {
				return nil
			}
			var err error
			removed, err = prune(sb.Bucket(bucketIDs), sb.Bucket(bucketOrder), now.Add(-p.Window), 0)
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

// prune deletes the oldest ids: those completed before cutoff, and at
// least excess of them. It returns how many it deleted.
func prune(ids, order *bolt.Bucket, cutoff time.Time, excess int) (int, error) {
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

func orderKey(t []byte, id string) []byte {
	k := make([]byte, 0, 8+len(id))
	return append(append(k, t...), id...)
}

// held is how many ids stage holds.
func (c *completed) held(stage string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[stage]
}

func (c *completed) close() error { return c.db.Close() }

// pruneEvery is how often the ids past their window are pruned.
const pruneEvery = time.Minute

// runPruner prunes the completed ids past their stage's window, at once
// and every pruneEvery. Exits when the bridge closes.
func (b *Bridge) runPruner() {
	t := time.NewTicker(pruneEvery)
	defer t.Stop()
	for {
		if err := b.files.done.pruneAll(time.Now(), b.cfg.Dedupe); err != nil {
			b.log.Error("prune completed ids", "err", err)
		}
		select {
		case <-b.quit:
			return
		case <-t.C:
		}
	}
}

// completedBefore reports whether id completed on this node for stage
// within its dedupe window (false when the stage does not dedupe), and
// counts the duplicate. A store that cannot be read lets the delivery
// through: at least once stays the guarantee.
func (b *Bridge) completedBefore(stage, id string) bool {
	p, ok := b.cfg.Dedupe[stage]
	if !ok || b.files.done == nil || id == "" {
		return false
	}
	hit, err := b.files.done.seen(stage, id, time.Now().Add(-p.Window))
	if err != nil {
		b.log.Error("read completed ids; delivering", "stage", stage, "msg_id", id, "err", err)
		return false
	}
	if hit {
		b.m.deduplicated.WithLabelValues(stage).Inc()
	}
	return hit
}

// completedNow records that id completed on this node for stage, when the
// stage dedupes; a failed write is logged (the id may run again).
func (b *Bridge) completedNow(stage, id string) {
	p, ok := b.cfg.Dedupe[stage]
	if !ok || b.files.done == nil || id == "" {
		return
	}
	if err := b.files.done.done(stage, id, time.Now(), p); err != nil {
		b.log.Error("record a completed id", "stage", stage, "msg_id", id, "err", err)
	}
}

// dedupes reports whether stage remembers its completed ids.
func (b *Bridge) dedupes(stage string) bool {
	if b.files.done == nil {
		return false
	}
	_, ok := b.cfg.Dedupe[stage]
	return ok
}
