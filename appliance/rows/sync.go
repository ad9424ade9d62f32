package rows

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/internal/backoff"
	"github.com/meshbox/meshbox/internal/brokerurl"
)

// The sync: one AMQP connection of its own to the broker, a confirmed
// publisher of the node's pending writes, and a consumer per table of
// its log (a stream queue), from the offset the store saved.

const (
	meshExchange = "mesh"
	// publishBatch is the most changes one log message carries;
	// publishWindow the log messages unconfirmed at once.
	publishBatch  = 128
	publishWindow = 64
	// applyBatch is the most log messages applied in one commit;
	// applyLinger how long a run waits for more after its first. The
	// library hands deliveries over one at a time on an unbuffered
	// channel: a receive that does not wait finds the next only if its
	// goroutine is already blocked on the send, and a reader behind the
	// log would commit one message at a time (a few hundred a second,
	// slower than the nodes write).
	applyBatch  = 512
	applyLinger = 2 * time.Millisecond
	// readPrefetch is the log messages a table's consumer holds unacked.
	readPrefetch = 2048
)

func (e *Engine) run() {
	defer close(e.done)
	retry := backoff.Policy{Min: time.Second, Max: 30 * time.Second}
	failures, next := 0, 0
	lastErr := ""
	for {
		url := ""
		if e.cfg.BrokerURL != nil {
			url = e.cfg.BrokerURL()
		}
		tables := e.Tables()
		if url == "" || e.cfg.Keys == nil || len(tables) == 0 {
			select {
			case <-e.quit:
				return
			case <-e.reconf:
			case <-time.After(5 * time.Second):
			}
			continue
		}
		// A broker setting may list several URLs (a cluster): the first
		// that answers, from the one that worked last.
		urls := brokerurl.Split(url)
		var err error
		began := time.Now()
		for i := range urls {
			u := urls[(next+i)%len(urls)]
			if err = e.session(u, tables); !isDialError(err) {
				next = (next + i) % len(urls)
				break
			}
		}
		if time.Since(began) > 30*time.Second {
			failures = 0 // it worked a while: the next try is soon
		}
		select {
		case <-e.quit:
			return
		default:
		}
		if err == nil {
			failures, lastErr = 0, ""
			continue
		}
		failures++
		e.m.errors.WithLabelValues("broker").Inc()
		if err.Error() != lastErr {
			lastErr = err.Error()
			e.log.Warn("rows: the link to the tables' logs failed; local reads and writes go on, writes wait for the broker", "err", err)
		}
		select {
		case <-e.quit:
			return
		case <-e.reconf:
		case <-e.linkUp:
			// The broker answers the bridge again: the next tries are
			// soon (its queues may still be starting).
			failures = 0
		case <-time.After(retry.Delay(failures)):
		}
	}
}

// session runs one connection until it fails (an error), the tables or
// the broker change (nil), or the engine closes.
func (e *Engine) session(rawURL string, tables map[string]TableSpec) error {
	conn, err := amqp.DialConfig(rawURL, amqp.Config{Heartbeat: 30 * time.Second,
		Properties: amqp.Table{"connection_name": "meshbox rows " + e.cfg.Node}})
	if err != nil {
		return &dialError{err}
	}
	defer func() { _ = conn.CloseDeadline(time.Now().Add(2 * time.Second)) }()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	user := ""
	if u, err := url.Parse(rawURL); err == nil && u.User != nil {
		user = u.User.Username()
	}
	if e.cfg.Declare {
		if err := e.declare(conn, slices.Collect(maps.Keys(tables))); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, len(tables)+1)
	var wg sync.WaitGroup
	for t := range tables {
		wg.Add(1)
		go func() { // exits when ctx ends or its channel closes
			defer wg.Done()
			errs <- e.readLog(ctx, conn, t)
		}()
	}
	wg.Add(1)
	go func() { // exits when ctx ends or its channel closes
		defer wg.Done()
		errs <- e.publish(ctx, conn, user, tables)
	}()
	// On the way out: stop the parts, close the connection (which ends
	// their channels: a channel's own close can wait forever on a stream
	// consumer's deliveries), then wait for them.
	defer wg.Wait()
	defer func() { _ = conn.CloseDeadline(time.Now().Add(2 * time.Second)) }()
	defer cancel()
	e.log.Info("rows: reading the tables' logs", "tables", len(tables))
	select {
	case <-e.quit:
		return nil
	case <-e.reconf:
		return nil
	case err := <-closed:
		if err == nil {
			return errors.New("connection closed")
		}
		return err
	case err := <-errs:
		if err == nil {
			err = errors.New("a table's reader ended")
		}
		return err
	}
}

