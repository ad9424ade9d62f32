package bridge

import (
	"container/heap"
	"errors"
	"fmt"
	"hash/maphash"
	"strings"
	"sync"
	"time"

	"github.com/meshbox/meshbox/internal/wire"
	amqp "github.com/rabbitmq/amqp091-go"
)

// This file refuses messages that other nodes sent once and that come
// again: replays (see the package doc, Replays).
//
// A node may declare a queue of its own with a dead-letter exchange (it has
// configure rights on its own queues), bind it to keys it may read and
// reject what arrives: RabbitMQ then publishes each message again, with
// its original user_id and its seal intact. Every message dead-lettered
// that way carries the broker's x-death header, which no publisher can
// remove. meshbox itself dead-letters into live traffic in one place only:
// a stage's retry queue retry.<stage>, whose expired messages go back to
// cmd.<stage> (retry.go). So a message with x-death is refused unless it
// is a command whose every death is "expired" in its own stage's retry
// queue and that carries the retry copy's Meshbox-Attempts. Refused
// messages are dropped, not dead-lettered (a dead letter per replay would
// let the replayer fill mesh.dead), counted in
// meshbox_replays_refused_total{shape,reason} and logged once per cause.
//
// Events carry the time they were sealed inside the seal (sealing.go). A
// node remembers the events it accepted (eventMemory) and refuses an
// event of the same origin and message id again, and any event sealed
// longer ago than eventWindow: the longest a legitimate event waits, in
// its receiver's event queue (whose broker deletes it after
// eventQueueExpiry unused).

// Reasons a replay is refused, in meshbox_replays_refused_total{reason}.
const (
	replayDeadLettered = "dead_lettered" // came back through a dead-letter exchange other than a stage's retry queue
	replayDuplicate    = "duplicate"     // an event this node accepted already
	replayExpired      = "expired"       // an event sealed longer ago than the window, or before what this node still remembers
	replayMisrouted    = "misrouted"     // reached its queue through a key it was not published with (CC, BCC) or through another queue's dead-letter key
)

const (
	// eventWindow is how long a node remembers the events it accepted, and
	// how old a sealed event may be when it arrives: the life of an event
	// queue nobody consumes, plus the clock skew nodes may have.
	eventWindow = eventQueueExpiry + maxClockSkew
	// eventMemoryLen bounds the events remembered: at about 40 bytes each,
	// a few MB. When more arrive within the window, the oldest are
	// forgotten and events sealed before them are refused as expired.
	eventMemoryLen = 1 << 17
)

// replayError is a delivery refused as a replay.
type replayError struct {
	shape  string
	reason string
	detail string
}

func (e *replayError) Error() string {
	return "replayed message refused (" + e.reason + "): " + e.detail
}

// asReplay returns err as a *replayError, or nil.
func asReplay(err error) *replayError {
	var re *replayError
	if errors.As(err, &re) {
		return re
	}
	return nil
}

// checkDeaths refuses a delivery of kind that the broker dead-lettered
// anywhere but where meshbox's own topology does (see above). routingKey
// and h are the delivery's.
//
// A delivery carrying a CC header is refused too: meshbox never sets one,
// and RabbitMQ 3.10 checks a publisher's topic permissions only on the
// routing key, not on the keys of CC and BCC (measured: a node allowed
// stage resize put messages in dead.other and retry.other with CC, and
// with BCC, which the broker removes, in dead.other under key evt.x). A
// BCC leaves no header; it shows in x-death's routing-keys, which must be
// the retry queue's own key (retryDeaths), and in a dead letter's key
// (checkDeadLetter).
func checkDeaths(kind, routingKey string, h amqp.Table) error {
	shape := kind
	if kind == typeCommandBatch {
		shape = typeCommand
	}
	if hasHeader(h, "CC") || hasHeader(h, "BCC") {
		return &replayError{shape: shape, reason: replayMisrouted,
			detail: fmt.Sprintf("a %s with key %s carries CC or BCC keys", shape, routingKey)}
	}
	var deaths []string // the queues the delivery died in, as the broker says
	for k, v := range h {
		lk := strings.ToLower(k)
		switch {
		case lk == "x-death":
			list, ok := v.([]any)
			if !ok {
				deaths = append(deaths, "?")
				continue
			}
			for _, item := range list {
				t, ok := item.(amqp.Table)
				if !ok {
					deaths = append(deaths, "?")
					continue
				}
				q, _ := t["queue"].(string)
				reason, _ := t["reason"].(string)
				deaths = append(deaths, q+" "+reason+" "+deathKeys(t["routing-keys"]))
			}
		case lk == "x-first-death-queue" || lk == "x-last-death-queue":
			q, _ := v.(string)
			deaths = append(deaths, q+" ")
		}
	}
	if len(deaths) == 0 {
		return nil
	}
	if kind == typeCommand {
		if stage, ok := parseNamed(routingKey, wire.CmdPrefix); ok && retryDeaths(deaths, stage) && hasHeader(h, HeaderAttempts) {
			return nil
		}
	}
	return &replayError{shape: shape, reason: replayDeadLettered,
		detail: fmt.Sprintf("a %s with key %s dead-lettered by the broker (%s)", shape, routingKey, strings.Join(deaths, ", "))}
}

// retryDeaths reports whether every death is stage's retry queue: expired
// there, published to it with its own key and no other (x-death), or named
// as the first or last (x-*-death-queue).
func retryDeaths(deaths []string, stage string) bool {
	q := retryQueue(stage)
	for _, d := range deaths {
		if d != q+" expired "+retryKey(stage) && d != q+" " {
			return false
		}
	}
	return true
}

