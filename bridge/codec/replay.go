package codec

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

// Reasons a replay is refused, in meshbox_replays_refused_total{reason}.
const (
	ReplayDeadLettered = "dead_lettered" // came back through a dead-letter exchange other than a stage's retry queue
	ReplayDuplicate    = "duplicate"     // an event this node accepted already
	ReplayExpired      = "expired"       // an event sealed longer ago than the window, or before what this node still remembers
	ReplayMisrouted    = "misrouted"     // reached its queue through a key it was not published with (CC, BCC) or through another queue's dead-letter key
)

const (
	// EventWindow is how long a node remembers the events it accepted, and
	// how old a sealed event may be when it arrives: the life of an event
	// queue nobody consumes, plus the clock skew nodes may have.
	EventWindow = EventQueueExpiry + MaxClockSkew
	// EventMemoryLen bounds the events remembered: at about 40 bytes each,
	// a few MB. When more arrive within the window, the oldest are
	// forgotten and events sealed before them are refused as expired.
	EventMemoryLen = 1 << 17
)

// ReplayError is a delivery refused as a replay.
type ReplayError struct {
	Shape  string
	Reason string
	Detail string
}

func (e *ReplayError) Error() string {
	return "replayed message refused (" + e.Reason + "): " + e.Detail
}

// AsReplay returns err as a *ReplayError, or nil.
func AsReplay(err error) *ReplayError {
	var re *ReplayError
	if errors.As(err, &re) {
		return re
	}
	return nil
}

// CheckDeaths refuses a delivery of kind that the broker dead-lettered
// anywhere but where meshbox's own topology does (see above). routingKey
// and h are the delivery's.
//
// A delivery carrying a CC header is refused too: meshbox never sets one,
// and RabbitMQ 3.10 checks a publisher's topic permissions only on the
// routing key, not on the keys of CC and BCC (measured: a node allowed
// stage resize put messages in dead.other and retry.other with CC, and
// with BCC, which the broker removes, in dead.other under key evt.x). A
// BCC leaves no header; it shows in x-death's routing-keys, which must be
// the retry queue's own key (RetryDeaths), and in a dead letter's key
// (CheckDeadLetter).
func CheckDeaths(kind, routingKey string, h amqp.Table) error {
	shape := kind
	if kind == TypeCommandBatch {
		shape = TypeCommand
	}
	if HasHeader(h, "CC") || HasHeader(h, "BCC") {
		return &ReplayError{Shape: shape, Reason: ReplayMisrouted,
			Detail: fmt.Sprintf("a %s with key %s carries CC or BCC keys", shape, routingKey)}
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
				deaths = append(deaths, q+" "+reason+" "+DeathKeys(t["routing-keys"]))
			}
		case lk == "x-first-death-queue" || lk == "x-last-death-queue":
			q, _ := v.(string)
			deaths = append(deaths, q+" ")
		}
	}
	if len(deaths) == 0 {
		return nil
	}
	if kind == TypeCommand {
		if stage, ok := ParseNamed(routingKey, wire.CmdPrefix); ok && RetryDeaths(deaths, stage) && HasHeader(h, HeaderAttempts) {
			return nil
		}
	}
	return &ReplayError{Shape: shape, Reason: ReplayDeadLettered,
		Detail: fmt.Sprintf("a %s with key %s dead-lettered by the broker (%s)", shape, routingKey, strings.Join(deaths, ", "))}
}

// RetryDeaths reports whether every death is stage's retry queue: expired
// there, published to it with its own key and no other (x-death), or named
// as the first or last (x-*-death-queue).
func RetryDeaths(deaths []string, stage string) bool {
	q := RetryQueue(stage)
	for _, d := range deaths {
		if d != q+" expired "+RetryKey(stage) && d != q+" " {
			return false
		}
	}
	return true
}

// DeathKeys is an x-death entry's routing-keys: the keys the message was
// published with, CC's among them (BCC's are not kept), joined by commas.
func DeathKeys(v any) string {
	list, _ := v.([]any)
	keys := make([]string, 0, len(list))
	for _, k := range list {
		s, _ := k.(string)
		keys = append(keys, s)
	}
	return strings.Join(keys, ",")
}