// declare makes the tables' stream queues and bindings (a mesh on one
// credential, whose nodes may).
func (e *Engine) declare(conn *amqp.Connection, tables []string) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	if err := ch.ExchangeDeclare(meshExchange, "topic", true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", meshExchange, err)
	}
	for _, t := range tables {
		if _, err := ch.QueueDeclare(QueueOf(t), true, false, false, false, StreamArgs(e.cfg.MaxAge, e.cfg.MaxBytes)); err != nil {
			return fmt.Errorf("declare the log of table %s: %w", t, err)
		}
		if err := ch.QueueBind(QueueOf(t), QueueOf(t), meshExchange, false, nil); err != nil {
			return fmt.Errorf("bind the log of table %s: %w", t, err)
		}
	}
	return nil
}

// StreamArgs are the arguments of a table's stream queue: retention by
// age and size, in segments small enough for retention to bite.
func StreamArgs(maxAge time.Duration, maxBytes int64) amqp.Table {
	return amqp.Table{
		"x-queue-type":                    "stream",
		"x-max-age":                       strconv.FormatInt(int64(maxAge/time.Second), 10) + "s",
		"x-max-length-bytes":              maxBytes,
		"x-stream-max-segment-size-bytes": int64(min(maxBytes/4, 16<<20)),
	}
}

// readLog consumes table's log from the saved offset (a node that never
// read it: from the newest snapshot a writer named, else from the start),
// applying what it reads.
func (e *Engine) readLog(ctx context.Context, conn *amqp.Connection, table string) error {
	off, ok, err := e.store.Offset(table)
	if err != nil {
		return err
	}
	var start any = "first"
	if ok {
		start = int64(off)
	} else if s, found := e.newestSnapshot(ctx, conn, table); found {
		start = int64(s)
		e.log.Info("rows: joining a table from its newest snapshot", "table", table, "offset", s)
	}
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	// Closed with the connection (session).
	if err := ch.Qos(readPrefetch, 0, false); err != nil {
		return err
	}
	ds, err := ch.ConsumeWithContext(ctx, QueueOf(table), "", false, false, false, false, amqp.Table{"x-stream-offset": start})
	if err != nil {
		return fmt.Errorf("read the log of table %s: %w (meshbox mesh table add %s makes it on the broker)", table, err, table)
	}
	// Deliveries the reader no longer takes would hold the connection's
	// reader, and with it the channel's close, forever.
	defer func() { go drain(ds) }()
	e.mu.Lock()
	st := e.state(table)
	st.connected, st.offset = true, off
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.state(table).connected = false
		e.mu.Unlock()
	}()
	first := true
	var held []heldChange
	retryHeld := time.NewTicker(time.Second)
	defer retryHeld.Stop()
	for {
		var msgs []amqp.Delivery
		select {
		case <-ctx.Done():
			return nil
		case <-retryHeld.C:
			if held, err = e.applyHeld(table, held); err != nil {
				return err
			}
			continue
		case d, open := <-ds:
			if !open {
				return fmt.Errorf("the log of table %s: consumer ended", table)
			}
			msgs = append(msgs, d)
		}
		linger := time.NewTimer(applyLinger)
	more:
		for len(msgs) < applyBatch {
			select {
			case d, open := <-ds:
				if !open {
					break more
				}
				msgs = append(msgs, d)
			case <-linger.C:
				break more
			}
		}
		linger.Stop()
		if first && ok {
			if o := offsetOf(msgs[0]); o > off {
				e.noteGap(table, off, o)
			}
		}
		first = false
		var err error
		if held, err = e.applyLog(table, msgs, held); err != nil {
			return err
		}
		if err := ch.Ack(msgs[len(msgs)-1].DeliveryTag, true); err != nil {
			return err
		}
	}
}

