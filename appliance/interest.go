package appliance

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// How often the watcher of local interest looks whether a subscription
// changed. A look costs one read of the server's counters, but every
// wake-up of an idle process costs CPU of its own (tens of microseconds on
// a small machine): so the watcher looks every interestPollBusy while
// subscriptions move and for interestBusyFor after, and every
// interestPollIdle otherwise. A program that starts on a quiet node is
// seen within interestPollIdle; its further subscriptions, and any change
// while the node is busy, within interestPollBusy.
const (
	interestPollBusy = 100 * time.Millisecond
	interestPollIdle = time.Second
	interestBusyFor  = 10 * time.Second
)

// declareTimeout bounds the bridge's declaration of newly hosted stages on
// a change of local interest.
const declareTimeout = 10 * time.Second

// interestWatcher is the one reader of what local programs host: the
// cap.* and work.* subjects they subscribe to on the embedded NATS
// server. The appliance hands every change to the bridge and then to the
// node, so both see the same snapshot at once and a stage is routable
// before its program's capabilities are advertised.
//
// The NATS server tells nobody when a subscription changes. The cheapest
// honest sign it offers is its subscription list's counters: every
// insertion and every removal bumps one of two monotonic counts. The
// watcher reads them (Subsz without subscription details) now and then
// (see interestPollBusy) and takes a full snapshot only when they moved; a
// snapshot equal to the last one is not reported.
//
// Only check and snapshot touch last and subjects, from one goroutine at a
// time (Start, then the watch goroutine).
type interestWatcher struct {
	srv     *server.Server
	account string // the account local programs use

	mu  sync.Mutex
	own []*nats.Conn // the node's own connections: their subscriptions host nothing

	seen     bool
	last     subCounts
	subjects []string
}

// subCounts are the monotonic counters of the account's subscription list.
type subCounts struct{ inserts, removes uint64 }

func newInterestWatcher(srv *server.Server) *interestWatcher {
	return &interestWatcher{srv: srv, account: srv.GlobalAccount().GetName()}
}

// exclude says nc is one of the node's own connections (the API, the
// bridge and its stand-ins): its subscriptions never count as hosted
// here. Its client id is read at each snapshot, so a reconnect is
// followed.
func (w *interestWatcher) exclude(nc *nats.Conn) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.own = append(w.own, nc)
}

// counts reads the account's subscription counters.
func (w *interestWatcher) counts() (subCounts, error) {
	sz, err := w.srv.Subsz(&server.SubszOptions{Account: w.account})
	if err != nil {
		return subCounts{}, fmt.Errorf("read subscription counters: %w", err)
	}
	return subCounts{inserts: sz.NumInserts, removes: sz.NumRemoves}, nil
}

// check reports the subjects local programs host when they changed since
// the last check (always on the first).
func (w *interestWatcher) check() (subjects []string, changed bool, err error) {
	subjects, changed, _, err = w.checkMoved()
	return subjects, changed, err
}

// checkMoved is check that also reports whether any subscription of the
// account moved (the node's own included).
func (w *interestWatcher) checkMoved() (subjects []string, changed, moved bool, err error) {
	c, err := w.counts() // before the snapshot: a change after it shows next time
	if err != nil {
		return nil, false, false, err
	}
	if w.seen && c == w.last {
		return nil, false, false, nil
	}
	subjects, err = w.snapshot()
	if err != nil {
		return nil, false, false, err
	}
	first := !w.seen
	w.seen, w.last = true, c
	if !first && slices.Equal(subjects, w.subjects) {
		return nil, false, true, nil
	}
	w.subjects = subjects
	return slices.Clone(subjects), true, true, nil
}

// snapshot lists, sorted and without duplicates, the cap.* and work.*
// subjects without wildcards that connections other than the node's own
// subscribe to (plain, queue group or NATS micro endpoint alike).
func (w *interestWatcher) snapshot() ([]string, error) {
	own := map[uint64]bool{}
	w.mu.Lock()
	for _, nc := range w.own {
		if id, err := nc.GetClientID(); err == nil {
			own[id] = true
		}
	}
	w.mu.Unlock()
	sz, err := w.srv.Subsz(&server.SubszOptions{Account: w.account, Subscriptions: true, Limit: 1 << 30})
	if err != nil {
		return nil, fmt.Errorf("read subscriptions: %w", err)
	}
	out := []string{}
	for _, sd := range sz.Subs {
		if own[sd.Cid] || !hostingSubject(sd.Subject) {
			continue
		}
		out = append(out, sd.Subject)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// hostingSubject reports whether a subscription to subject hosts a
// capability (cap.<name>) or a stage (work.<stage>): wildcards listen,
// they do not host.
func hostingSubject(subject string) bool {
	if !strings.HasPrefix(subject, "cap.") && !strings.HasPrefix(subject, "work.") {
		return false
	}
	for tok := range strings.SplitSeq(subject, ".") {
		if tok == "*" || tok == ">" {
			return false
		}
	}
	return true
}

// watch checks every busy interval while subscriptions move and for
// busyFor after, every idle interval otherwise, and hands each change to
// changed, on this goroutine, in order. onErr gets a failed check (only
// while the server shuts down, in practice). It returns when quit is
// closed.
func (w *interestWatcher) watch(quit <-chan struct{}, busy, idle, busyFor time.Duration, changed func([]string), onErr func(error)) {
	t := time.NewTimer(busy)
	defer t.Stop()
	lastMoved := time.Now()
	for {
		select {
		case <-quit:
			return
		case <-t.C:
		}
		subjects, ok, moved, err := w.checkMoved()
		switch {
		case err != nil:
			onErr(err)
		case ok:
			changed(subjects)
		}
		now := time.Now()
		if moved {
			lastMoved = now
		}
		if now.Sub(lastMoved) < busyFor {
			t.Reset(busy)
		} else {
			t.Reset(idle)
		}
	}
}

// startWatchingInterest hands what local programs host to the bridge and
// the node on every change, until the appliance closes. a.mu is held.
func (a *Appliance) startWatchingInterest() {
	w := a.interest
	failing := false
	a.wg.Add(1)
	go func() { // exits when Close closes a.quit
		defer a.wg.Done()
		w.watch(a.quit, interestPollBusy, interestPollIdle, interestBusyFor, func(subjects []string) {
			if failing {
				failing = false
				a.logger.Info("local subscriptions readable again")
			}
			a.localInterestChanged(subjects)
		}, func(err error) {
			if !failing {
				failing = true
				a.logger.Error("cannot read the local subscriptions; hosted capabilities and stages are not updated", "err", err)
			}
		})
	}()
}

// localInterestChanged hands a new snapshot of local interest to the
// bridge, which declares the queues of new stages, and then to the node,
// which advertises them: a stage is routable before the mesh hears of it.
func (a *Appliance) localInterestChanged(subjects []string) {
	if b := a.bridge.Load(); b != nil {
		ctx, cancel := context.WithTimeout(context.Background(), declareTimeout)
		err := b.SetLocalInterest(ctx, subjects)
		cancel()
		if err != nil {
			a.logger.Warn("stage queues not declared yet; the bridge declares them when it consumes", "err", err)
		}
	}
	if n := a.node.Load(); n != nil {
		n.SetLocal(subjects)
	}
}
