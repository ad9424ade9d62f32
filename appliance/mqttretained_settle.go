package appliance

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meshbox/meshbox/appliance/localnats"
	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats.go/jetstream"
)

func (mr *retainedMirror) markDirty(row string) {
	mr.dmu.Lock()
	mr.dirty[row] = true
	mr.dmu.Unlock()
	select {
	case mr.wake <- struct{}{}:
	default:
	}
}

// settler settles the rows that changed and tries the failed writes of
// the table again, until Close. A row whose settle fails is tried again
// after a pause of its own (retainedBackoffMin, doubling up to
// retainedBackoffMax): the other rows do not wait for it.
func (mr *retainedMirror) settler() {
	defer close(mr.done)
	retryAt := map[string]time.Time{}
	backoff := map[string]time.Duration{}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := time.Hour
		now := time.Now()
		for _, at := range retryAt {
			next = min(next, at.Sub(now))
		}
		mr.mu.Lock()
		if len(mr.retry) > 0 {
			next = min(next, retainedRetry)
		}
		mr.mu.Unlock()
		timer.Reset(max(next, 0))
		select {
		case <-mr.quit:
			return
		case <-mr.wake:
		case <-timer.C:
		}
		mr.retryRecords()
		mr.dmu.Lock()
		dirty := mr.dirty
		mr.dirty = map[string]bool{}
		mr.dmu.Unlock()
		now = time.Now()
		for row, at := range retryAt {
			if !now.Before(at) {
				dirty[row] = true
				delete(retryAt, row)
			}
		}
		for row := range dirty {
			if _, waiting := retryAt[row]; waiting {
				continue // tried again after its pause
			}
			err := mr.settle(row)
			if err == nil {
				delete(backoff, row)
				continue
			}
			select {
			case <-mr.quit:
				return // the connection closed under it
			default:
			}
			if errors.Is(err, errRetainedRecheck) {
				retryAt[row] = time.Now().Add(retainedRecheck)
				continue
			}
			b := backoff[row]
			if b == 0 {
				mr.log.Warn("a retained message of the mesh was not put into this node's MQTT store; retrying", "row", row, "err", err)
			}
			b = min(max(2*b, retainedBackoffMin), retainedBackoffMax)
			backoff[row], retryAt[row] = b, time.Now().Add(b)
			mr.m.errors.WithLabelValues("store").Inc()
		}
	}
}

// settle puts row's winner into the store when the store holds another
// retained message for its subject. It holds mr.mu only to read
// recorded, not across its calls on the store.
func (mr *retainedMirror) settle(row string) error {
	cells, err := mr.eng.Store().Row(wire.TableMQTTRetained, row)
	if err != nil {
		return err
	}
	if len(cells) == 0 {
		return nil
	}
	want, sc, err := retainedOf(row, cells)
	if err != nil {
		mr.refuse("bad_row", sc.Node, err)
		return nil
	}
	if err := mr.charge(row, sc.Node, len(want.Payload)); err != nil {
		mr.refuse("over_quota", sc.Node, err)
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var cur localnats.Retained
	msg, err := mr.stream.GetLastMsgForSubject(ctx, localnats.RetainedSubjectPrefix+want.Subject)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		// none, or a device's clear (the server deletes its own)
	case err != nil:
		return err
	default:
		if cur, err = localnats.DecodeRetained(msg.Subject, msg.Header, msg.Data); err != nil {
			mr.refuse("malformed", "", err)
		}
	}
	mr.mu.Lock()
	seen := mr.recorded[want.Subject] == retainedHash(cur)
	d, ok := mr.distrusted[want.Subject]
	distrusted := ok && d.hash == retainedHash(cur) && len(cur.Payload) > 0
	if ok && !distrusted && time.Since(d.at) > retainedRecheckFor {
		delete(mr.distrusted, want.Subject)
	}
	mr.mu.Unlock()
	if ok && !distrusted && time.Since(d.at) <= retainedRecheckFor {
		return errRetainedRecheck // heard before the stream stored it
	}
	if sameRetained(cur, want) {
		return nil
	}
	if cur.Origin != localnats.MeshOrigin && len(cur.Payload) > 0 && !seen {
		return nil // a device's publish not yet recorded: record writes it, and it wins
	}
	if sc.Node == mr.node && cur.Origin != localnats.MeshOrigin && !distrusted {
		return nil // this node's write came from this store
	}
	put := want
	put.Origin, put.Source = localnats.MeshOrigin, "node:"+sc.Node
	if _, err := mr.js.PublishMsg(ctx, localnats.EncodeRetained(put)); err != nil {
		return err
	}
	if distrusted {
		mr.mu.Lock()
		if mr.distrusted[want.Subject] == d {
			delete(mr.distrusted, want.Subject)
		}
		mr.mu.Unlock()
	}
	mr.m.applied.Inc()
	return nil
}

// charge charges row, of size bytes, to writer's quota, and frees what
// the row's earlier winner took; an error when it is past the quota. The
// node's own rows (its devices') are bounded by the store alone. Only
// the settler calls it.
func (mr *retainedMirror) charge(row, writer string, bytes int) error {
	if old, ok := mr.charged[row]; ok {
		u := mr.use[old.writer]
		u.rows, u.bytes = u.rows-1, u.bytes-old.bytes
		mr.use[old.writer] = u
		delete(mr.charged, row)
	}
	if writer == mr.node {
		return nil
	}
	u := mr.use[writer]
	if u.rows+1 > mr.quota.rows || u.bytes+bytes > mr.quota.bytes {
		return fmt.Errorf("row %s: node %s's retained messages in this node's store would pass its quota of %d topics and %d bytes: it is not put there", row, writer, mr.quota.rows, mr.quota.bytes)
	}
	u.rows, u.bytes = u.rows+1, u.bytes+bytes
	mr.use[writer] = u
	mr.charged[row] = retainedCharge{writer: writer, bytes: bytes}
	return nil
}

// logOnce logs a warning once per key (bounded, with refuse's).
func (mr *retainedMirror) logOnce(key, msg string, args ...any) {
	if mr.nlogged.Load() >= retainedRefusedLogs {
		return
	}
	if _, seen := mr.logged.LoadOrStore(key, true); !seen {
		mr.nlogged.Add(1)
		mr.log.Warn(msg, args...)
	}
}

// errKind names the kind of a failure of the table, for logOnce.
func errKind(err error) string {
	switch {
	case errors.Is(err, rows.ErrNoKey):
		return "no_key"
	case errors.Is(err, rows.ErrNoTable):
		return "no_table"
	case errors.Is(err, rows.ErrBadInput):
		return "bad_input"
	}
	return "store"
}

// refuse counts a retained message not carried, under cause, and logs it
// once per cause and party (a program or a node).
func (mr *retainedMirror) refuse(cause, party string, err error) {
	mr.m.refused.WithLabelValues(cause).Inc()
	mr.logOnce(cause+"\x00"+party, "a retained message is not carried across the mesh (logged once per cause and party)", "cause", cause, "party", party, "err", err)
}