// deathKeys is an x-death entry's routing-keys: the keys the message was
// published with, CC's among them (BCC's are not kept), joined by commas.
func deathKeys(v any) string {
	list, _ := v.([]any)
	keys := make([]string, 0, len(list))
	for _, k := range list {
		s, _ := k.(string)
		keys = append(keys, s)
	}
	return strings.Join(keys, ",")
}

// checkDeadLetter refuses a delivery of stage's dead-letter queue that
// did not come there as meshbox dead-letters: published with the queue's
// own key (not CC, not BCC: see checkDeaths) and having died, if at all,
// only in the stage's retry queue. Such a letter's headers (its origin,
// its reason) are the word of whoever planted it; replaying it would
// publish that word with the replaying node's identity.
func checkDeadLetter(stage string, d *amqp.Delivery) error {
	if d.RoutingKey != deadKey(stage) {
		return &replayError{shape: "dead", reason: replayMisrouted,
			detail: fmt.Sprintf("a dead letter of %s published with key %s, not %s", stage, d.RoutingKey, deadKey(stage))}
	}
	if err := checkDeaths(typeCommand, commandKey(stage), d.Headers); err != nil {
		if re := asReplay(err); re != nil {
			re.shape = "dead"
		}
		return err
	}
	return nil
}

func hasHeader(h amqp.Table, key string) bool {
	for k := range h {
		if strings.EqualFold(k, key) {
			return true
		}
	}
	return false
}

// replayRefused counts a refused replay and logs the first of each cause
// (shape and reason).
func (b *Bridge) replayRefused(re *replayError, origin string) {
	b.m.replays.WithLabelValues(re.shape, re.reason).Inc()
	if b.seen.replay.first(re.shape + "/" + re.reason) {
		b.log.Warn("replayed message refused (logged once per cause; meshbox_replays_refused_total counts them all)",
			"shape", re.shape, "reason", re.reason, "origin", origin, "detail", re.detail)
	}
}

// eventMemory remembers the events a node accepted: their origin and
// message id (as a 64-bit hash: a collision refuses one event in about
// 2^47 at the memory's size) with the time each was sealed, for
// eventWindow and at most eventMemoryLen of them, the newest by sealing
// time. Its zero value is ready; safe for concurrent use.
type eventMemory struct {
	mu    sync.Mutex
	seed  maphash.Seed
	set   map[uint64]struct{}
	order eventHeap
	// floor is, per origin, the newest sealing time of its events
	// forgotten before their window ended (Unix ms): an event of that
	// origin sealed at or before it may be one forgotten. Per origin, so
	// that neither a busy or flooding sender nor one whose clock runs
	// ahead makes the others' events look too old.
	floor map[string]int64
}

// admit records the event of origin on topic with id, sealed at sealed
// (zero: by a node that does not stamp its events, then taken as now),
// and returns "" when it is new, or the reason to refuse it. The topic is
// part of the key: an id is a program's word, and a program that may
// publish one topic must not be able to make receivers drop another
// program's events on another topic by reusing its ids.
func (m *eventMemory) admit(origin, topic, id string, sealed, now time.Time) string {
	nowMs := now.UnixMilli()
	t := nowMs
	if !sealed.IsZero() {
		t = min(sealed.UnixMilli(), nowMs) // a clock ahead must not lift the floor past now
	}
	if t < nowMs-eventWindow.Milliseconds() {
		return replayExpired
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.set == nil {
		m.seed = maphash.MakeSeed()
		m.set = map[uint64]struct{}{}
	}
	if t <= m.floor[origin] {
		return replayExpired
	}
	var h maphash.Hash
	h.SetSeed(m.seed)
	h.WriteString(origin)
	h.WriteByte(0)
	h.WriteString(topic)
	h.WriteByte(0)
	h.WriteString(id)
	k := h.Sum64()
	if _, ok := m.set[k]; ok {
		return replayDuplicate
	}
	m.set[k] = struct{}{}
	heap.Push(&m.order, eventSeen{at: t, key: k, origin: origin})
	for len(m.order) > 0 && m.order[0].at < nowMs-eventWindow.Milliseconds() {
		delete(m.set, heap.Pop(&m.order).(eventSeen).key)
	}
	for len(m.order) > eventMemoryLen {
		e := heap.Pop(&m.order).(eventSeen)
		delete(m.set, e.key)
		if m.floor == nil {
			m.floor = map[string]int64{}
		}
		m.floor[e.origin] = max(m.floor[e.origin], e.at)
	}
	return ""
}

// eventSeen is one remembered event: when it was sealed (Unix ms), the
// hash of its origin, topic and id, and its origin (a node's name: the
// strings are shared with the deliveries').
type eventSeen struct {
	at     int64
	key    uint64
	origin string
}

// eventHeap orders remembered events oldest first (container/heap).
type eventHeap []eventSeen

func (h eventHeap) Len() int           { return len(h) }
func (h eventHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h eventHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)        { *h = append(*h, x.(eventSeen)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// withoutDeaths returns a copy of h without the broker's death headers.
func withoutDeaths(h amqp.Table) amqp.Table {
	out := make(amqp.Table, len(h))
	for k, v := range h {
		if lk := strings.ToLower(k); lk != "x-death" && !strings.HasPrefix(lk, "x-first-death-") && !strings.HasPrefix(lk, "x-last-death-") {
			out[k] = v
		}
	}
	return out
}

// sealedText says when an event was sealed, for a refusal's log line.
func sealedText(at time.Time) string {
	if at.IsZero() {
		return "by an older node, without a time"
	}
	return "at " + stampTime(at)
}
