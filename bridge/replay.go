package bridge

import (
	"github.com/meshbox/meshbox/bridge/codec"
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

// replayRefused counts a refused replay and logs the first of each cause
// (shape and reason).
func (b *Bridge) replayRefused(re *codec.ReplayError, origin string) {
	b.m.replays.WithLabelValues(re.Shape, re.Reason).Inc()
	if b.seen.replay.First(re.Shape + "/" + re.Reason) {
		b.log.Warn("replayed message refused (logged once per cause; meshbox_replays_refused_total counts them all)",
			"shape", re.Shape, "reason", re.Reason, "origin", origin, "detail", re.Detail)
	}
}
