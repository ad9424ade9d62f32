package bridge

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
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

	ops  chan obOp
	quit chan struct{}
	done chan struct{}

	sendMu  sync.RWMutex // held (read) while sending on ops; (write) by close
	closed  bool
	running bool // start was called (set before any send)

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

// openOutbox opens or creates the outbox at path. A file locked by another
// process is an *OutboxLockedError; a damaged file is set aside (renamed
// with a .corrupt-<time> suffix), reported in warning, and replaced by an
// empty outbox.
func openOutbox(path string, maxBytes int64, log *slog.Logger) (*outbox, error) {
	o := &outbox{path: path, log: log, maxBytes: maxBytes,
		ops: make(chan obOp, 1024), quit: make(chan struct{}), done: make(chan struct{})}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	err := o.open()
	var ce *corruptOutbox
	if errors.As(err, &ce) {
		moved, qerr := setAside(path, time.Now())
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
	return o, nil
}

type corruptOutbox struct{ err error }

func (e *corruptOutbox) Error() string { return e.err.Error() }

func (o *outbox) open() (err error) {
	var file *os.File
	opts := &bolt.Options{
		Timeout: outboxLockTimeout,
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			f, err := os.OpenFile(name, flag, perm)
			file = f
			return f, err
		},
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if o.db != nil {
				_ = o.db.Close()
				o.db = nil
			} else if file != nil {
				_ = file.Close()
			}
			err = &corruptOutbox{err: fmt.Errorf("bbolt panic: %v", r)}
		}
	}()
	if fi, serr := os.Stat(o.path); serr == nil && fi.Mode().IsRegular() && fi.Size() == 0 {
		return &corruptOutbox{err: errors.New("empty file")}
	}
	db, err := bolt.Open(o.path, 0o600, opts)
	if err != nil {
		var pe *fs.PathError
		switch {
		case errors.Is(err, bolt.ErrTimeout):
			return &OutboxLockedError{Dir: filepath.Dir(o.path)}
		case errors.As(err, &pe):
			return fmt.Errorf("open outbox: %w", err)
		default:
			return &corruptOutbox{err: err}
		}
	}
	o.db = db
	if err := o.scan(); err != nil {
		_ = db.Close()
		o.db = nil
		return err
	}
	return nil
}

// scan creates the buckets, moves undecodable records to the quarantine
// bucket, and loads the counters.
func (o *outbox) scan() error {
	var bad int
	err := o.db.Update(func(tx *bolt.Tx) error {
		recs, err := tx.CreateBucketIfNotExists(bucketRecords)
		if err != nil {
			return err
		}
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if v := meta.Get(keyPublished); len(v) == 8 {
			o.published = binary.BigEndian.Uint64(v)
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
			if r.kind != kindLocal {
				o.meshAtOpen++
			}
			o.depth++
			o.bytes += int64(len(v))
			o.lastSeq = max(o.lastSeq, seq)
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
	if err != nil {
		return &corruptOutbox{err: err}
	}
	if bad > 0 {
		o.warning = fmt.Sprintf("%d undecodable outbox records moved to the quarantine bucket", bad)
		o.log.Error("outbox records quarantined", "count", bad, "path", o.path)
	}
	return nil
}

// setAside renames a damaged file out of the way and returns its new path.
func setAside(path string, now time.Time) (string, error) {
	base := path + ".corrupt-" + now.UTC().Format("20060102T150405Z")
	moved := base
	for i := 1; ; i++ {
		if _, err := os.Lstat(moved); errors.Is(err, fs.ErrNotExist) {
			break
		}
		moved = fmt.Sprintf("%s-%d", base, i)
	}
	return moved, os.Rename(path, moved)
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

// send queues op for the writer; it fails with ErrClosed after close.
func (o *outbox) send(op obOp) {
	o.sendMu.RLock()
	if o.closed {
		o.sendMu.RUnlock()
		if op.done != nil {
			op.done(ErrClosed)
		}
		return
	}
	o.ops <- op
	o.sendMu.RUnlock()
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

// wait runs op with a done callback and waits for the commit.
func (o *outbox) wait(op func(done func(error))) error {
	ch := make(chan error, 1)
	op(func(err error) { ch <- err })
	return <-ch
}

// sync waits until every change queued before it is committed.
func (o *outbox) sync() error {
	ch := make(chan error, 1)
	o.send(obOp{done: func(err error) { ch <- err }})
	return <-ch
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
	err := o.db.Update(func(tx *bolt.Tx) error {
		recs := tx.Bucket(bucketRecords)
		for i := range batch {
			op := &batch[i]
			switch {
			case op.put != nil:
				if err := recs.Put(seqKey(op.put.seq), op.data); err != nil {
					return err
				}
				kinds |= 1 << op.put.kind
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
// the file. Safe to call more than once.
func (o *outbox) close() error {
	o.sendMu.Lock()
	already := o.closed
	o.closed = true
	o.sendMu.Unlock()
	if already {
		return nil
	}
	close(o.quit)
	if o.running {
		<-o.done
	}
	return o.db.Close()
}
