package rows

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/internal/wire"
)

// The sync: one AMQP connection of its own to the broker, a confirmed
// publisher of the node's pending writes, and a consumer per table of
// its log (a stream queue), from the offset the store saved.

// Reading a table's log: from the saved offset, applying runs of log
// messages in one commit each, holding changes stamped too far ahead.

// readLog consumes table's log from the saved offset (a node that never
// read it: from the newest snapshot a writer named, else from the start),
// applying what it reads.
func (e *Engine) readLog(ctx context.Context, conn *amqp.Connection, table string) error {
	if !e.awaitKey(ctx, table) {
		return nil
	}
	e.mu.Lock()
	e.state(table).reading = time.Now()
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.state(table).reading = time.Time{}
		e.mu.Unlock()
	}()
	off, ok, err := e.store.Offset(table)
	if err != nil {
		return err
	}
	// The reader's channel opens while the newest snapshot is looked for,
	// and the record that a joiner's snapshot is to be checked commits
	// while its consumer starts: round trips to the broker and a disk
	// commit not waited for one after the other (on a home link, 40 to
	// 160 ms of a join).
	// Each is waited for once, where it is needed or on return.
	opened := make(chan channelOpened, 1)
	go func() {
		ch, err := conn.Channel()
		if err == nil {
			// Closed with the connection (session).
			err = ch.Qos(readPrefetch, 0, false)
		}
		opened <- channelOpened{ch, err}
	}()
	channel := sync.OnceValue(func() channelOpened { return <-opened })
	defer channel()
	var verifySet chan error // nil: nothing to record
	verifyRecorded := sync.OnceValue(func() error {
		if verifySet == nil {
			return nil
		}
		return <-verifySet
	})
	defer verifyRecorded()
	var start any = "first"
	joined := false
	var lastHash []byte
	if ok {
		// From the last message this node applied, read again: that it
		// is still there, the same, says the log is the one this node
		// read (resumeCheck).
		start = int64(off - 1)
		if lastHash, err = e.store.lastHash(table); err != nil {
			return err
		}
	} else if s, found := e.newestSnapshot(ctx, conn, table); found {
		// The snapshot is a member's word: the log before it is read
		// too, in the background, to check that it held every change
		// there (verify.go).
		verifySet = make(chan error, 1)
		go func(set chan<- error) { set <- e.store.setVerify(table, s) }(verifySet)
		start, joined = int64(s), true
		e.log.Info("rows: joining a table from its newest snapshot; the log before it is checked in the background", "table", table, "offset", s)
	}
	heldNext, err := e.store.nextHeld(table)
	if err != nil {
		return err
	}
	r := channel()
	if r.err != nil {
		return r.err
	}
	ch := r.ch
	ds, err := ch.ConsumeWithContext(ctx, QueueOf(table), "", false, false, false, false, amqp.Table{"x-stream-offset": start})
	if err != nil {
		return fmt.Errorf("read the log of table %s: %w (meshbox mesh table add %s makes it on the broker)", table, err, table)
	}
	// Deliveries the reader no longer takes would hold the connection's
	// reader, and with it the channel's close, forever.
	defer func() { go drain(ds) }()
	if err := verifyRecorded(); err != nil {
		return err
	}
	defer func() {
		e.mu.Lock()
		e.state(table).connected, e.state(table).inRun = false, 0
		e.mu.Unlock()
	}()
	e.mu.Lock()
	st := e.state(table)
	st.connected, st.offset, st.heldNext = true, off, heldNext
	st.held = e.store.heldCount(table)
	if joined {
		st.wantSnap, st.snapApplied = true, time.Time{} // the verifier waits for this one
	}
	e.mu.Unlock()
	verifyAt, verifyTo, verifyPending, err := e.store.verifyRange(table)
	if err != nil {
		return err
	}
	e.mu.Lock()
	st.checking = verifyPending // the snapshot it takes is checked
	e.mu.Unlock()
	// The verifier of a snapshot this node joined from (now or before a
	// restart): it ends with the reader (vctx).
	vctx, vcancel := context.WithCancel(ctx)
	var verifier sync.WaitGroup
	defer verifier.Wait()
	defer vcancel()
	if verifyPending {
		verifier.Go(func() { e.verifyLog(vctx, conn, table, verifyAt, verifyTo) })
	}
	if ok {
		if err := e.resumeCheck(ctx, conn, table, off, lastHash, ds, ch); err != nil {
			return err
		}
	}
	first := !ok
	retryHeld := time.NewTicker(time.Second)
	defer retryHeld.Stop()
	// A run is opened and checked while the run before it commits: the
	// two take about as long, and a joiner's snapshot is both.
	// While a commit runs, the next run takes what arrives (up to its
	// bounds): the busier the disk, the more each commit carries.
	var committing chan struct{} // closed when the commit in flight ended (nil: none)
	var commitErr error          // its error, set before the close
	settle := func() error {
		if committing == nil {
			return nil
		}
		<-committing
		committing = nil
		return commitErr
	}
	defer func() { _ = settle() }()
	for {
		msgs, open := nextRun(ctx, ds, retryHeld.C, committing)
		if !open {
			if err := settle(); err != nil {
				return err
			}
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("the log of table %s: consumer ended", table)
		}
		if len(msgs) == 0 { // the ticker
			if err := settle(); err != nil {
				return err
			}
			if err := e.releaseHeld(table); err != nil {
				return err
			}
			continue
		}
		if first && !joined && offsetOf(msgs[0]) > 0 {
			// A node new to the log without a snapshot to start from,
			// and the log no longer starts at its beginning: what it
			// dropped is in the snapshots after it.
			e.mu.Lock()
			e.state(table).wantSnap = true
			e.mu.Unlock()
		}
		first = false
		run := e.openRun(table, msgs, committing != nil)
		if err := settle(); err != nil {
			return err
		}
		committing = make(chan struct{})
		go func(done chan<- struct{}) {
			defer close(done)
			commitErr = e.commitRun(table, run)
			if commitErr == nil {
				commitErr = ch.Ack(msgs[len(msgs)-1].DeliveryTag, true)
			}
		}(committing)
	}
}

