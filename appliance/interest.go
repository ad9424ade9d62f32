package appliance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// How often the watcher of local interest looks whether a subscription
// changed. A look costs one read of the server's counters, but every
// wake-up of an idle process costs CPU of its own (tens to a hundred and
// more microseconds on a small machine, a virtual one especially): so the
// watcher looks every interestPollBusy while subscriptions move, and for
// interestBusyFor after they moved or a client connected; every
// interestPollIdle otherwise while a program is connected; and not at all
// while only the node's own connections are, until a client connects.
//
// Latency: a program's subscriptions made within interestBusyFor of its
// connecting (as programs do: connect, then subscribe) are seen within
// interestPollBusy; a subscription made later on a connection that stayed
// quiet, within interestPollIdle; a program's leaving, within
// interestPollIdle (interestPollBusy while busy).
const (
	interestPollBusy = 100 * time.Millisecond
	interestPollIdle = time.Second
	interestBusyFor  = 10 * time.Second
)

// connectSubject is where the embedded server's events "a client
// connected to the programs' account" reach the watcher, on one of the
// node's own connections (see hearConnects).
const connectSubject = wire.SubjectLocalConnect

// declareTimeout bounds the bridge's declaration of newly hosted stages on
// a change of local interest.
const declareTimeout = 10 * time.Second

// interestWatcher is the one reader of what local programs host and
// listen to: the cap.* and work.* subjects they subscribe to on the
// embedded NATS server, and the events their subscriptions receive (MQTT
// devices' included: the server subscribes for them). The appliance
// hands every change to the bridge and then to the node, so both see the
// same snapshot at once and a stage is routable before its program's
// capabilities are advertised; the bridge binds the node's event queue
// to the events listened to. A subscription the server refused (a
// program's credential does not permit it) is not in its list, and so
// never counts.
//
// The NATS server tells nobody when a subscription changes. The cheapest
// honest sign it offers is its subscription list's counters: every
// insertion and every removal bumps one of two monotonic counts. The
// watcher reads them (Subsz without subscription details) now and then
// (see interestPollBusy) and takes a full snapshot only when they moved; a
// snapshot equal to the last one is not reported. What the server does
// tell is that a client connected (an event of its system account, see
// hearConnects): a subscription needs a connection, so while nobody but
// the node itself is connected the watcher sleeps until one connects.
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
	events   []string // AMQP topic patterns of the events listened to (wire.EventPattern)

	// connects receives (without blocking the sender, one pending at a
	// time) when a client connects to the account; nil until hearConnects
	// succeeds, and then the watcher never sleeps without a timer. Set
	// before watch starts.
	connects chan struct{}
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

// hearConnects has the embedded server tell the watcher, through nc (one
// of the node's own connections), each time a client connects to the
// programs' account. The server publishes these events in its system
// account; the system account exports the one subject to the programs'
// account, which imports it as connectSubject (a program subscribing to
// ">" sees these events too: the client's name, address and library, no
// more than the node's own status shows).
func (w *interestWatcher) hearConnects(nc *nats.Conn) error {
	sys := w.srv.SystemAccount()
	if sys == nil {
		return errors.New("hear connects: the server has no system account")
	}
	acc, err := w.srv.LookupAccount(w.account)
	if err != nil {
		return fmt.Errorf("hear connects: %w", err)
	}
	from := "$SYS.ACCOUNT." + w.account + ".CONNECT"
	if err := sys.AddStreamExport(from, []*server.Account{acc}); err != nil {
		return fmt.Errorf("hear connects: export: %w", err)
	}
	if err := acc.AddMappedStreamImport(sys, from, connectSubject); err != nil {
		return fmt.Errorf("hear connects: import: %w", err)
	}
	ch := make(chan struct{}, 1)
	if _, err := nc.Subscribe(connectSubject, func(*nats.Msg) {
		select {
		case ch <- struct{}{}:
		default: // one pending wake-up is enough
		}
	}); err != nil {
		return fmt.Errorf("hear connects: %w", err)
	}
	if err := nc.Flush(); err != nil { // subscribed before the watcher relies on it
		return fmt.Errorf("hear connects: %w", err)
	}
	w.connects = ch
	return nil
}

