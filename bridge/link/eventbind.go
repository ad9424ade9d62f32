package link

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"
	"github.com/meshbox/meshbox/internal/wire"
	amqp "github.com/rabbitmq/amqp091-go"
)

// The node's event queue is bound only to the events its programs listen
// to (wire.EventBindingKeys): for each topic pattern, the lane of every
// other node it knows of, and the shared key while an older publisher may
// be about. An EventBinder keeps the queue's bindings in line with that,
// through the link's consuming connection: all of them at each session's
// setup (the queue may have been declared anew meanwhile), the changes as
// they come. The bindings outlive the node (the queue is durable), so the
// keys it bound are recorded in a small file beside its outbox: after a
// restart it removes those no longer wanted, and keeps them for
// EventKeepAfterStart first, while its programs come back and subscribe
// again.

// EventKeepAfterStart is how long after the node starts the bindings of
// its previous run stay, beside the ones its programs' interest asks
// for: events of those topics keep coming into the queue while the
// programs reconnect.
const EventKeepAfterStart = 30 * time.Second

// eventRetry is the wait before binding again after a failure.
const eventRetry = time.Second

// Causes in meshbox_broker_event_bind_failures_total{cause}.
const (
	// EventBindRefused: the broker refused a narrow event binding (a broker
	// user with an older mesh's permissions): the node binds every event.
	EventBindRefused = "refused"
	// EventBindBroker: a binding failed otherwise (the connection or
	// channel ended, the queue is gone).
	EventBindBroker = "broker"
	// EventBindRecord: the file of the keys bound could not be written.
	EventBindRecord = "record"
)

// allEventsKey binds every event: an older meshbox's only event binding,
// and this node's when its broker user may bind no other.
const allEventsKey = wire.EvtPrefix + wire.AllEvents

// EventBindingStatus is the event queue's part of the link's status.
type EventBindingStatus struct {
	// Topics are the topic patterns local programs listen to (AMQP
	// syntax: "*" one token, "#" any), Bound the keys the queue is bound
	// with now.
	Topics []string `json:"topics"`
	Bound  int      `json:"bound"`
	// Pending: the keys bound are not yet the ones wanted (a change is
	// on its way to the broker, or the link is down).
	Pending bool `json:"pending,omitempty"`
	// Legacy: the node binds the shared keys too, for a node of the mesh
	// not heard speaking the current protocol yet (its own events come
	// back then, and are dropped).
	Legacy bool `json:"legacy,omitempty"`
	// Warning says why the bindings are not what interest asks for.
	Warning string `json:"warning,omitempty"`
	// Listeners is what the other nodes listen to, as far as this node
	// knows (nil: not known yet; see EventBinder.KeepLocal).
	Listeners *ListenersStatus `json:"listeners,omitempty"`
}

// ListenersStatus is what the other nodes of the mesh listen to, as far
// as this node knows, and the events it kept for that.
type ListenersStatus struct {
	// All: some node may listen to anything (Why says which and why), so
	// every event goes to the broker.
	All bool   `json:"all,omitempty"`
	Why string `json:"why,omitempty"`
	// Topics are the topic patterns the other nodes listen to (AMQP
	// syntax; the first maxStatusListeners), Count how many there are.
	Topics []string `json:"topics,omitempty"`
	Count  int      `json:"count"`
	// KeptLocal counts the events of local programs no other node
	// listened to: not sent to the broker.
	KeptLocal uint64 `json:"kept_local"`
}

// EventBinder keeps the node's event queue bound to the events local
// programs listen to. Its methods are safe for concurrent use; Apply
// calls run one at a time.
type EventBinder struct {
	node, path string
	log        *slog.Logger
	metrics    *Metrics

	applyMu sync.Mutex // one Apply at a time: bound is the broker's state

	mu        sync.Mutex
	patterns  []string        // topic patterns listened to
	peers     []string        // the other nodes known
	legacy    bool            // bind the shared keys too
	prior     map[string]bool // keys of the previous run, kept until keepUntil
	keepUntil time.Time
	recorded  map[string]bool // the keys in the file: bound, or maybe bound
	bound     map[string]bool // the keys bound, as far as this process knows
	refused   bool            // the broker refused a narrow key in the last session
	cleared   bool            // a full Apply removed the previous run's stale keys
	resync    bool            // an Apply failed: bound may hold more than the broker has, or less
	warning   string
	logged    map[string]bool // causes of failures logged
	changed   chan struct{}   // cap 1: wanted keys changed

	listen listening // what the other nodes listen to (eventlisteners.go)
}

