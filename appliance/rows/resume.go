package rows

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Resuming a log: a node that read a table's log before starts again at
// the last message it applied, and checks that the log is still the one
// it read. A log the broker deleted and made anew (an operator's
// mistake, a broker rebuilt) holds other messages, or fewer: the node
// then reads the new log from its start, and says so (log_replaced).
//
// Only the broker's answer counts as the log's end, never a silence: a
// broker just restarted recovers its streams before it delivers from
// them, which takes seconds, and minutes on a busy small machine. Taking
// that silence for a new log would read the whole log again and write a
// snapshot into it for nothing (and show a gap that is not there).

// resumeWait is how long a node resuming a table's log waits for the
// last message it applied, read again, before it asks the broker where
// the log ends (a variable for tests).
var resumeWait = 5 * time.Second

// endWait is how long a probe of the log's end waits for the broker's
// first delivery, and endQuiet how long for each one after it.
const (
	endWait  = 3 * time.Second
	endQuiet = 500 * time.Millisecond
)

// errLogReplaced ends a reader that found the table's log replaced.
var errLogReplaced = errors.New("the table's log on the broker was replaced")

// resumeCheck reads the first delivery of a reader that resumes at off
// (ds starts at off-1, the last message this node applied): the same
// message again (its body's hash is lastHash) means the log is the one
// this node read; a later one, that the log dropped what this node had
// not read (retention); another message at off-1, or a log whose end the
// broker shows before off-1 (logEnd), that the log was deleted and made
// anew. While the broker delivers nothing, the node waits, and its
// status says for what. A replaced log is forgotten (the node reads the
// new one from its start, after the session's retry) and shown; the node
// then writes a snapshot into the new log, so that nodes joining it find
// the table.
func (e *Engine) resumeCheck(ctx context.Context, conn *amqp.Connection, table string, off uint64, lastHash []byte, ds <-chan amqp.Delivery, ch *amqp.Channel) error {
	wait := time.NewTimer(resumeWait)
	defer wait.Stop()
	waiting := false
	defer func() {
		if waiting {
			e.setWaiting(table, "")
		}
	}()
	for {
		var d amqp.Delivery
		select {
		case <-ctx.Done():
			return nil
		case <-wait.C:
			end, found, err := e.logEnd(ctx, conn, table, off-1)
			if err != nil {
				return err
			}
			if found && end+1 < off {
				return e.logReplaced(table, fmt.Errorf("it ends at offset %d, before offset %d, the last this node read", end, off-1))
			}
			if !waiting {
				waiting = true
				why := fmt.Sprintf("the broker to deliver offset %d of the table's log, where this node resumes (a broker just started recovers its logs first)", off-1)
				e.setWaiting(table, why)
				e.log.Info("rows: the broker delivers nothing yet from where this node resumes the table's log; waiting", "table", table, "offset", off-1, "log_end_known", found)
			}
			wait.Reset(resumeWait)
			continue
		case got, open := <-ds:
			if !open {
				return fmt.Errorf("the log of table %s: consumer ended", table)
			}
			d = got
		}
		o := offsetOf(d)
		h := sha256.Sum256(d.Body)
		switch {
		case o+1 < off:
			// Before the one asked for (the start of its chunk, or a new
			// log's messages): not yet the answer.
			if err := ch.Ack(d.DeliveryTag, false); err != nil {
				return err
			}
			continue
		case o+1 == off && lastHash != nil && !bytes.Equal(h[:], lastHash):
			return e.logReplaced(table, fmt.Errorf("its message at offset %d is not the one this node read there", o))
		case o+1 == off:
			// The last message this node applied: already applied.
			return ch.Ack(d.DeliveryTag, false)
		default:
			e.noteGap(table, off, o)
			if err := e.applyLog(table, []amqp.Delivery{d}); err != nil {
				return err
			}
			return ch.Ack(d.DeliveryTag, false)
		}
	}
}

// logEnd asks the broker where table's log ends: a consumer from the
// log's last chunk takes the chunk's messages until one at or past want,
// or until none follows within endQuiet. found is false when the broker
// delivered nothing within endWait: an empty log, or one the broker does
// not serve yet. The offsets are the broker's own (a header no publisher
// sets), so what a message holds does not matter here.
func (e *Engine) logEnd(ctx context.Context, conn *amqp.Connection, table string, want uint64) (end uint64, found bool, err error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, false, fmt.Errorf("the log of table %s: a channel to find its end: %w", table, err)
	}
	// Closed, not cancelled: see newestSnapshot.
	defer func() {
		go func() { _ = ch.Close() }()
	}()
	if err := ch.Qos(readPrefetch, 0, false); err != nil {
		return 0, false, fmt.Errorf("the log of table %s: %w", table, err)
	}
	ds, err := ch.Consume(QueueOf(table), "", false, false, false, false, amqp.Table{"x-stream-offset": "last"})
	if err != nil {
		return 0, false, fmt.Errorf("the log of table %s: find its end: %w", table, err)
	}
	defer func() { go drain(ds) }()
	quiet := time.NewTimer(endWait)
	defer quiet.Stop()
	for {
		select {
		case <-ctx.Done():
			return end, found, nil
		case <-quiet.C:
			return end, found, nil
		case d, open := <-ds:
			if !open {
				return end, found, nil
			}
			end, found = max(end, offsetOf(d)), true
			if end >= want {
				return end, found, nil
			}
			_ = ch.Ack(d.DeliveryTag, false)
			quiet.Reset(endQuiet)
		}
	}
}

// logReplaced forgets where this node read table's log (why: how the
// log differs) and ends the reader.
func (e *Engine) logReplaced(table string, why error) error {
	if err := e.store.forgetOffset(table); err != nil {
		return err
	}
	e.refuse(table, causeLogReplaced, "", fmt.Errorf("%w: %v; this node reads the new log from its start and writes a snapshot into it", errLogReplaced, why))
	e.mu.Lock()
	st := e.state(table)
	st.gap, st.offset, st.lastNext = true, 0, 0
	st.sinceSnapshot = max(st.sinceSnapshot, e.cfg.SnapshotEvery)
	e.mu.Unlock()
	return fmt.Errorf("table %s: %w", table, errLogReplaced)
}
