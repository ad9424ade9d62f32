package node

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"reflect"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/meshbox/meshbox/internal/names"
)

// Health is a node's summary of itself that its peers keep: what `meshbox
// mesh status` and the status page's mesh view show of every node. It
// travels on the discovery messages the node sends anyway (hello, info,
// update, heartbeat), and a heartbeat carries it only when it changed
// since the node last sent it, so an idle mesh sends no more than before;
// a change of State sends a heartbeat at once (at most one per
// healthEvery; a later change waits for the next heartbeat), so a failing node shows within seconds. Fields that move
// all the time are kept still: the bindings' time, not their age; the
// outbox depth rides on the next message that carries the summary.
type Health struct {
	// State is HealthOK, HealthWarning (something needs a look: warnings)
	// or HealthFailing (the node cannot do its work: no broker link,
	// modules failing).
	State string `json:"state"`
	// Broker is the broker link's state (connected, offline, ...).
	Broker string `json:"broker,omitempty"`
	// Bindings is where the node's bindings come from (database or cache)
	// and BindingsAt when they were loaded from the database.
	Bindings   string    `json:"bindings,omitempty"`
	BindingsAt time.Time `json:"bindings_at,omitzero"`
	// Warnings counts the node's warnings; Warning is the first.
	Warnings int    `json:"warnings,omitempty"`
	Warning  string `json:"warning,omitempty"`
	// Failing names the modules that crash-loop or cannot start.
	Failing []string `json:"failing,omitempty"`
	// Outbox is how many messages wait in the node's outbox.
	Outbox int64 `json:"outbox,omitempty"`
}

// Health states.
const (
	HealthOK      = "ok"
	HealthWarning = "warning"
	HealthFailing = "failing"
)

// Limits of a Health on the wire; longer is rejected with the message.
const (
	MaxHealthText    = 200 // the warning, the broker and bindings states
	MaxHealthFailing = 32  // names in failing
)

// hash is the hash a heartbeat carries in place of the summary: the
// first 8 bytes, in lower-case hex, of the SHA-256 of its JSON encoding
// (the same on both sides: a decoded summary encodes as it was sent).
func (h *Health) hash() string {
	b, _ := json.Marshal(h) // strings, ints and a time: cannot fail
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// healthEvery is the least time between two heartbeats sent because the
// health's state changed.
const healthEvery = 10 * time.Second

// checkHealth validates a peer's health summary.
func checkHealth(h *Health) *WireError {
	if h == nil {
		return nil
	}
	switch h.State {
	case HealthOK, HealthWarning, HealthFailing:
	default:
		return wireErr(ErrBadField, "health.state", "%.32q is not ok, warning or failing", h.State)
	}
	for field, s := range map[string]string{"health.broker": h.Broker, "health.bindings": h.Bindings, "health.warning": h.Warning} {
		if len(s) > MaxHealthText || !utf8.ValidString(s) || !printable(s) {
			return wireErr(ErrBadField, field, "not printable or longer than %d", MaxHealthText)
		}
	}
	if h.Warnings < 0 || h.Outbox < 0 {
		return wireErr(ErrBadField, "health", "negative count")
	}
	if len(h.Failing) > MaxHealthFailing {
		return wireErr(ErrBadField, "health.failing", "%d names, limit %d", len(h.Failing), MaxHealthFailing)
	}
	for _, m := range h.Failing {
		if err := names.Module(m); err != nil {
			return wireErr(ErrBadName, "health.failing", "%v", err)
		}
	}
	return nil
}

// SetHealth gives the node its health summary now. A change of state is
// sent at once (a heartbeat, at most one per healthEvery); any other
// change goes with the next discovery message the node sends.
func (n *Node) SetHealth(h Health) {
	h.Failing = slices.Clone(h.Failing)
	n.mu.Lock()
	defer n.mu.Unlock()
	if reflect.DeepEqual(n.health, &h) {
		return
	}
	stateChanged := n.health == nil || n.health.State != h.State
	n.health = &h
	n.healthSent = false
	if stateChanged && n.started && (n.healthPushedAt.IsZero() || time.Since(n.healthPushedAt) >= healthEvery) {
		n.healthPushedAt = time.Now()
		n.enqueueLocked(intent{typ: TypeHeartbeat})
	}
}

// healthForLocked is the health a message of type t carries: always on
// a record, on a heartbeat only when it changed since it was last sent.
func (n *Node) healthForLocked(t string) *Health {
	if n.health == nil || (t == TypeHeartbeat && n.healthSent) {
		return nil
	}
	if t == TypeHeartbeat || t == TypeUpdate || t == TypeHello {
		n.healthSent = true // a broadcast: every peer has it now
	}
	h := *n.health
	return &h
}
