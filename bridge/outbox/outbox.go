package outbox

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshbox/meshbox/internal/boltfile"
	bolt "go.etcd.io/bbolt"
)

// The file's layout (see the package documentation).
var (
	bucketRecords    = []byte("records")
	bucketMeta       = []byte("meta")
	bucketQuarantine = []byte("quarantine")
	keyPublished     = []byte("published") // highest seq ever handed to the broker
)

const (
	lockTimeout = time.Second
	maxBatch    = 2048
	queueLen    = 1024 // changes queued for the writer before a sender waits
	// defaultCloseWait bounds how long Close waits for the writer to commit
	// what was queued: a hung disk must not hang the node's stop.
	defaultCloseWait = 10 * time.Second
)

// Options configure Open.
type Options struct {
	// MaxBytes bounds the encoded size of the records stored and reserved
	// (Reserve); zero leaves no room.
	MaxBytes int64
	// Logger receives the outbox's log lines: a damaged file set aside,
	// records quarantined, a write failing and writes working again. Nil
	// discards them.
	Logger *slog.Logger
	// OnCommit, when set, is called on the writer goroutine after each
	// commit that stored records (Put, Replace), with the kinds stored.
	OnCommit func(Kinds)
	// CloseWait bounds how long Close waits for the writer; zero means 10s.
	CloseWait time.Duration
	// BeforeCommit, when set, is called on the writer goroutine before each
	// group commit with the changes in it; an error it returns fails the
	// commit as a disk error would, and a call that blocks is a hung disk.
	// It is the seam for tests that inject disk faults.
	BeforeCommit func([]Change) error
}

// Change is one change in a group commit, as Options.BeforeCommit sees it:
// one of Put, Delete and Published is set, or none for a Sync.
type Change struct {
	Put       *Record // the record put or replaced, as handed to Put or Replace
	Delete    uint64  // the seq of the record deleted
	Published uint64  // the published mark set (MarkPublished)
}

// Outbox is an open outbox file and its writer goroutine (see the package
// documentation). Its methods are safe for concurrent use. It is valid
// from Open until Close; after Close, changes fail with ErrClosed.
type Outbox struct {
	db       *bolt.DB
	path     string
	log      *slog.Logger
	maxBytes int64
	// Set at open, then read only.
	warning    string // a damaged file was set aside, or records were quarantined
	meshAtOpen int64  // records for the mesh (commands, events, dead letters) at open

	onCommit     func(Kinds)
	beforeCommit func([]Change) error
	closeWait    time.Duration // how long Close waits for the writer

	w writerLink // the writer goroutine and the way to it
	c counters   // what the file holds
}

// writerLink is the way to the writer goroutine: its queue of changes and
// the signals of its end.
type writerLink struct {
	ops     chan writeOp
	quit    chan struct{} // closed by Close: the writer commits what is queued and exits
	closing chan struct{} // closed when Close begins: a send waiting for room gives up
	done    chan struct{} // closed by the writer when it exits

	sendMu    sync.RWMutex // held (read) while sending on ops; (write) by Close; guards closed
	closed    bool
	closeOnce sync.Once   // closes closing
	abandoned atomic.Bool // Close gave up on the writer: it closes the file when it exits
}

// counters are what the file holds, kept in memory.
type counters struct {
	mu        sync.Mutex // guards depth, bytes, reserved, published, lastSeq, failing, commits
	depth     int64
	bytes     int64
	reserved  int64
	published uint64 // persisted: every record with seq <= published may have reached the broker
	lastSeq   uint64 // highest seq stored at open
	failing   bool   // the last commit failed (state for the one log line)
	commits   int    // transactions committed (tests)
}

// writeOp is one change for the writer. Exactly one of put, del, published is
// meaningful; done (may be nil) receives the commit's outcome.
type writeOp struct {
	put       *Record
	data      []byte
	replace   bool   // put replaces an existing record of the same seq (no depth change)
	oldSize   int64  // replace: size of the record it replaces
	del       uint64 // seq to delete (0: none)
	delSize   int64
	published uint64
	done      func(error)
}

// NextSeq is the first sequence number for new records: above everything
// stored at open and everything ever published.
func (o *Outbox) NextSeq() uint64 {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	return max(o.c.lastSeq, o.c.published) + 1
}

// MeshAtOpen returns how many records for the mesh (every kind but Local)
// the file held when it was opened.
func (o *Outbox) MeshAtOpen() int64 { return o.meshAtOpen }

// Warning says what Open found wrong with the file (it was damaged and set
// aside, or records were quarantined); empty when nothing was.
func (o *Outbox) Warning() string { return o.warning }

// Published returns the persisted published mark: every record with a seq
// up to it may have reached the broker.
func (o *Outbox) Published() uint64 {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	return o.c.published
}

