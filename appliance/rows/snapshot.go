package rows

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The sync: one AMQP connection of its own to the broker, a confirmed
// publisher of the node's pending writes, and a consumer per table of
// its log (a stream queue), from the offset the store saved.

// Snapshots (compaction): writing one into a table's log, following
// those others write, and finding where a node new to the log starts.

// snapshotGap is the least time between two snapshots a node writes (a
// variable for tests).
var snapshotGap = time.Minute

// newestSnapshot finds, from the newest message of table's log, where the
// newest complete snapshot its writer knew starts. The answer is a
// member's word: a joiner checks it (verify.go).
func (e *Engine) newestSnapshot(ctx context.Context, conn *amqp.Connection, table string) (uint64, bool) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, false
	}
	// The channel's close cancels the consumer on the broker; a cancel of
	// our own beside it (a consumer's context) would race the close and
	// cost the connection (CHANNEL_ERROR - expected 'channel.open').
	defer func() {
		go func() { _ = ch.Close() }() // not waited for: see session
	}()
	if err := ch.Qos(1, 0, false); err != nil {
		return 0, false
	}
	ds, err := ch.Consume(QueueOf(table), "", false, false, false, false, amqp.Table{"x-stream-offset": "last"})
	if err != nil {
		return 0, false
	}
	defer func() { go drain(ds) }()
	wait := time.NewTimer(3 * time.Second)
	defer wait.Stop()
	select {
	case d, ok := <-ds:
		if !ok {
			return 0, false
		}
		// The header is anyone's word (any node may publish into the log,
		// one outside the table's scope too): only the sealed offset of
		// a message that opens with the table's key, from its validated
		// writer, counts, and only one before the message.
		o := offsetOf(d)
		b, _, cause, _, err := e.check(table, &d, o)
		if err != nil {
			// Counted when the reader reaches it.
			e.log.Warn("rows: the newest message of the table's log is refused; joining from the log's first message", "table", table, "cause", cause, "err", err)
			return 0, false
		}
		if b.Join > 0 && b.Join <= o {
			return b.Join, true
		}
	case <-wait.C:
	case <-ctx.Done():
	}
	return 0, false
}

// snapProgress is a snapshot whose parts are being read: the next part
// expected, where it starts (its first part's offset, or its From when
// earlier), and when a part of it was last read.
type snapProgress struct {
	next  int
	first uint64
	seen  time.Time
}

// maxSnapsPending bounds the snapshots a reader follows at once.
const maxSnapsPending = 16

// noteSnapshot follows the parts of a snapshot from origin in the log,
// each snapshot by its sender and id, its parts in order: once all of a
// snapshot's parts are read, it is the newest. A part out of order ends
// the snapshot it belongs to. It reports whether this node applies the
// part's cells (it wants a snapshot, and this is the first whole one it
// reads; one that stops coming for snapshotWait is given up for the
// next).
func (e *Engine) noteSnapshot(table string, b *batch, origin string, offset uint64, at time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.state(table)
	if st.snaps == nil {
		st.snaps = map[string]*snapProgress{}
	}
	key, now := origin+"/"+b.Snap, time.Now()
	if b.Part == 1 {
		if len(st.snaps) >= maxSnapsPending {
			oldest := ""
			for k, p := range st.snaps {
				if oldest == "" || p.seen.Before(st.snaps[oldest].seen) {
					oldest = k
				}
			}
			delete(st.snaps, oldest)
		}
		st.snaps[key] = &snapProgress{next: 1, first: min(b.From, offset), seen: now}
		if st.wantSnap && (st.takingSnap == "" || now.Sub(st.takingSince) > snapshotWait) {
			st.takingSnap, st.snapWriter, st.takingSince = key, origin, now
		}
	}
	sp := st.snaps[key]
	if sp == nil || b.Part != sp.next {
		delete(st.snaps, key)
		if st.takingSnap == key {
			st.takingSnap = "" // the next whole one is taken
		}
		return false
	}
	sp.next++
	sp.seen = now
	apply := st.takingSnap == key
	if apply {
		st.takingSince = now
	}
	if b.Part == b.Parts {
		delete(st.snaps, key)
		// A node that starts at the first part would miss the changes
		// its writer had not read yet when it took the snapshot.
		start := sp.first
		if b.From > 0 && b.From < start {
			start = b.From
		}
		st.snapshotAt, st.sinceSnapshot, st.snapshotTime = start, 0, at
		if at.IsZero() {
			st.snapshotTime = now
		}
		if apply {
			st.takingSnap, st.wantSnap = "", false
		}
	}
	return apply
}

