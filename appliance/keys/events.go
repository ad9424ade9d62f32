package keys

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/cache/meshdb"
)

// This file makes the key events this node takes part in visible: each
// key it makes, seals for a node or the recovery kit, starts sealing with
// in place of another (rotated), forgets because it retired, receives
// sealed with the recovery kit (recovered), or loses (revoked: its copy
// withdrawn, or the key marked compromised) is one log line with the
// attribute key_event and one count of meshbox_key_events_total{kind}.
// The mesh database keeps the mesh-wide history (meshbox mesh key list
// --history).

// newEventsCounter is the counter of key events by kind.
func newEventsCounter() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "meshbox_key_events_total",
		Help: "Key events this node took part in, by kind: made, sealed (for a node or the recovery kit), rotated (sealing with a new key), retired, recovered (a copy sealed with the recovery kit), revoked (a copy withdrawn, or a key marked compromised).",
	}, []string{"kind"})
	for _, k := range meshdb.KeyEventKinds {
		c.WithLabelValues(k) // every kind shows, at 0
	}
	return c
}

// event counts and logs one key event of kind.
func (kk *Keeper) event(kind, msg string, attrs ...any) {
	kk.events.WithLabelValues(kind).Inc()
	kk.log.Info(msg, append([]any{"key_event", kind}, attrs...)...)
}

// noteForgotten records the event of a key this node held and no longer
// does: retired (its retention ended, or it was deleted after), or
// revoked (its copy withdrawn while the key is active). kk.mu is held.
func (kk *Keeper) noteForgotten(b cache.Bindings, id string) {
	ck, ok := contentKey(b, id)
	if !ok || ck.Retired(kk.now()) {
		kk.event(meshdb.KeyRetired, "forgot a retired content key", "key", id, "scope", ck.Scope)
		return
	}
	kk.event(meshdb.KeyRevoked, "this node's copy of a content key was withdrawn; it forgot the key", "key", id, "scope", ck.Scope)
}

// noteSealing records a change of the key this node seals with in scope
// ("": the mesh's): a rotation when it seals with another key than the
// one it sealed with last, and one line when it stops sealing (a
// compromised key is no longer used and not every node holds the new one
// yet). kk.mu is held.
func (kk *Keeper) noteSealing(scope, id string) {
	prev, seen := kk.sealing[scope]
	if id == "" {
		if seen && !kk.paused[scope] {
			kk.paused[scope] = true
			kk.log.Warn("this node seals nothing with this key's scope until every node holds the new key: the one it sealed with is compromised",
				"was", prev, "scope", scope)
		}
		return
	}
	kk.sealing[scope] = id
	if kk.paused[scope] {
		delete(kk.paused, scope)
		kk.log.Info("sealing again, with a content key every node holds", "key", id, "scope", scope)
	}
	if seen && prev != id {
		kk.event(meshdb.KeyRotated, "sealing with a new content key", "key", id, "replaces", prev, "scope", scope)
	}
}

// noteCompromised records, once per key, that a key this node holds was
// marked compromised. kk.mu is held.
func (kk *Keeper) noteCompromised(ck cache.ContentKey) {
	if !ck.Compromised || kk.compromised[ck.ID] {
		return
	}
	kk.compromised[ck.ID] = true
	kk.events.WithLabelValues(meshdb.KeyRevoked).Inc()
	kk.log.Warn("a node removed as compromised held this content key: this node no longer seals with it, and opens with it until it retires",
		"key_event", meshdb.KeyRevoked, "key", ck.ID, "scope", ck.Scope, "retires", ck.RetireAt)
}