// CheckDeadLetter refuses a delivery of stage's dead-letter queue that
// did not come there as meshbox dead-letters: published with the queue's
// own key (not CC, not BCC: see CheckDeaths) and having died, if at all,
// only in the stage's retry queue. Such a letter's headers (its origin,
// its reason) are the word of whoever planted it; replaying it would
// publish that word with the replaying node's identity.
func CheckDeadLetter(stage string, d *amqp.Delivery) error {
	if d.RoutingKey != DeadKey(stage) {
		return &ReplayError{Shape: "dead", Reason: ReplayMisrouted,
			Detail: fmt.Sprintf("a dead letter of %s published with key %s, not %s", stage, d.RoutingKey, DeadKey(stage))}
	}
	if err := CheckDeaths(TypeCommand, CommandKey(stage), d.Headers); err != nil {
		if re := AsReplay(err); re != nil {
			re.Shape = "dead"
		}
		return err
	}
	return nil
}

func HasHeader(h amqp.Table, key string) bool {
	for k := range h {
		if strings.EqualFold(k, key) {
			return true
		}
	}
	return false
}

// EventMemory remembers the events a node accepted: their origin and
// message id (as a 64-bit hash: a collision refuses one event in about
// 2^47 at the memory's size) with the time each was sealed, for
// EventWindow and at most EventMemoryLen of them, the newest by sealing
// time. Its zero value is ready; safe for concurrent use.
type EventMemory struct {
	mu    sync.Mutex
	seed  maphash.Seed
	Set   map[uint64]struct{}
	Order EventHeap
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
func (m *EventMemory) Admit(origin, topic, id string, sealed, now time.Time) string {
	nowMs := now.UnixMilli()
	t := nowMs
	if !sealed.IsZero() {
		t = min(sealed.UnixMilli(), nowMs) // a clock ahead must not lift the floor past now
	}
	if t < nowMs-EventWindow.Milliseconds() {
		return ReplayExpired
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Set == nil {
		m.seed = maphash.MakeSeed()
		m.Set = map[uint64]struct{}{}
	}
	if t <= m.floor[origin] {
		return ReplayExpired
	}
	var h maphash.Hash
	h.SetSeed(m.seed)
	h.WriteString(origin)
	h.WriteByte(0)
	h.WriteString(topic)
	h.WriteByte(0)
	h.WriteString(id)
	k := h.Sum64()
	if _, ok := m.Set[k]; ok {
		return ReplayDuplicate
	}
	m.Set[k] = struct{}{}
	heap.Push(&m.Order, EventSeen{at: t, key: k, origin: origin})
	for len(m.Order) > 0 && m.Order[0].at < nowMs-EventWindow.Milliseconds() {
		delete(m.Set, heap.Pop(&m.Order).(EventSeen).key)
	}
	for len(m.Order) > EventMemoryLen {
		e := heap.Pop(&m.Order).(EventSeen)
		delete(m.Set, e.key)
		if m.floor == nil {
			m.floor = map[string]int64{}
		}
		m.floor[e.origin] = max(m.floor[e.origin], e.at)
	}
	return ""
}

// EventSeen is one remembered event: when it was sealed (Unix ms), the
// hash of its origin, topic and id, and its origin (a node's name: the
// strings are shared with the deliveries').
type EventSeen struct {
	at     int64
	key    uint64
	origin string
}

// EventHeap orders remembered events oldest first (container/heap).
type EventHeap []EventSeen

func (h EventHeap) Len() int { return len(h) }

func (h EventHeap) Less(i, j int) bool { return h[i].at < h[j].at }

func (h EventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }

func (h *EventHeap) Push(x any) { *h = append(*h, x.(EventSeen)) }

func (h *EventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// WithoutDeaths returns a copy of h without the broker's death headers.
func WithoutDeaths(h amqp.Table) amqp.Table {
	out := make(amqp.Table, len(h))
	for k, v := range h {
		if lk := strings.ToLower(k); lk != "x-death" && !strings.HasPrefix(lk, "x-first-death-") && !strings.HasPrefix(lk, "x-last-death-") {
			out[k] = v
		}
	}
	return out
}

// SealedText says when an event was sealed, for a refusal's log line.
func SealedText(at time.Time) string {
	if at.IsZero() {
		return "by an older node, without a time"
	}
	return "at " + StampTime(at)
}
