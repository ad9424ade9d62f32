package rows

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Verifying a snapshot. A node new to a table starts reading its log at
// the newest snapshot a member named, and holds the table once it read
// that snapshot and what follows it. The snapshot (and the offset that
// named it) is one member's word: a forged one could leave rows out. So
// the joiner then reads the log before the snapshot as well, in the
// background, and merges it: fields converge on their own, so reading a
// change twice changes nothing, and a change the snapshot lacked is
// applied now. Such a change means the snapshot did not hold what it
// claimed: it is counted (snapshot_disagrees), shown on the table and
// logged once, naming the snapshot's writer. Where the log has dropped
// its beginning (retention), the older snapshots still in it are read
// as well. The stretch left to read is saved, so a restart resumes it.

// verifyIdle and verifyAfter: the check of a snapshot starts once the
// reader has applied no run for verifyIdle, or verifyAfter after the
// snapshot was applied.
const (
	verifyIdle  = 250 * time.Millisecond
	verifyAfter = 10 * time.Second
)

// verifierRun is the start of a verifier's run. What it attests is
// recorded: the reader's commit of the snapshot's last claims may follow
// this one (settleClaims drops the record).
func verifierRun() logApply { return logApply{progress: kVerifyAt, recordAttest: true} }

// verifyLog reads table's log from offset at up to (not including) to,
// once the snapshot this node joined from is applied, then forgets the
// stretch. It returns when done, when ctx ends or the channel fails (the
// next session resumes).
func (e *Engine) verifyLog(ctx context.Context, conn *amqp.Connection, table string, at, to uint64) {
	e.setVerifying(table, true)
	defer e.setVerifying(table, false)
	// The joiner's own snapshot first: a change of the log before it
	// applied sooner would be no disagreement. An honest join offset is
	// where a snapshot starts, and its first part follows within a few
	// messages; one whose snapshot does not begin within snapshotWait
	// named none, and the log before it is all there is.
	began := time.Now()
	for {
		e.mu.Lock()
		st := e.state(table)
		switch {
		case !st.wantSnap:
		case st.takingSnap == "" && time.Since(began) > snapshotWait:
			// The join offset named no snapshot.
			st.wantSnap, st.snapWriter = false, ""
		case st.takingSnap != "" && time.Since(st.takingSince) > snapshotWait:
			// The snapshot stopped coming: what it lacks, the log has.
			st.wantSnap, st.takingSnap = false, ""
		}
		// Then the reader's catching up first: the check reads the
		// whole log before the snapshot, and beside a joiner's first
		// runs it would take half their time. Once the reader idles
		// (verifyIdle without a run), or verifyAfter past the snapshot
		// on a table that never idles.
		waiting := st.wantSnap
		if !waiting {
			if st.snapApplied.IsZero() {
				st.snapApplied = time.Now()
			}
			waiting = (st.inRun > 0 || time.Since(st.lastRun) < verifyIdle) && time.Since(st.snapApplied) < verifyAfter
		}
		e.mu.Unlock()
		if !waiting {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	lacked := 0
	complete := at == 0 // the log read from its first offset (set by the first delivery)
	finish := func() {
		undone, left, err := e.store.settleClaims(table, complete)
		if err == nil {
			err = e.store.setVerify(table, 0)
		}
		if err != nil {
			e.m.errors.WithLabelValues("store").Inc()
			e.log.Warn("rows: finishing the check of the table's snapshot failed; it is read again at the next start", "table", table, "err", err)
			return
		}
		e.mu.Lock()
		st := e.state(table)
		writer := st.snapWriter
		st.unattested, st.checking = left, false
		e.mu.Unlock()
		if undone > 0 {
			e.refuseN(table, causeSnapshot, writer, undone, fmt.Errorf("the snapshot this node joined from (written by %s) held %d field versions in other nodes' names that no change of the log made; they are undone", writer, undone))
			return
		}
		switch {
		case lacked > 0 && writer == "":
			e.refuseN(table, causeSnapshot, "", lacked, fmt.Errorf("the offset this node joined the log at named no snapshot, and the log before it held %d field versions; they are applied now", lacked))
			return
		case lacked > 0:
			e.refuseN(table, causeSnapshot, writer, lacked, fmt.Errorf("the snapshot this node joined from (written by %s) lacked %d field versions of the log before it; they are applied now", writer, lacked))
			return
		}
		e.log.Info("rows: the snapshot this node joined from holds every change of the log before it", "table", table, "up_to", to)
	}
	if at >= to {
		finish()
		return
	}
	// A failure leaves the stretch saved: the next session (or start)
	// reads it again; the table shows verifying meanwhile.
	failed := func(err error) {
		e.m.errors.WithLabelValues("broker").Inc()
		e.log.Warn("rows: checking the table's snapshot against its log stopped; the next session tries again", "table", table, "err", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		failed(err)
		return
	}
	// Closed with the connection (session) or below, which ends the
	// consumer: no context of its own (see newestSnapshot).
	ds, err := func() (<-chan amqp.Delivery, error) {
		if err := ch.Qos(readPrefetch, 0, false); err != nil {
			return nil, err
		}
		return ch.Consume(QueueOf(table), "", false, false, false, false, amqp.Table{"x-stream-offset": int64(at)})
	}()
	if err != nil {
		go func() { _ = ch.Close() }()
		failed(err)
		return
	}
	defer func() {
		go drain(ds)
		go func() { _ = ch.Close() }() // not waited for: see session
	}()
	first := true
	for {
		msgs, open := nextRun(ctx, ds, nil, nil)
		if !open || len(msgs) == 0 {
			return
		}
		run := verifierRun()
		done := false
		for i := range msgs {
			d := &msgs[i]
			o := offsetOf(*d)
			if complete && run.next == 0 && i == 0 && first && o > 0 {
				complete = false // the log no longer starts at its beginning
			}
			if o >= to {
				done = true
				break
			}
			run.next = o + 1
			b, origin, ok := e.openChecked(table, d, o)
			if !ok {
				continue
			}
			if b.Kind == kindChanges {
				run.attest = append(run.attest, b.Changes...)
			}
			e.sortChanges(table, origin, b.Changes, &run)
		}
		first = false
		if run.next > 0 {
			res, err := e.store.applyLog(table, run)
			if err != nil {
				e.m.errors.WithLabelValues("store").Inc()
				failed(err)
				return
			}
			for _, a := range res.applied {
				lacked += a.Count()
			}
			e.notifyAll(res.applied)
		}
		if err := ch.Ack(msgs[len(msgs)-1].DeliveryTag, true); err != nil {
			failed(err)
			return
		}
		if done {
			finish()
			return
		}
	}
}

// snapshotWait is how long a joiner waits for the first part of the
// snapshot its join offset names (a variable for tests).
var snapshotWait = 10 * time.Second

func (e *Engine) setVerifying(table string, on bool) {
	e.mu.Lock()
	e.state(table).verifying = on
	e.mu.Unlock()
}