// channelOpened is a channel opened for a reader, or why not.
type channelOpened struct {
	ch  *amqp.Channel
	err error
}

// applyBytes bounds the body bytes of a run applied in one commit: a
// reader's working set (snapshot parts are up to 256 KiB each).
const applyBytes = 4 << 20

// nextRun waits for the next delivery of ds (or a tick: an empty run),
// then takes the deliveries that follow within applyLinger, and for as
// long as busy (the commit before it) is not closed, up to applyBatch
// messages and applyBytes. open is false when ds closed or ctx ended.
func nextRun(ctx context.Context, ds <-chan amqp.Delivery, tick <-chan time.Time, busy <-chan struct{}) (msgs []amqp.Delivery, open bool) {
	select {
	case <-ctx.Done():
		return nil, false
	case <-tick:
		return nil, true
	case d, ok := <-ds:
		if !ok {
			return nil, false
		}
		msgs = append(msgs, d)
	}
	size := len(msgs[0].Body)
	linger := time.NewTimer(applyLinger)
	defer linger.Stop()
	lingered := false
	for len(msgs) < applyBatch && size < applyBytes {
		select {
		case d, ok := <-ds:
			if !ok {
				return msgs, true // applied; the next call says it closed
			}
			msgs = append(msgs, d)
			size += len(d.Body)
		case <-linger.C:
			if busy == nil {
				return msgs, true
			}
			lingered = true
		case <-busy:
			if lingered {
				return msgs, true
			}
			busy = nil
		}
	}
	return msgs, true
}

// applyLog applies a run of log messages of table.
func (e *Engine) applyLog(table string, msgs []amqp.Delivery) error {
	return e.commitRun(table, e.openRun(table, msgs, false))
}