// heldChange is a change stamped too far ahead of this node's clock, kept
// until the clock reaches it; the saved offset stays at or before it, so
// that a restart reads it again.
type heldChange struct {
	offset uint64
	ch     Change
}

// applyLog applies a run of log messages of table.
func (e *Engine) applyLog(table string, msgs []amqp.Delivery, held []heldChange) ([]heldChange, error) {
	var changes []Change
	last := uint64(0)
	e.mu.Lock()
	st := e.state(table)
	e.mu.Unlock()
	for _, d := range msgs {
		o := offsetOf(d)
		last = o
		keyID, _ := d.Headers[headerKey].(string)
		b, err := openBatch(e.cfg.Keys, table, keyID, d.Body)
		if err != nil {
			e.refuse(table, "unopened", fmt.Errorf("log offset %d from %s: %w", o, d.UserId, err))
			continue
		}
		if s, ok := d.Headers[headerSnapshot].(int64); ok && s > 0 {
			e.mu.Lock()
			if uint64(s) > st.snapshotAt {
				st.snapshotAt = uint64(s)
			}
			e.mu.Unlock()
		}
		if b.Kind == kindSnapshot {
			e.noteSnapshot(table, b, o, d.Timestamp)
		} else {
			e.mu.Lock()
			st.sinceSnapshot += len(b.Changes)
			e.mu.Unlock()
		}
		for _, ch := range b.Changes {
			if err := e.observe(ch); err != nil {
				e.refuse(table, "future", err)
				held = append(held, heldChange{offset: o, ch: ch})
				continue
			}
			changes = append(changes, ch)
		}
	}
	next := last + 1
	for _, h := range held {
		next = min(next, h.offset)
	}
	applied, err := e.store.Apply(table, changes, next)
	if err != nil {
		e.m.errors.WithLabelValues("store").Inc()
		return held, fmt.Errorf("apply the log of table %s: %w", table, err)
	}
	e.mu.Lock()
	st.offset = next
	st.last = max(st.last, last)
	// Due past SnapshotEvery changes, or when the newest snapshot is a
	// quarter of the log's retention old: the log must always hold one.
	due := st.sinceSnapshot >= e.cfg.SnapshotEvery ||
		st.sinceSnapshot > 0 && !st.snapshotTime.IsZero() && time.Since(st.snapshotTime) > e.cfg.MaxAge/4
	e.mu.Unlock()
	for _, a := range applied {
		e.m.applied.Add(float64(len(a.Won)))
		e.notify(a)
	}
	if due {
		e.snapshotSoon(table)
	}
	return held, nil
}

// applyHeld applies the held changes the clock reached.
func (e *Engine) applyHeld(table string, held []heldChange) ([]heldChange, error) {
	if len(held) == 0 {
		return held, nil
	}
	var ready []Change
	var still []heldChange
	for _, h := range held {
		if e.observe(h.ch) == nil {
			ready = append(ready, h.ch)
		} else {
			still = append(still, h)
		}
	}
	if len(ready) == 0 {
		return held, nil
	}
	e.mu.Lock()
	next := e.state(table).last + 1
	e.mu.Unlock()
	for _, h := range still {
		next = min(next, h.offset)
	}
	applied, err := e.store.Apply(table, ready, next)
	if err != nil {
		return held, err
	}
	e.mu.Lock()
	e.state(table).offset = next
	e.mu.Unlock()
	for _, a := range applied {
		e.notify(a)
	}
	return still, nil
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
	e.mu.Unlock()
	e.log.Warn("rows: this node was away longer than the table's log keeps changes; it converges from the newest snapshot in the log (rows deleted before it may come back only if no snapshot recorded their deletion)",
		"table", table, "missed_from", from, "log_starts_at", to)
}

