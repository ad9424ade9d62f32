package bridge

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

var (
	bucketRecords    = []byte("records")
	bucketMeta       = []byte("meta")
	bucketQuarantine = []byte("quarantine")
	keyPublished     = []byte("published") // highest seq ever handed to the broker
)

const (
	outboxLockTimeout = time.Second
	outboxMaxBatch    = 2048
	// outboxCloseLimit bounds how long close waits for the writer to commit
	// what was queued: a hung disk must not hang the node's stop.
	outboxCloseLimit = 10 * time.Second
)

// outbox is the durable store-and-forward queue: a bbolt file of records
// keyed by their sequence number. One writer goroutine applies every change
// in group commits (one fsync for everything queued while the previous
// commit ran); a change's callback runs only after its commit.
//
// The counters (depth, bytes, reserved) are guarded by mu. Records read by
// readAfter are copies, valid forever.
type outbox struct {
	db       *bolt.DB
	path     string
	log      *slog.Logger
	maxBytes int64
	warning  string // set at open when a damaged file was set aside

	ops     chan obOp
	quit    chan struct{} // closed by close: the writer commits what is queued and exits
	closing chan struct{} // closed when close begins: a send waiting for room gives up
	done    chan struct{} // closed by the writer when it exits

	sendMu    sync.RWMutex // held (read) while sending on ops; (write) by close
	closed    bool
	running   bool          // start was called (set before any send)
	closeOnce sync.Once     // closes closing
	closeWait time.Duration // how long close waits for the writer
	abandoned atomic.Bool   // close gave up on the writer: it closes the file when it exits

	// testCommit, when set (by tests), runs before each group commit; an
	// error it returns fails the commit as a disk error would.
	testCommit func(batch []obOp) error

	mu         sync.Mutex
	depth      int64
	bytes      int64
	reserved   int64
	published  uint64 // persisted: every record with seq <= published may have reached the broker
	lastSeq    uint64 // highest seq stored at open
	meshAtOpen int64  // records for the mesh (commands, events, dead letters) at open
	onCommit   func(kinds uint8)
	failing    bool // the last commit failed (state for the one log line)
	commits    int  // transactions committed (tests)
}

// obOp is one change for the writer. Exactly one of put, del, published is
// meaningful; done (may be nil) receives the commit's outcome.
type obOp struct {
	put       *record
	data      []byte
	replace   bool   // put replaces an existing record of the same seq (no depth change)
	oldSize   int64  // replace: size of the record it replaces
	del       uint64 // seq to delete (0: none)
	delSize   int64
	published uint64
	done      func(error)
}

// start runs the writer goroutine; it exits after close, once every change
// queued before close is committed.
func (o *outbox) start(onCommit func(kinds uint8)) {
	o.onCommit = onCommit
	o.running = true
	go o.writer()
}

// nextSeq is the first sequence number for new records: above everything
// stored and everything ever published.
func (o *outbox) nextSeq() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return max(o.lastSeq, o.published) + 1
}

// publishedUpTo returns the persisted high-water mark of published seqs.
func (o *outbox) publishedUpTo() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.published
}

// reserve claims n bytes for a record about to be put, or returns an
// ErrOutboxFull error. The reservation ends when the put commits or fails.
func (o *outbox) reserve(n int64) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.bytes+o.reserved+n > o.maxBytes {
		return fmt.Errorf("%w: %d of %d bytes used", ErrOutboxFull, o.bytes+o.reserved, o.maxBytes)
	}
	o.reserved += n
	return nil
}

// reserveAlways claims n bytes beyond the bound: for a record that was
// accepted once already (a dead letter, a command moved to the mesh) and
// must not be refused now.
func (o *outbox) reserveAlways(n int64) {
	o.mu.Lock()
	o.reserved += n
	o.mu.Unlock()
}

// send queues op for the writer; it fails with ErrClosed after close, and
// when close begins while it waits for room.
func (o *outbox) send(op obOp) {
	o.sendMu.RLock()
	if o.closed {
		o.sendMu.RUnlock()
		o.refuse(op)
		return
	}
	select {
	case o.ops <- op:
		o.sendMu.RUnlock()
	case <-o.closing:
		o.sendMu.RUnlock()
		o.refuse(op)
	}
}

// refuse settles an op that never reached the writer.
func (o *outbox) refuse(op obOp) {
	if op.put != nil && !op.replace {
		o.mu.Lock()
		o.reserved -= int64(len(op.data))
		o.mu.Unlock()
	}
	if op.done != nil {
		op.done(ErrClosed)
	}
}

// put stores r, encoded as data (reserved before with reserve), and calls
// done after commit.
func (o *outbox) put(r *record, data []byte, done func(error)) {
	o.send(obOp{put: r, data: data, done: done})
}

// replace overwrites the record with r.seq (whose stored size was oldSize).
func (o *outbox) replace(r *record, oldSize int64, done func(error)) {
	o.send(obOp{put: r, data: r.encode(), replace: true, oldSize: oldSize, done: done})
}

// del removes the record seq of the given size.
func (o *outbox) del(seq uint64, size int64, done func(error)) {
	o.send(obOp{del: seq, delSize: size, done: done})
}

