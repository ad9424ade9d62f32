package rows

import (
	"crypto/sha256"
	"runtime"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Opening a run of log messages: each message is opened (unsealed,
// decoded, checked by the trust rules) on its own, so the messages of a
// run open side by side, one goroutine a core; what follows (snapshot
// parts, the clock, sorting into the run) takes them in log order.
//
// A joiner's read is opening and committing, and the commit of one run
// runs beside the opening of the next (readLog): opened on one core, the
// opening was the longer of the two (about 3 ms a message of 1,600 rows
// against 1.5 ms to commit it, on the 2-core machine of
// docs/performance.md), and the machine's other core half idle.

// openedMsg is one log message of a run, opened: this node's own (back
// from the log, not opened again), refused (err, with its cause and
// sender), or a batch from origin.
type openedMsg struct {
	own        bool
	ownChanges int
	b          *batch
	origin     string
	cause      string
	sender     string
	err        error
}

// openAll opens the messages of a run, side by side when there are
// several and more than one core (but one, kept for the commit when
// one runs: the reader waits on the commit, not on the opening); the
// result is in the run's order.
func (e *Engine) openAll(table string, msgs []amqp.Delivery, committing bool) []openedMsg {
	out := make([]openedMsg, len(msgs))
	var todo []int
	for i := range msgs {
		if n, ok := e.takeOwn(msgs[i].Body); ok {
			out[i].own, out[i].ownChanges = true, n
			continue
		}
		todo = append(todo, i)
	}
	open := func(i int) {
		m := &out[i]
		m.b, m.origin, m.cause, m.sender, m.err = e.check(table, &msgs[i], offsetOf(msgs[i]))
		if m.err == nil && m.b.Kind == kindSnapshot {
			// A snapshot's rows are mostly new to a node that reads it;
			// a change's row mostly held, merged with what it holds.
			preEncode(m.b.Changes)
		}
	}
	cores := runtime.GOMAXPROCS(0)
	if committing {
		cores--
	}
	workers := min(cores, len(todo))
	if workers <= 1 {
		for _, i := range todo {
			open(i)
		}
		return out
	}
	var wg sync.WaitGroup
	next := make(chan int, len(todo))
	for _, i := range todo {
		next <- i
	}
	close(next)
	for range workers {
		wg.Go(func() {
			for i := range next {
				open(i)
			}
		})
	}
	wg.Wait()
	return out
}

// openRun opens and checks a run of log messages of table, and sorts
// their changes: what commitRun then stores (committing: while the
// commit of the run before runs).
func (e *Engine) openRun(table string, msgs []amqp.Delivery, committing bool) logApply {
	run := logApply{progress: kOffset}
	last := uint64(0)
	e.mu.Lock()
	st := e.state(table)
	st.inRun++
	e.mu.Unlock()
	// The hash first: opening takes the bodies' bytes.
	h := sha256.Sum256(msgs[len(msgs)-1].Body)
	run.lastHash = h[:]
	opened := e.openAll(table, msgs, committing)
	n := 0
	for i := range opened {
		if opened[i].b != nil {
			n += len(opened[i].b.Changes)
		}
	}
	// Sized once: grown a change at a time, a joiner's run of 17,000
	// was copied over and over (an eighth of its opening).
	run.changes = make([]Change, 0, n)
	for i := range msgs {
		d := &msgs[i]
		o := offsetOf(*d)
		last = o
		m := &opened[i]
		if m.own {
			// This node's own writes, back from the log: its store has
			// them (it published them from there).
			e.mu.Lock()
			st.sinceSnapshot += m.ownChanges
			e.mu.Unlock()
			continue
		}
		if m.err != nil {
			e.refuse(table, m.cause, m.sender, m.err)
			continue
		}
		b, origin := m.b, m.origin
		if b.Kind == kindSnapshot {
			if !e.noteSnapshot(table, b, origin, o, d.Timestamp) {
				continue // this node holds what the snapshot holds
			}
			e.mu.Lock()
			checked := st.checking
			e.mu.Unlock()
			if checked {
				run.claims = append(run.claims, snapshotClaims(b.Changes, origin)...)
			}
		} else {
			e.mu.Lock()
			st.sinceSnapshot += len(b.Changes)
			checked := st.checking
			e.mu.Unlock()
			if checked {
				run.attest = append(run.attest, b.Changes...)
			}
		}
		e.sortChanges(table, origin, b.Changes, &run)
	}
	// Until the snapshot taken is whole, its claims may follow the
	// changes that attest them.
	e.mu.Lock()
	run.recordAttest = st.wantSnap
	e.mu.Unlock()
	run.next = last + 1
	return run
}