// Reserve claims n bytes for a record about to be put, or returns an error
// wrapping ErrFull. The reservation ends when the put commits or fails.
func (o *Outbox) Reserve(n int64) error {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	if o.c.bytes+o.c.reserved+n > o.maxBytes {
		return fmt.Errorf("%w: %d of %d bytes used", ErrFull, o.c.bytes+o.c.reserved, o.maxBytes)
	}
	o.c.reserved += n
	return nil
}

// ReserveAlways claims n bytes beyond the bound: for a record that was
// accepted once already (a dead letter, a command moved to the mesh) and
// must not be refused now.
func (o *Outbox) ReserveAlways(n int64) {
	o.c.mu.Lock()
	o.c.reserved += n
	o.c.mu.Unlock()
}

// send queues op for the writer; it fails with ErrClosed after Close, and
// when Close begins while it waits for room.
func (o *Outbox) send(op writeOp) {
	o.w.sendMu.RLock()
	if o.w.closed {
		o.w.sendMu.RUnlock()
		o.refuse(op)
		return
	}
	select {
	case o.w.ops <- op:
		o.w.sendMu.RUnlock()
	case <-o.w.closing:
		o.w.sendMu.RUnlock()
		o.refuse(op)
	}
}

// refuse settles an op that never reached the writer.
func (o *Outbox) refuse(op writeOp) {
	if op.put != nil && !op.replace {
		o.c.mu.Lock()
		o.c.reserved -= int64(len(op.data))
		o.c.mu.Unlock()
	}
	if op.done != nil {
		op.done(ErrClosed)
	}
}

// Put stores r, encoded as data (r.Encode's result, reserved before with
// Reserve or ReserveAlways), and calls done (may be nil) after the commit.
func (o *Outbox) Put(r *Record, data []byte, done func(error)) {
	o.send(writeOp{put: r, data: data, done: done})
}

// Replace overwrites the record with r.Seq, whose stored size was oldSize,
// with r (encoded anew: r.Size is set), and calls done (may be nil) after
// the commit. It takes no reservation.
func (o *Outbox) Replace(r *Record, oldSize int64, done func(error)) {
	o.send(writeOp{put: r, data: r.Encode(), replace: true, oldSize: oldSize, done: done})
}

// Delete removes the record seq, whose stored size is size (its Size), and
// calls done (may be nil) after the commit.
func (o *Outbox) Delete(seq uint64, size int64, done func(error)) {
	o.send(writeOp{del: seq, delSize: size, done: done})
}

// MarkPublished persists that every record with a seq up to seq may have
// reached the broker, and calls done (may be nil) after the commit. The
// mark never goes down.
func (o *Outbox) MarkPublished(seq uint64, done func(error)) {
	o.send(writeOp{published: seq, done: done})
}

// Wait calls change with a done callback (change queues one change, such
// as Put or Delete, and passes it done) and waits until done is called,
// returning its error, or until ctx ends: then the change may still be
// committed later.
func (o *Outbox) Wait(ctx context.Context, change func(done func(error))) error {
	ch := make(chan error, 1)
	change(func(err error) { ch <- err })
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return fmt.Errorf("outbox: %w", ctx.Err())
	}
}

// Sync waits until every change queued before it is committed, or until
// ctx ends.
func (o *Outbox) Sync(ctx context.Context) error {
	return o.Wait(ctx, func(done func(error)) { o.send(writeOp{done: done}) })
}

func seqKey(seq uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], seq)
	return k[:]
}

// writer applies queued changes in group commits. It exits when quit is
// closed and the queue is empty.
func (o *Outbox) writer() {
	defer close(o.w.done)
	defer func() {
		if o.w.abandoned.Load() { // close gave up waiting: the file is ours to close
			_ = o.db.Close()
		}
	}()
	batch := make([]writeOp, 0, maxBatch)
	for {
		batch = batch[:0]
		select {
		case op := <-o.w.ops:
			batch = append(batch, op)
		case <-o.w.quit:
			for {
				select {
				case op := <-o.w.ops:
					batch = append(batch, op)
					continue
				default:
				}
				break
			}
			if len(batch) > 0 {
				o.commit(batch)
			}
			return
		}
	more:
		for len(batch) < maxBatch {
			select {
			case op := <-o.w.ops:
				batch = append(batch, op)
			default:
				break more
			}
		}
		o.commit(batch)
	}
}