// Open readies b for node: its record of keys bound is path ("": none),
// read now. upgraded says the node ran before without such a record (an
// older meshbox, which bound every event): that binding is its previous
// run's. Call it before the first session.
func (b *EventBinder) Open(node, path string, upgraded bool, log *slog.Logger, m *Metrics) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.node, b.path, b.log, b.metrics = node, path, log, m
	if b.peers == nil {
		b.legacy = true // until the node tells which peers it knows
	}
	b.changed = make(chan struct{}, 1)
	b.prior, b.recorded, b.bound = map[string]bool{}, map[string]bool{}, map[string]bool{}
	b.keepUntil = time.Now().Add(EventKeepAfterStart)
	if upgraded {
		b.prior[allEventsKey] = true
	}
	if path == "" {
		return
	}
	keys, err := readEventRecord(path)
	var dam *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.Is(err, os.ErrNotExist):
	case errors.As(err, &dam), errors.As(err, &typ):
		log.Warn("event bindings record damaged; it is written anew", "path", path, "err", err)
	case err != nil:
		log.Warn("event bindings record unreadable; the event queue keeps the bindings it has until they are no longer wanted", "path", path, "err", err)
	}
	for _, k := range keys {
		b.prior[k], b.recorded[k] = true, true
	}
}

// EventRecordFile is the name of the record of a node's event bindings,
// in the directory of its outbox.
const EventRecordFile = "event-bindings.json"

// readEventRecord returns the keys recorded at path.
func readEventRecord(path string) ([]string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rec struct{ Keys []string }
	if err := json.Unmarshal(raw, &rec); err != nil {
		return nil, err
	}
	return rec.Keys, nil
}

// SetInterest replaces the topic patterns local programs listen to.
func (b *EventBinder) SetInterest(patterns []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if slices.Equal(patterns, b.patterns) && b.patterns != nil {
		return
	}
	b.patterns = slices.Clone(patterns)
	if b.patterns == nil {
		b.patterns = []string{}
	}
	b.signalLocked()
}

// SetPeers replaces the other nodes known, and whether one of them may
// publish without lanes (legacy).
func (b *EventBinder) SetPeers(peers []string, legacy bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if slices.Equal(peers, b.peers) && legacy == b.legacy {
		return
	}
	b.peers, b.legacy = slices.Clone(peers), legacy
	b.signalLocked()
}

func (b *EventBinder) signalLocked() {
	select {
	case b.changed <- struct{}{}:
	default:
	}
}

// wantLocked returns the keys the queue should be bound with now.
func (b *EventBinder) wantLocked(now time.Time) map[string]bool {
	want := map[string]bool{}
	if b.refused {
		if len(b.patterns) > 0 || (now.Before(b.keepUntil) && len(b.prior) > 0) {
			want[allEventsKey] = true
		}
		return want
	}
	for _, k := range wire.EventBindingKeys(b.patterns, b.peers, b.node, b.legacy) {
		want[k] = true
	}
	if now.Before(b.keepUntil) {
		maps.Copy(want, b.prior)
	}
	return want
}

// Status returns the event queue's bindings for the status (nil before
// Open).
func (b *EventBinder) Status() *EventBindingStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.changed == nil {
		return nil
	}
	return &EventBindingStatus{Topics: slices.Clone(b.patterns), Bound: len(b.bound), Legacy: b.legacy && !b.refused, Warning: b.warning,
		Pending: b.pendingLocked(), Listeners: b.listenersStatus()}
}