// commitRun stores a run openRun made, in one commit, and tells the
// table's state and watchers.
func (e *Engine) commitRun(table string, run logApply) error {
	res, err := e.store.applyLog(table, run)
	e.mu.Lock()
	st := e.state(table)
	st.inRun, st.lastRun = max(st.inRun-1, 0), time.Now()
	e.mu.Unlock()
	if err != nil {
		e.m.errors.WithLabelValues("store").Inc()
		return fmt.Errorf("apply the log of table %s: %w", table, err)
	}
	e.mu.Lock()
	st.offset = run.next
	st.lastNext = max(st.lastNext, run.next)
	st.held = res.held
	if len(run.hold) > 0 {
		if h := minStamp(run.hold); st.heldNext == 0 || h < st.heldNext {
			st.heldNext = h
		}
	}
	due := e.snapshotDue(st) // else the snapshot clock schedules it once due
	e.mu.Unlock()
	if res.dropped > 0 {
		e.refuseN(table, causeOverBound, "", res.dropped, fmt.Errorf("%d changes stamped ahead dropped: this node holds at most %d (%d MiB) of a table until its clock reaches them", res.dropped, maxHeldChanges, maxHeldBytes>>20))
	}
	e.notifyAll(res.applied)
	if due {
		e.snapshotSoon(table)
	}
	return nil
}

// openChecked opens the log message d of table (at offset o) and checks
// it by the trust rules (trust.go): it returns the batch and the node
// that published it, or counts the refusal and reports false.
func (e *Engine) openChecked(table string, d *amqp.Delivery, o uint64) (*batch, string, bool) {
	b, origin, cause, sender, err := e.check(table, d, o)
	if err != nil {
		e.refuse(table, cause, sender, err)
		return nil, "", false
	}
	return b, origin, true
}

// check is openChecked without counting: the refusal's cause and sender.
func (e *Engine) check(table string, d *amqp.Delivery, o uint64) (b *batch, origin, cause, sender string, err error) {
	keyID, _ := d.Headers[headerKey].(string)
	sender = d.UserId
	if err := e.checkScope(table, keyID); err != nil {
		return nil, "", causeWrongScope, sender, fmt.Errorf("log offset %d from %q: %w", o, sender, err)
	}
	b, err = openBatch(d.Body[:0], e.cfg.Keys, table, keyID, d.Body)
	if err != nil {
		return nil, "", causeUnopened, sender, fmt.Errorf("log offset %d from %q: %w", o, sender, err)
	}
	origin, err = e.origin(d, b)
	if err == nil {
		err = checkWriter(b, origin)
	}
	if err != nil {
		if sender == "" {
			sender = b.Node
		}
		return nil, "", causeForgedWriter, sender, fmt.Errorf("log offset %d: %w", o, err)
	}
	_, _, validated := wire.ParseBrokerUser(d.UserId)
	if err := e.checkMember(table, origin, validated); err != nil {
		return nil, "", causeWrongScope, origin, fmt.Errorf("log offset %d: %w", o, err)
	}
	return b, origin, "", sender, nil
}

// sortChanges puts each change of a batch from origin into run: to
// apply now, to hold until the clock reaches it, or refused.
func (e *Engine) sortChanges(table, origin string, changes []Change, run *logApply) {
	// One reading of the clock for the batch (Observe reads it for each
	// cell: a tenth of a joiner's time on a virtual machine's clock).
	bound, now := e.clock.bound()
	var top Stamp
	defer func() { e.clock.passed(top) }()
	for _, ch := range changes {
		var err error
		for _, c := range ch.Cells {
			if c.Stamp > bound {
				err = fmt.Errorf("row %s of node %s: %w", ch.Row, c.Node, &ErrFuture{Stamp: c.Stamp, Ahead: c.Stamp.Wall().Sub(now), Max: e.clock.maxDrift})
				break
			}
		}
		if err == nil {
			for _, c := range ch.Cells {
				top = max(top, c.Stamp)
			}
		}
		var fut *ErrFuture
		switch {
		case err == nil:
			run.changes = append(run.changes, ch)
		case errors.As(err, &fut) && fut.Ahead > maxHoldAhead:
			e.refuse(table, causeFarFuture, origin, fmt.Errorf("%w; more than %s ahead, it is dropped", err, maxHoldAhead))
		default:
			e.refuse(table, causeFuture, origin, err)
			run.hold = append(run.hold, heldChange{from: origin, ch: ch})
		}
	}
}

func minStamp(changes []heldChange) Stamp {
	var m Stamp
	for _, h := range changes {
		if s := maxStamp(h.ch); m == 0 || s < m {
			m = s
		}
	}
	return m
}