// ownIDs are the client ids of the node's own connections that are
// connected now.
func (w *interestWatcher) ownIDs() map[uint64]bool {
	own := map[uint64]bool{}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, nc := range w.own {
		if id, err := nc.GetClientID(); err == nil {
			own[id] = true
		}
	}
	return own
}

// othersConnected reports whether a connection other than the node's own
// is registered with the programs' account. The account lets a closing
// connection go only after the server removed its subscriptions: a
// snapshot taken after this reported false holds nothing of a program
// that was connected before.
func (w *interestWatcher) othersConnected() (bool, error) {
	acc, err := w.srv.LookupAccount(w.account)
	if err != nil {
		return true, fmt.Errorf("count connections: %w", err)
	}
	own := w.ownIDs()
	if acc.NumLocalConnections() > len(own) {
		return true, nil
	}
	// No more than the node's own, in number: look which they are (one of
	// ours may be between two connections while a program is connected).
	cz, err := w.srv.Connz(&server.ConnzOptions{Account: w.account, Limit: 1 << 30})
	if err != nil {
		return true, fmt.Errorf("list connections: %w", err)
	}
	for _, ci := range cz.Conns {
		if !own[ci.Cid] {
			return true, nil
		}
	}
	return false, nil
}

// counts reads the account's subscription counters.
func (w *interestWatcher) counts() (subCounts, error) {
	sz, err := w.srv.Subsz(&server.SubszOptions{Account: w.account})
	if err != nil {
		return subCounts{}, fmt.Errorf("read subscription counters: %w", err)
	}
	return subCounts{inserts: sz.NumInserts, removes: sz.NumRemoves}, nil
}

// localInterest is one snapshot of local interest: the subjects hosted
// (sorted cap.* and work.* subjects) and the events listened to (the
// sorted AMQP topic patterns of wire.CoverPatterns).
type localInterest struct {
	hosted, events []string
}

// check reports the subjects local programs host when local interest
// changed since the last check (always on the first).
func (w *interestWatcher) check() (subjects []string, changed bool, err error) {
	li, changed, _, err := w.checkMoved()
	return li.hosted, changed, err
}

// eventPatterns returns the events listened to at the last check. Only
// the goroutine that checks may call it.
func (w *interestWatcher) eventPatterns() []string { return slices.Clone(w.events) }

// checkMoved is check that also reports whether any subscription of the
// account moved (the node's own included).
func (w *interestWatcher) checkMoved() (li localInterest, changed, moved bool, err error) {
	c, err := w.counts() // before the snapshot: a change after it shows next time
	if err != nil {
		return li, false, false, err
	}
	if w.seen && c == w.last {
		return li, false, false, nil
	}
	li, err = w.snapshot()
	if err != nil {
		return li, false, false, err
	}
	first := !w.seen
	w.seen, w.last = true, c
	if !first && slices.Equal(li.hosted, w.subjects) && slices.Equal(li.events, w.events) {
		return localInterest{}, false, true, nil
	}
	w.subjects, w.events = li.hosted, li.events
	return localInterest{hosted: slices.Clone(li.hosted), events: slices.Clone(li.events)}, true, true, nil
}

// snapshot lists, sorted and without duplicates, the cap.* and work.*
// subjects without wildcards that connections other than the node's own
// subscribe to (plain, queue group or NATS micro endpoint alike), and the
// patterns of the events their subscriptions receive.
func (w *interestWatcher) snapshot() (localInterest, error) {
	own := w.ownIDs()
	sz, err := w.srv.Subsz(&server.SubszOptions{Account: w.account, Subscriptions: true, Limit: 1 << 30})
	if err != nil {
		return localInterest{}, fmt.Errorf("read subscriptions: %w", err)
	}
	hosted, events := []string{}, []string{}
	for _, sd := range sz.Subs {
		if own[sd.Cid] {
			continue
		}
		if hostingSubject(sd.Subject) {
			hosted = append(hosted, sd.Subject)
		}
		if p, ok := wire.EventPattern(sd.Subject); ok {
			events = append(events, p)
		}
	}
	slices.Sort(hosted)
	events = wire.CoverPatterns(events)
	if events == nil {
		events = []string{}
	}
	return localInterest{hosted: slices.Compact(hosted), events: events}, nil
}