// pendingLocked reports whether the keys bound are not yet the ones
// wanted. Keys that may not be unbound with the broker user's permissions
// (refused) are left for a later session and do not count.
func (b *EventBinder) pendingLocked() bool {
	if b.resync {
		return true
	}
	want := b.wantLocked(time.Now())
	for k := range want {
		if !b.bound[k] {
			return true
		}
	}
	for k := range b.bound {
		if !want[k] && !(b.refused && k != allEventsKey) {
			return true
		}
	}
	return false
}

// Apply binds the event queue on conn with the keys wanted and removes
// the others it knows of. full (a session's setup) binds every key
// wanted again (the queue may be new) and, the first time, removes the
// previous run's stale keys and the shared binding of an older meshbox;
// otherwise only the changes go. The bindings go without waiting for
// each answer, and one passive declaration at the end confirms them all:
// a round trip or two, however many keys.
func (b *EventBinder) Apply(conn *amqp.Connection, full bool) error {
	b.applyMu.Lock()
	defer b.applyMu.Unlock()
	if full { // a new session, maybe with other permissions: try the narrow keys again
		b.mu.Lock()
		b.refused = false
		b.mu.Unlock()
	}
	err := b.apply(conn, full)
	if isAccessRefused(err) {
		b.mu.Lock()
		first := !b.refused
		b.refused = true
		// Such a user may bind evt.# alone: no other key is bound.
		for k := range b.bound {
			if k != allEventsKey {
				delete(b.bound, k)
			}
		}
		b.warning = "the broker refuses this node narrow event bindings (its broker permissions are an older mesh's): it receives every event of the mesh; meshbox mesh node rotate gives it the current ones"
		b.mu.Unlock()
		b.failed(EventBindRefused, err)
		if first {
			return b.apply(conn, true)
		}
	}
	return err
}

func (b *EventBinder) apply(conn *amqp.Connection, full bool) error {
	b.mu.Lock()
	full = full || b.resync
	want := b.wantLocked(time.Now())
	var bind, unbind []string
	for k := range want {
		if full || !b.bound[k] {
			bind = append(bind, k)
		}
	}
	stale := maps.Clone(b.bound)
	if full && !b.cleared {
		// The previous run's keys and an older meshbox's (or its admin's)
		// evt.#, once a process: later sessions know what they bound.
		maps.Copy(stale, b.recorded)
		stale[allEventsKey] = true
	}
	keep := map[string]bool{} // bound, and not to be unbound with these permissions
	for k := range stale {
		switch {
		case want[k]:
		case b.refused && k != allEventsKey:
			keep[k] = true // removed by a session with the current permissions
		default:
			unbind = append(unbind, k)
		}
	}
	// Recorded before they are bound: a crash in between leaves no
	// binding the next run does not know of.
	rec := maps.Clone(b.recorded)
	maps.Copy(rec, want)
	if len(bind) == 0 && len(unbind) == 0 && len(keep) == 0 {
		b.cleared = b.cleared || (full && !b.refused)
		b.resync = false
		b.mu.Unlock()
		return nil
	}
	b.mu.Unlock()
	slices.Sort(bind)
	slices.Sort(unbind)
	b.record(rec) // a failure is counted and shown; binding goes on
	if len(bind)+len(unbind) == 0 {
		// Nothing for the broker: only the record follows.
	} else if err := bindEvents(conn, codec.EventQueue(b.node), bind, unbind); err != nil {
		b.mu.Lock()
		for _, k := range bind { // maybe bound: unbound by the next Apply when not wanted
			b.bound[k] = true
		}
		b.resync = true // which of them the broker has is not known: the next binds them all again
		b.mu.Unlock()
		if !isAccessRefused(err) { // Apply counts a refusal
			b.failed(EventBindBroker, err)
		}
		return err
	}
	b.mu.Lock()
	b.cleared = b.cleared || (full && !b.refused) // refused: the stale keys wait for the current permissions
	b.resync = false
	for _, k := range bind {
		b.bound[k] = true
	}
	for _, k := range unbind {
		delete(b.bound, k)
	}
	if !b.refused {
		b.warning = ""
	}
	n := len(b.bound)
	rec = maps.Clone(b.bound)
	b.mu.Unlock()
	b.metrics.eventBindings.Set(float64(n))
	maps.Copy(rec, keep)
	b.record(rec)
	return nil
}