// newestSnapshot finds, from the newest message of table's log, where the
// newest complete snapshot its writer knew starts.
func (e *Engine) newestSnapshot(ctx context.Context, conn *amqp.Connection, table string) (uint64, bool) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, false
	}
	defer func() {
		go func() { _ = ch.Close() }() // not waited for: see session
	}()
	if err := ch.Qos(1, 0, false); err != nil {
		return 0, false
	}
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	ds, err := ch.ConsumeWithContext(cctx, QueueOf(table), "", false, false, false, false, amqp.Table{"x-stream-offset": "last"})
	if err != nil {
		return 0, false
	}
	defer func() { go drain(ds) }()
	select {
	case d, ok := <-ds:
		if !ok {
			return 0, false
		}
		if s, ok := d.Headers[headerSnapshot].(int64); ok && s > 0 {
			return uint64(s), true
		}
	case <-cctx.Done():
	}
	return 0, false
}

// noteSnapshot follows the parts of a snapshot in the log: once all of a
// snapshot's parts are read, it is the newest.
func (e *Engine) noteSnapshot(table string, b *batch, offset uint64, at time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.state(table)
	if b.Part == 1 {
		st.snapshotPending, st.snapshotFirst = b.Snap, min(b.From, offset)
	}
	if b.Part == b.Parts && st.snapshotPending == b.Snap {
		// A node that starts at the first part would miss the changes
		// its writer had not read yet when it took the snapshot.
		start := st.snapshotFirst
		if b.From > 0 && b.From < start {
			start = b.From
		}
		st.snapshotAt, st.sinceSnapshot, st.snapshotTime = start, 0, at
		if at.IsZero() {
			st.snapshotTime = time.Now()
		}
	}
}

