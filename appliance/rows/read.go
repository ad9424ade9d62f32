package rows

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/internal/seal"
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
		if n, ok := e.takeOwn(d.Body); ok {
			// This node's own writes, back from the log: its store has
			// them (it published them from there).
			e.mu.Lock()
			st.sinceSnapshot += n
			e.mu.Unlock()
			continue
		}
		keyID, _ := d.Headers[headerKey].(string)
		b, err := openBatch(e.cfg.Keys, table, keyID, d.Body)
		if err != nil {
			e.refuse(table, "unopened", fmt.Errorf("log offset %d from %s: %w", o, d.UserId, err))
			continue
		}
		if b.Join > 0 && b.Join <= o {
			e.mu.Lock()
			st.snapshotAt = max(st.snapshotAt, b.Join)
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
		select {
		case <-ctx.Done():
			return false
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (e *Engine) setWaiting(table, why string) {
	e.mu.Lock()
	e.state(table).waiting = why
	e.mu.Unlock()
}