// bindEvents binds queue to mesh with each key of bind and unbinds it
// from each of unbind, on a channel of its own, without waiting for each
// answer; a passive declaration of the queue waits for them all (the
// broker answers in order, and a failure closes the channel).
func bindEvents(conn *amqp.Connection, queue string, bind, unbind []string) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("bind events: open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	for _, k := range bind {
		if err := ch.QueueBind(queue, k, codec.ExchangeMesh, true, nil); err != nil {
			return fmt.Errorf("bind events %s: %w", k, err)
		}
	}
	for _, k := range unbind {
		if err := ch.QueueUnbind(queue, k, codec.ExchangeMesh, nil); err != nil {
			return fmt.Errorf("unbind events %s: %w", k, err)
		}
	}
	if _, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil); err != nil {
		return fmt.Errorf("bind events: %w", err)
	}
	return nil
}

// record writes keys to the file when they are not what it holds. A
// failure is counted, logged once and shown in the status: the bindings
// go on, and a restart may keep some the node no longer wants.
func (b *EventBinder) record(keys map[string]bool) {
	b.mu.Lock()
	same := maps.Equal(keys, b.recorded)
	b.mu.Unlock()
	if b.path == "" || same {
		return
	}
	list := slices.Sorted(maps.Keys(keys))
	raw, err := json.Marshal(struct{ Keys []string }{list})
	if err == nil {
		err = writeFileAtomic(b.path, raw)
	}
	b.mu.Lock()
	if err != nil {
		b.warning = "the record of the event queue's bindings cannot be written (" + err.Error() + "): after a restart the node may keep receiving topics no longer listened to"
	} else {
		b.recorded = keys
	}
	b.mu.Unlock()
	if err != nil {
		b.failed(EventBindRecord, err)
	}
}

// writeFileAtomic replaces path with data: a crash leaves the old file or
// the new one.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(f.Name()) }()
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// failed counts a failure under its cause and logs the first of each
// cause.
func (b *EventBinder) failed(cause string, err error) {
	b.metrics.eventBindFailures.WithLabelValues(cause).Inc()
	b.mu.Lock()
	first := !b.logged[cause]
	if b.logged == nil {
		b.logged = map[string]bool{}
	}
	b.logged[cause] = true
	b.mu.Unlock()
	if first {
		b.log.Warn("event queue bindings not applied; the node tries again", "cause", cause, "err", err)
	}
}

// Run applies each change of the keys wanted on conn, and drops the
// previous run's bindings once EventKeepAfterStart passed, until done is
// closed. After a failure it tries again every eventRetry.
func (b *EventBinder) Run(conn *amqp.Connection, done <-chan struct{}) {
	b.mu.Lock()
	keep := time.Until(b.keepUntil)
	b.mu.Unlock()
	var expire <-chan time.Time
	if keep > 0 {
		t := time.NewTimer(keep + 10*time.Millisecond)
		defer t.Stop()
		expire = t.C
	}
	var retry <-chan time.Time
	for {
		if err := b.Apply(conn, false); err != nil {
			retry = time.After(eventRetry)
		} else {
			retry = nil
		}
		select {
		case <-done:
			return
		case <-b.changed:
		case <-expire:
			expire = nil
		case <-retry:
		}
	}
}

// PriorEventPatterns returns the topic patterns of the keys recorded at
// path (the record of a node's event bindings, beside its outbox): what
// its previous run listened to, which its queue keeps bound for
// EventKeepAfterStart after a start. Nothing when there is no record or
// it cannot be read.
func PriorEventPatterns(path string) []string {
	keys, err := readEventRecord(path)
	if err != nil {
		return nil // the bridge's binder says why, reading the same file
	}
	var out []string
	for _, k := range keys {
		switch {
		case strings.HasPrefix(k, wire.EvoPrefix):
			if _, p, ok := strings.Cut(k[len(wire.EvoPrefix):], "."); ok {
				out = append(out, p)
			}
		case strings.HasPrefix(k, wire.EvtPrefix):
			out = append(out, k[len(wire.EvtPrefix):])
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