// markPublished persists that every seq up to seq may have been published.
func (o *outbox) markPublished(seq uint64, done func(error)) {
	o.send(obOp{published: seq, done: done})
}

// wait runs op with a done callback and waits for the commit, or for ctx:
// then the change may still be committed later.
func (o *outbox) wait(ctx context.Context, op func(done func(error))) error {
	ch := make(chan error, 1)
	op(func(err error) { ch <- err })
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return fmt.Errorf("outbox: %w", ctx.Err())
	}
}

// sync waits until every change queued before it is committed, or for ctx.
func (o *outbox) sync(ctx context.Context) error {
	return o.wait(ctx, func(done func(error)) { o.send(obOp{done: done}) })
}

func seqKey(seq uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], seq)
	return k[:]
}

// writer applies queued changes in group commits. It exits when quit is
// closed and the queue is empty.
func (o *outbox) writer() {
	defer close(o.done)
	defer func() {
		if o.abandoned.Load() { // close gave up waiting: the file is ours to close
			_ = o.db.Close()
		}
	}()
	batch := make([]obOp, 0, outboxMaxBatch)
	for {
		batch = batch[:0]
		select {
		case op := <-o.ops:
			batch = append(batch, op)
		case <-o.quit:
			for {
				select {
				case op := <-o.ops:
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
		for len(batch) < outboxMaxBatch {
			select {
			case op := <-o.ops:
				batch = append(batch, op)
			default:
				break more
			}
		}
		o.commit(batch)
	}
}

// commit applies batch in one transaction and runs the callbacks.
func (o *outbox) commit(batch []obOp) {
	var kinds uint8
	var err error
	if o.testCommit != nil {
		err = o.testCommit(batch)
	}
	if err == nil {
		err = o.update(batch, &kinds)
	}
	o.mu.Lock()
	for i := range batch {
		op := &batch[i]
		switch {
		case op.put != nil && op.replace:
			if err == nil {
				o.bytes += int64(len(op.data)) - op.oldSize
			}
		case op.put != nil:
			o.reserved -= int64(len(op.data))
			if err == nil {
				o.bytes += int64(len(op.data))
				o.depth++
			}
		case op.del != 0:
			if err == nil {
				o.bytes -= op.delSize
				o.depth--
			}
		case op.published != 0:
			if err == nil && op.published > o.published {
				o.published = op.published
			}
		}
	}
	wasFailing := o.failing
	o.failing = err != nil
	o.commits++
	o.mu.Unlock()
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

// update applies batch in one transaction; kinds gets a bit per record
// kind put.
func (o *outbox) update(batch []obOp, kinds *uint8) error {
	return o.db.Update(func(tx *bolt.Tx) error {
		recs := tx.Bucket(bucketRecords)
		for i := range batch {
			op := &batch[i]
			switch {
			case op.put != nil:
				if err := recs.Put(seqKey(op.put.seq), op.data); err != nil {
					return err
				}
				*kinds |= 1 << op.put.kind
			case op.del != 0:
				if err := recs.Delete(seqKey(op.del)); err != nil {
					return err
				}
			case op.published != 0:
				if op.published > o.publishedUpTo() {
					if err := tx.Bucket(bucketMeta).Put(keyPublished, seqKey(op.published)); err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
}

// readAfter returns up to n records with seq > after whose kind is in
// kinds (a bit set of 1<<kind), in order.
func (o *outbox) readAfter(after uint64, n int, kinds uint8) ([]*record, error) {
	var out []*record
	err := o.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketRecords).Cursor()
		for k, v := c.Seek(seqKey(after + 1)); k != nil && len(out) < n; k, v = c.Next() {
			if len(v) < 2 || kinds&(1<<v[1]) == 0 {
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

// oldest returns when the oldest record was accepted (zero when empty).
func (o *outbox) oldest() time.Time {
	var t time.Time
	_ = o.db.View(func(tx *bolt.Tx) error {
		k, v := tx.Bucket(bucketRecords).Cursor().First()
		if k == nil {
			return nil
		}
		if r, err := decodeRecord(binary.BigEndian.Uint64(k), v); err == nil {
			t = r.created
		}
		return nil
	})
	return t
}

// counts returns depth and bytes.
func (o *outbox) counts() (depth, bytes int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.depth, o.bytes
}

// close stops the writer after it committed everything queued, and closes
// the file. It waits at most closeWait for the writer: on a hung disk it
// returns an error and leaves the writer to close the file if it ever
// returns. Safe to call more than once.
func (o *outbox) close() error {
	o.closeOnce.Do(func() { close(o.closing) })
	o.sendMu.Lock()
	already := o.closed
	o.closed = true
	o.sendMu.Unlock()
	if already {
		return nil
	}
	close(o.quit)
	if o.running {
		t := time.NewTimer(o.closeWait)
		defer t.Stop()
		select {
		case <-o.done:
		case <-t.C:
			o.abandoned.Store(true)
			select {
			case <-o.done: // it exited just now, before it could see the flag
			default:
				return fmt.Errorf("%w: the writer did not finish within %s (disk hung?)", ErrOutboxStuck, o.closeWait)
			}
		}
	}
	return o.db.Close()
}