// snapshotSoon schedules a snapshot of table: after a wait of this node's
// own (so that nodes that saw the same log do not all write one), unless
// another node's snapshot arrives first.
func (e *Engine) snapshotSoon(table string) {
	e.mu.Lock()
	st := e.state(table)
	if st.snapshotQueued || time.Since(st.lastSnapshot) < time.Minute {
		e.mu.Unlock()
		return
	}
	st.snapshotQueued = true
	e.mu.Unlock()
	h := fnv.New32a()
	_, _ = h.Write([]byte(e.cfg.Node))
	wait := time.Second + time.Duration(h.Sum32()%5000)*time.Millisecond
	time.AfterFunc(wait, func() {
		e.mu.Lock()
		st := e.state(table)
		st.snapshotQueued = false
		due := st.sinceSnapshot >= e.cfg.SnapshotEvery ||
			st.sinceSnapshot > 0 && !st.snapshotTime.IsZero() && time.Since(st.snapshotTime) > e.cfg.MaxAge/4
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

// publish sends the pending writes of every table and the snapshots the
// node writes, with confirms, until ctx ends.
func (e *Engine) publish(ctx context.Context, conn *amqp.Connection, user string, tables map[string]TableSpec) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, publishWindow*2))
	returns := ch.NotifyReturn(make(chan amqp.Return, publishWindow))
	type flight struct {
		table string
		seqs  []uint64
	}
	inflight := map[uint64]flight{}
	returned := map[string]bool{}
	warned := map[string]bool{}
	sent := map[string]uint64{}
	var tag uint64
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	send := func() error {
		for _, t := range slices.Sorted(maps.Keys(tables)) {
			for len(inflight) < publishWindow {
				seqs, bodies, err := e.store.Pending(t, sent[t], publishBatch)
				if err != nil {
					return err
				}
				if len(seqs) == 0 {
					break
				}
				sealer, err := e.cfg.Keys.SealerFor(tables[t].Scope)
				if err != nil {
					e.m.errors.WithLabelValues("no_key").Inc()
					break // kept until the node holds the key
				}
				b := batch{V: 1, Kind: kindChanges, Node: e.cfg.Node}
				for _, body := range bodies {
					var c Change
					if err := json.Unmarshal(body, &c); err == nil {
						b.Changes = append(b.Changes, c)
					}
				}
				sealed, err := sealBatch(sealer, t, &b)
				if err != nil {
					return err
				}
				tag++
				inflight[tag] = flight{t, seqs}
				sent[t] = seqs[len(seqs)-1]
				if err := ch.PublishWithContext(ctx, meshExchange, QueueOf(t), true, false, e.publishing(t, sealer.ID(), user, sealed, tag)); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for {
		if err := send(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-e.wake:
		case <-tick.C:
		case t := <-e.snapshots:
			if _, ok := tables[t]; ok {
				if err := e.writeSnapshot(ctx, conn, t, tables[t], user); err != nil {
					e.log.Warn("rows: a snapshot of the table failed; the next change past the threshold tries again", "table", t, "err", err)
				}
			}
		case r := <-returns:
			returned[r.MessageId] = true
		case c, ok := <-confirms:
			if !ok {
				return errors.New("publish channel closed")
			}
			done := map[string][]uint64{}
			for {
				// A return comes before its message's confirm on the wire,
				// and the library queued it first: take every return
				// waiting before judging the confirm.
			returns:
				for {
					select {
					case r := <-returns:
						returned[r.MessageId] = true
					default:
						break returns
					}
				}
				f, known := inflight[c.DeliveryTag]
				delete(inflight, c.DeliveryTag)
				switch {
				case !known:
				case c.Ack && !returned[strconv.FormatUint(c.DeliveryTag, 10)]:
					done[f.table] = append(done[f.table], f.seqs...)
				default: // nacked or returned: sent again
					delete(returned, strconv.FormatUint(c.DeliveryTag, 10))
					if f.seqs[0]-1 < sent[f.table] {
						sent[f.table] = f.seqs[0] - 1
					}
					if !c.Ack {
						e.m.errors.WithLabelValues("broker").Inc()
					} else {
						e.m.errors.WithLabelValues("no_log").Inc()
						if !warned[f.table] {
							warned[f.table] = true
							e.log.Warn("rows: the broker has no log for the table; its writes wait on this node (logged once per connection)", "table", f.table, "fix", "meshbox mesh table add "+f.table+" --broker-admin URL")
						}
						time.Sleep(time.Second)
					}
				}
				select {
				case c, ok = <-confirms:
					if ok {
						continue
					}
				default:
				}
				break
			}
			for t, seqs := range done {
				if err := e.store.Confirmed(t, seqs); err != nil {
					return err
				}
				e.m.published.Add(float64(len(seqs)))
			}
		}
	}
}

// publishing is a log message of table.
func (e *Engine) publishing(table, keyID, user string, body []byte, tag uint64) amqp.Publishing {
	h := amqp.Table{headerKey: keyID}
	e.mu.Lock()
	if s := e.state(table).snapshotAt; s > 0 {
		h[headerSnapshot] = int64(s)
	}
	e.mu.Unlock()
	return amqp.Publishing{DeliveryMode: amqp.Persistent, Type: "rows", Headers: h, Body: body,
		MessageId: strconv.FormatUint(tag, 10), UserId: user, Timestamp: time.Now()}
}

// writeSnapshot writes table's whole state into its log, in parts, with
// confirms, on a channel of its own.
func (e *Engine) writeSnapshot(ctx context.Context, conn *amqp.Connection, table string, spec TableSpec, user string) error {
	sealer, err := e.cfg.Keys.SealerFor(spec.Scope)
	if err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	// Everything before the offset the reader is at is in the store, so
	// in the snapshot; what follows it may not be.
	e.mu.Lock()
	from := e.state(table).offset
	e.mu.Unlock()
	var parts [][]Change
	var cur []Change
	size := 0
	if err := e.store.Rows(table, "", func(row string, cells map[string]Cell) bool {
		c := Change{Table: table, Row: row, Cells: map[string]WireCell{}}
		for f, cell := range cells {
			c.Cells[f] = WireCell{Stamp: cell.Stamp, Node: cell.Node, Deleted: cell.Deleted, Value: cell.Value}
			size += len(f) + len(cell.Value) + 40
		}
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
	for i, p := range parts {
		b := batch{V: 1, Kind: kindSnapshot, Node: e.cfg.Node, Snap: id, Part: i + 1, Parts: len(parts), From: from, Changes: p}
		sealed, err := sealBatch(sealer, table, &b)
		if err != nil {
			return err
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, meshExchange, QueueOf(table), false, false, e.publishing(table, sealer.ID(), user, sealed, 0))
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

// drain takes deliveries until the library closes the channel.
func drain(ds <-chan amqp.Delivery) {
	for range ds {
	}
}

// dialError is a session that did not connect.
type dialError struct{ err error }

func (e *dialError) Error() string { return "connect: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

func isDialError(err error) bool {
	var d *dialError
	return errors.As(err, &d)
}
