package rows

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The sync: one AMQP connection of its own to the broker, a confirmed
// publisher of the node's pending writes, and a consumer per table of
// its log (a stream queue), from the offset the store saved.

// Publishing the node's pending writes into the tables' logs, with
// confirms.

// publish sends the pending writes of every table and the snapshots the
// node writes, with confirms, until ctx ends.
func (e *Engine) publish(ctx context.Context, conn *amqp.Connection, user string, tables map[string]TableSpec) error {
	ch, err := confirmChannel(conn)
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, publishWindow*2))
	returns := ch.NotifyReturn(make(chan amqp.Return, publishWindow))
	type flight struct {
		table string
		seqs  []uint64
	}
	inflight := map[uint64]flight{}
	returned := map[string]bool{}
	warned := map[string]bool{}
	noLog := map[string]time.Time{}      // tables whose batch the broker returned, when
	noLogSince := map[string]time.Time{} // since when their batches come back
	sent := map[string]uint64{}
	var tag uint64
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	send := func() error {
		for _, t := range slices.Sorted(maps.Keys(tables)) {
			if time.Since(noLog[t]) < time.Second {
				continue // the broker returned its last batch: no log yet
			}
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
				e.mu.Lock()
				join := e.state(t).snapshotAt
				e.mu.Unlock()
				sealed := sealer.Seal(nil, sealAD(t, sealer.ID()), e.changesBatch(bodies, join))
				e.noteOwn(sealed, len(bodies))
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
		case r, ok := <-returns:
			if !ok {
				// The channel or its connection closed: the library closes
				// every notification channel (a receive from a closed one
				// is always ready; looping on it spun a core).
				return errors.New("publish channel closed")
			}
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
					case r, ok := <-returns:
						if !ok {
							break returns
						}
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
					delete(noLogSince, f.table)
				default: // nacked or returned: sent again
					delete(returned, strconv.FormatUint(c.DeliveryTag, 10))
					if f.seqs[0]-1 < sent[f.table] {
						sent[f.table] = f.seqs[0] - 1
					}
					if !c.Ack {
						e.m.errors.WithLabelValues("broker").Inc()
					} else {
						e.m.errors.WithLabelValues("no_log").Inc()
						if noLogSince[f.table].IsZero() {
							noLogSince[f.table] = time.Now()
						}
						// Right after a broker's restart its stream queues
						// take a moment to come back: only a table whose
						// batches keep coming back has no log.
						if !warned[f.table] && time.Since(noLogSince[f.table]) > noLogWarnAfter {
							warned[f.table] = true
							e.log.Warn("rows: the broker has no log for the table; its writes wait on this node (logged once per connection)", "table", f.table, "fix", "meshbox mesh table add "+f.table+" --broker-admin URL")
						}
						noLog[f.table] = time.Now() // its writes wait for the next tick
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

// noLogWarnAfter is how long a table's batches come back unroutable
// before the node says the broker has no log for it.
const noLogWarnAfter = 15 * time.Second

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

// changesBatch is the plaintext of a log message of the node's pending
// writes: a batch whose changes are the stored bodies as they are (each
// the JSON of a Change the node encoded when it took the write), spliced
// in rather than decoded and encoded again. A body that is not JSON (a
// damaged store) is left out and counted; the batch stays one readers
// can open.
func (e *Engine) changesBatch(bodies [][]byte, join uint64) []byte {
	head, _ := json.Marshal(batch{V: 1, Kind: kindChanges, Node: e.cfg.Node, Join: join})
	// head ends in "changes":null}: the changes go in its place.
	head = bytes.TrimSuffix(head, []byte(`"changes":null}`))
	head = append(head, `"changes":`...)
	n := len(head) + 2
	for _, b := range bodies {
		n += len(b) + 1
	}
	out := append(make([]byte, 0, n), head...)
	out = append(out, '[')
	first := true
	for _, b := range bodies {
		if !json.Valid(b) {
			e.m.errors.WithLabelValues("store").Inc()
			continue
		}
		if !first {
			out = append(out, ',')
		}
		out = append(out, b...)
		first = false
	}
	return append(out, ']', '}')
}

// confirmChannel opens a channel in confirm mode.
func confirmChannel(conn *amqp.Connection) (*amqp.Channel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, err
	}
	return ch, nil
}