// hostingSubject reports whether a subscription to subject hosts a
// capability (cap.<name>) or a stage (work.<stage>): wildcards listen,
// they do not host.
func hostingSubject(subject string) bool {
	if !strings.HasPrefix(subject, wire.CapPrefix) && !strings.HasPrefix(subject, wire.WorkPrefix) {
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
// busyFor after they moved or a client connected, every idle interval
// otherwise while a connection other than the node's own exists, and not
// at all when none does (once hearConnects succeeded: a connection wakes
// it). It hands each change to changed, on this goroutine, in order. onErr
// gets a failed check (only while the server shuts down, in practice). It
// returns when quit is closed.
func (w *interestWatcher) watch(quit <-chan struct{}, busy, idle, busyFor time.Duration, changed func(localInterest), onErr func(error)) {
	t := time.NewTimer(busy)
	defer t.Stop()
	due := time.Now().Add(busy) // when t fires; zero while it is stopped
	arm := func(d time.Duration) {
		t.Reset(d)
		due = time.Now().Add(d)
	}
	// Busy until lastMoved+busyFor. A watcher that hears connects starts
	// quiet (a program that connects wakes it); one that does not starts
	// busy, for programs that connect as soon as the node is up.
	var lastMoved time.Time
	if w.connects == nil {
		lastMoved = time.Now()
	}
	for {
		select {
		case <-quit:
			return
		case <-w.connects: // nil (never ready) when connects are not heard
			// The client subscribes next: look soon, and often for a while.
			// A check already due sooner stays (a stream of connections
			// must not put it off).
			lastMoved = time.Now()
			if due.IsZero() || lastMoved.Add(busy).Before(due) {
				arm(busy)
			}
			continue
		case <-t.C:
			due = time.Time{}
		}
		// Who is connected is read before the subscriptions: a program
		// that left before this read has no subscriptions left in the
		// check below.
		others := true
		if w.connects != nil {
			var err error
			if others, err = w.othersConnected(); err != nil {
				onErr(err)
			}
		}
		li, ok, moved, err := w.checkMoved()
		switch {
		case err != nil:
			onErr(err)
		case ok:
			changed(li)
		}
		now := time.Now()
		if moved {
			lastMoved = now
		}
		switch {
		case now.Sub(lastMoved) < busyFor:
			arm(busy)
		case others || err != nil:
			arm(idle)
		default:
			// Only the node's own connections: nothing can subscribe
			// before a client connects, and that wakes the watcher.
		}
	}
}

// startWatchingInterest hands what local programs host to the bridge and
// the node on every change, until the appliance closes. a.mu is held.
func (a *Appliance) startWatchingInterest() {
	w := a.parts().interest
	failing := false
	a.wg.Add(1)
	go func() { // exits when Close closes a.quit
		defer a.wg.Done()
		w.watch(a.quit, interestPollBusy, interestPollIdle, interestBusyFor, func(li localInterest) {
			if failing {
				failing = false
				a.logger.Info("local subscriptions readable again")
			}
			a.localInterestChanged(li)
		}, func(err error) {
			if !failing {
				failing = true
				a.logger.Error("cannot read the local subscriptions; hosted capabilities, stages and the events listened to are not updated", "err", err)
			}
		})
	}()
}

// localInterestChanged hands a new snapshot of local interest to the
// bridge, which binds the node's event queue to the events listened to
// and declares the queues of new stages, and then to the node, which
// advertises them: a stage is routable before the mesh hears of it.
func (a *Appliance) localInterestChanged(li localInterest) {
	subjects := li.hosted
	r := a.parts()
	if b := r.bridge; b != nil {
		b.SetEventInterest(li.events) // bound by the session, at once
		ctx, cancel := context.WithTimeout(context.Background(), declareTimeout)
		err := b.SetLocalInterest(ctx, subjects)
		cancel()
		if err != nil {
			a.logger.Warn("stage queues not declared yet; the bridge declares them when it consumes", "err", err)
		}
	}
	if n := r.node; n != nil {
		n.SetListening(li.events) // one update with the next line's change
		n.SetLocal(subjects)
	}
	if sup := r.mods; sup != nil {
		sup.SetHosted(subjects)
	}
}