// commit applies batch in one transaction and runs the callbacks.
func (o *Outbox) commit(batch []writeOp) {
	var kinds Kinds
	var err error
	if o.beforeCommit != nil {
		err = o.beforeCommit(changes(batch))
	}
	if err == nil {
		err = o.update(batch, &kinds)
	}
	o.c.mu.Lock()
	for i := range batch {
		op := &batch[i]
		switch {
		case op.put != nil && op.replace:
			if err == nil {
				o.c.bytes += int64(len(op.data)) - op.oldSize
			}
		case op.put != nil:
			o.c.reserved -= int64(len(op.data))
			if err == nil {
				o.c.bytes += int64(len(op.data))
				o.c.depth++
			}
		case op.del != 0:
			if err == nil {
				o.c.bytes -= op.delSize
				o.c.depth--
			}
		case op.published != 0:
			if err == nil && op.published > o.c.published {
				o.c.published = op.published
			}
		}
	}
	wasFailing := o.c.failing
	o.c.failing = err != nil
	o.c.commits++
	o.c.mu.Unlock()
	if err != nil && !wasFailing {
		o.log.Error("outbox write failed", "path", o.path, "err", err)
	} else if err == nil && wasFailing {
		o.log.Info("outbox writes work again", "path", o.path)
	}
	if err != nil {
		err = fmt.Errorf("outbox write: %w", err)
	}
	for i := range batch {
		if batch[i].done != nil {
			batch[i].done(err)
		}
	}
	if err == nil && kinds != 0 && o.onCommit != nil {
		o.onCommit(kinds)
	}
}

// changes is batch as Options.BeforeCommit sees it.
func changes(batch []writeOp) []Change {
	cs := make([]Change, len(batch))
	for i, op := range batch {
		cs[i] = Change{Put: op.put, Delete: op.del, Published: op.published}
	}
	return cs
}

// update applies batch in one transaction; kinds gets the kind of every
// record put.
func (o *Outbox) update(batch []writeOp, kinds *Kinds) error {
	return o.db.Update(func(tx *bolt.Tx) error {
		recs := tx.Bucket(bucketRecords)
		for i := range batch {
			op := &batch[i]
			switch {
			case op.put != nil:
				if err := recs.Put(seqKey(op.put.Seq), op.data); err != nil {
					return err
				}
				*kinds |= 1 << op.put.Kind
			case op.del != 0:
				if err := recs.Delete(seqKey(op.del)); err != nil {
					return err
				}
			case op.published != 0:
				if op.published > o.Published() {
					if err := tx.Bucket(bucketMeta).Put(keyPublished, seqKey(op.published)); err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
}

// ReadAfter returns up to n committed records with a seq above after whose
// kind is in kinds, in order. Records that cannot be decoded are skipped
// (the next Open quarantines them).
func (o *Outbox) ReadAfter(after uint64, n int, kinds Kinds) ([]*Record, error) {
	var out []*Record
	err := o.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketRecords).Cursor()
		for k, v := c.Seek(seqKey(after + 1)); k != nil && len(out) < n; k, v = c.Next() {
			if len(v) < 2 || !kinds.Has(Kind(v[1])) {
				continue
			}
			r, err := decodeRecord(binary.BigEndian.Uint64(k), v)
			if err != nil {
				continue // quarantined at the next open
			}
			out = append(out, r)
		}
		return nil
	})
	return out, err
}

// Oldest returns when the oldest record was accepted (zero when the
// outbox is empty or closed).
func (o *Outbox) Oldest() time.Time {
	var t time.Time
	_ = o.db.View(func(tx *bolt.Tx) error {
		k, v := tx.Bucket(bucketRecords).Cursor().First()
		if k == nil {
			return nil
		}
		if r, err := decodeRecord(binary.BigEndian.Uint64(k), v); err == nil {
			t = r.Created
		}
		return nil
	})
	return t
}

// Counts returns how many records the outbox holds and their encoded
// size, as committed.
func (o *Outbox) Counts() (depth, bytes int64) {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	return o.c.depth, o.c.bytes
}

// Close stops the writer after it committed everything queued, and closes
// the file. It waits at most Options.CloseWait for the writer: on a hung
// disk it returns an error wrapping ErrStuck and leaves the writer to close
// the file if it ever returns. Safe to call more than once: later calls
// return nil.
func (o *Outbox) Close() error {
	o.w.closeOnce.Do(func() { close(o.w.closing) })
	o.w.sendMu.Lock()
	already := o.w.closed
	o.w.closed = true
	o.w.sendMu.Unlock()
	if already {
		return nil
	}
	close(o.w.quit)
	t := time.NewTimer(o.closeWait)
	defer t.Stop()
	select {
	case <-o.w.done:
	case <-t.C:
		o.w.abandoned.Store(true)
		select {
		case <-o.w.done: // it exited just now, before it could see the flag
		default:
			return fmt.Errorf("%w: the writer did not finish within %s (disk hung?)", ErrStuck, o.closeWait)
		}
	}
	return o.db.Close()
}

// CopyTo writes a consistent copy of the outbox to path (a new file, mode
// 0600) while it stays in use: every record committed before the copy
// began, none after. A backup of a running node.
func (o *Outbox) CopyTo(path string) error { return boltfile.Copy(o.db, path) }