// releaseHeld applies the held changes of table the clock reached.
func (e *Engine) releaseHeld(table string) error {
	e.mu.Lock()
	next := e.state(table).heldNext
	e.mu.Unlock()
	upTo := StampAt(e.clock.now().Add(e.clock.maxDrift))
	if next == 0 || next > upTo {
		return nil
	}
	applied, next, err := e.store.releaseHeld(table, upTo, e.observe)
	if err != nil {
		e.m.errors.WithLabelValues("store").Inc()
		return err
	}
	held := e.store.heldCount(table)
	e.mu.Lock()
	e.state(table).heldNext, e.state(table).held = next, held
	e.mu.Unlock()
	e.notifyAll(applied)
	return nil
}

// observe moves the clock past every stamp of ch, or refuses it.
func (e *Engine) observe(ch Change) error {
	for _, c := range ch.Cells {
		if err := e.clock.Observe(c.Stamp); err != nil {
			return fmt.Errorf("row %s of node %s: %w", ch.Row, c.Node, err)
		}
	}
	return nil
}

func offsetOf(d amqp.Delivery) uint64 {
	switch v := d.Headers[headerOffset].(type) {
	case int64:
		return uint64(v)
	case int32:
		return uint64(v)
	case int:
		return uint64(v)
	}
	return 0
}

// noteGap records that the log no longer held offsets from..to-1.
func (e *Engine) noteGap(table string, from, to uint64) {
	e.mu.Lock()
	e.state(table).gap = true
	e.state(table).wantSnap = true // what it missed is in the next snapshot
	e.mu.Unlock()
	e.log.Warn("rows: this node was away longer than the table's log keeps changes; it converges from the newest snapshot in the log (rows deleted before it may come back only if no snapshot recorded their deletion)",
		"table", table, "missed_from", from, "log_starts_at", to)
}

// maxOwn bounds the log messages of its own writes a node remembers
// until it reads them back.
const maxOwn = 4096

// noteOwn remembers a log message of this node's writes (body, as
// published, carrying n changes): reading it back, the node need not
// open and apply it again. A message is known by the hash of its whole
// sealed body, so a peer's message is never taken for one of this
// node's unless it is the same bytes, the same changes (a replay).
func (e *Engine) noteOwn(body []byte, n int) {
	h := sha256.Sum256(body)
	e.ownMu.Lock()
	defer e.ownMu.Unlock()
	if e.own == nil || len(e.own) >= maxOwn {
		// Not read back (the reader is away): forget them; they are
		// opened and applied as any message.
		e.own = map[[sha256.Size]byte]int{}
	}
	e.own[h] = n
}

// takeOwn reports whether body is a log message of this node's writes
// it remembers, and how many changes it carries, and forgets it.
func (e *Engine) takeOwn(body []byte) (int, bool) {
	e.ownMu.Lock()
	empty := len(e.own) == 0
	e.ownMu.Unlock()
	if empty {
		return 0, false
	}
	h := sha256.Sum256(body)
	e.ownMu.Lock()
	defer e.ownMu.Unlock()
	n, ok := e.own[h]
	delete(e.own, h)
	return n, ok
}

// awaitKey waits until this node holds a key of table's scope, if it is
// a member of it: a node new to the mesh (or to the scope) gets its keys
// from a peer a moment after it starts, and reading the log before would
// refuse every message as unopened and move past it for good. A node
// outside the scope reads at once (it refuses what it reads, and says
// so). It reports false when ctx ended first.
func (e *Engine) awaitKey(ctx context.Context, table string) bool {
	logged := false
	defer e.setWaiting(table, "")
	for {
		changed := e.cfg.Keys.Changed()
		e.mu.Lock()
		sp := e.tables[table]
		e.mu.Unlock()
		_, err := e.cfg.Keys.SealerFor(sp.Scope)
		if !errors.Is(err, seal.ErrNoKey) {
			return true
		}
		why := "a key of " + scopeName(sp.Scope) + ": a node holding it seals it for this node"
		e.setWaiting(table, why)
		if !logged {
			logged = true
			e.log.Info("rows: the table's log is read once this node holds its key", "table", table, "waiting_for", why)
		}
		// The keys' change wakes it; the table's scope may change too.
		select {
		case <-ctx.Done():
			return false
		case <-changed:
		case <-time.After(time.Second):
		}
	}
}

func (e *Engine) setWaiting(table, why string) {
	e.mu.Lock()
	e.state(table).waiting = why
	e.mu.Unlock()
}