// snapshotSoon schedules a snapshot of table: after a wait of this node's
// own (so that nodes that saw the same log do not all write one), unless
// another node's snapshot arrives first. A node writes at most one a
// minute (snapshotGap); one due sooner waits for the minute to pass
// rather than being dropped, so that a burst of writes is compacted once
// it ends, not at the next write after it.
func (e *Engine) snapshotSoon(table string) {
	e.mu.Lock()
	st := e.state(table)
	if st.snapshotQueued {
		e.mu.Unlock()
		return
	}
	st.snapshotQueued = true
	gap := time.Until(st.lastSnapshot.Add(snapshotGap))
	if st.lastSnapshot.IsZero() {
		gap = 0
	}
	e.mu.Unlock()
	h := fnv.New32a()
	_, _ = h.Write([]byte(e.cfg.Node))
	wait := max(gap, 0) + time.Second + time.Duration(h.Sum32()%5000)*time.Millisecond
	time.AfterFunc(wait, func() {
		e.mu.Lock()
		st := e.state(table)
		st.snapshotQueued = false
		due := e.snapshotDue(st)
		// A replica that may still lack changes (it waits for a snapshot,
		// or checks the one it joined from) writes none.
		due = due && !st.wantSnap && !st.verifying
		if due {
			st.lastSnapshot = time.Now()
		}
		e.mu.Unlock()
		if due {
			select {
			case e.snapshots <- table:
			default:
			}
		}
	})
}

// snapshotDue reports whether table's log needs a snapshot (st is its
// state, e.mu held): past SnapshotEvery changes since the newest one, or
// changes since a newest one a quarter of the log's retention old (the
// log must always hold one).
func (e *Engine) snapshotDue(st *tableState) bool {
	return st.sinceSnapshot >= e.cfg.SnapshotEvery ||
		st.sinceSnapshot > 0 && !st.snapshotTime.IsZero() && time.Since(st.snapshotTime) > e.cfg.MaxAge/4
}

// snapshotCheck is how often the snapshot clock asks whether a snapshot
// is due.
const snapshotCheck = time.Second

// snapshotClock schedules a snapshot of every table whose log this node
// reads once one is due, until the engine closes. A commit of the reader
// schedules one too (the count), but the age of the newest snapshot
// passes its bound without a run: after the last run of a stream of
// writes, or once a snapshot held back while this node verified or
// waited for one may be written, no commit comes to schedule it.
func (e *Engine) snapshotClock() {
	defer close(e.clockDone)
	tick := time.NewTicker(snapshotCheck)
	defer tick.Stop()
	for {
		select {
		case <-e.quit:
			return
		case <-tick.C:
		}
		var due []string
		e.mu.Lock()
		for t, st := range e.status {
			if st.connected && !st.snapshotQueued && e.snapshotDue(st) {
				due = append(due, t)
			}
		}
		e.mu.Unlock()
		for _, t := range due {
			e.snapshotSoon(t)
		}
	}
}

// writeSnapshot writes table's whole state into its log, in parts, with
// confirms, on a channel of its own.
func (e *Engine) writeSnapshot(ctx context.Context, conn *amqp.Connection, table string, spec TableSpec, user string) error {
	sealer, err := e.cfg.Keys.SealerFor(spec.Scope)
	if err != nil {
		return err
	}
	ch, err := confirmChannel(conn)
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	// Everything before the offset the reader is at is in the store, so
	// in the snapshot; what follows it may not be.
	e.mu.Lock()
	from := e.state(table).offset
	e.mu.Unlock()
	var parts [][]Change
	var cur []Change
	size := 0
	if err := e.store.Rows(table, "", func(row string, cells map[string]Cell) bool {
		c := Change{Table: table, Row: row, Cells: make(Cells, 0, len(cells))}
		for f, cell := range cells {
			c.Cells = append(c.Cells, FieldCell{f, WireCell{Stamp: cell.Stamp, Node: cell.Node, Deleted: cell.Deleted, Value: cell.Value}})
			size += len(f) + len(cell.Value) + 40
		}
		c.Cells = sortCells(c.Cells)
		cur = append(cur, c)
		if size > 256<<10 {
			parts, cur, size = append(parts, cur), nil, 0
		}
		return true
	}); err != nil {
		return err
	}
	if len(cur) > 0 || len(parts) == 0 {
		parts = append(parts, cur)
	}
	id := strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + e.cfg.Node
	v := 1 // JSON, while a node that may read it reads nothing else
	if e.cfg.BinaryParts != nil && e.cfg.BinaryParts() {
		v = snapshotV
	}
	e.mu.Lock()
	newest := e.state(table).snapshotAt
	e.mu.Unlock()
	for i, p := range parts {
		join := newest
		if i == len(parts)-1 && from > 0 {
			join = from
		}
		b := batch{V: v, Kind: kindSnapshot, Node: e.cfg.Node, Snap: id, Part: i + 1, Parts: len(parts), From: from, Join: join, Changes: p}
		sealed, err := sealBatch(sealer, table, &b)
		if err != nil {
			return err
		}
		msg := e.publishing(table, sealer.ID(), user, sealed, 0)
		if i == len(parts)-1 && from > 0 {
			// With its last part the snapshot is whole: a node new to
			// the log reads from where it starts, not from the one
			// before it (and every change since).
			msg.Headers[headerSnapshot] = int64(from)
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, meshExchange, QueueOf(table), false, false, msg)
		if err != nil {
			return err
		}
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return fmt.Errorf("snapshot part %d of %d not confirmed: %v", i+1, len(parts), err)
		}
	}
	e.m.snapshots.Inc()
	e.log.Info("rows: wrote a snapshot of the table into its log", "table", table, "parts", len(parts))
	return nil
}
