package bridge

import (
	"time"

	"github.com/meshbox/meshbox/bridge/completed"
)

// Idempotency at the node. A stage named in Config.Dedupe has this node
// remember the message ids of its commands that completed here (the
// handler replied with a result): a later delivery of an id that completed
// within the stage's window is acked without calling the handler again
// (meshbox_commands_deduplicated_total{stage}). The ids live in a bbolt
// file of their own (Config.CompletedPath), so they survive a restart; ids
// older than the window are pruned, and a stage keeps at most MaxEntries
// (the oldest go first).
//
// This dedupes per node, not across the mesh: a command retried on
// another node hosting the stage (its handler here lost the lease, or this
// node went away) runs there again, because no node knows what another
// completed without asking it, and asking a node that may be gone would
// make every command wait on it. Convergence is not exactly once: a
// handler whose effects must happen once still needs idempotency at the
// system it changes, keyed by Meshbox-Msg-Id. Two deliveries of one id at
// the same time (a submitter sending it twice quickly) may both run; the
// window covers a delivery that arrives after the first completed.

// runPruner prunes the completed ids past their stage's window, at once
// and every pruneEvery. Exits when the bridge closes.
func (b *Bridge) runPruner() {
	t := time.NewTicker(completed.PruneEvery)
	defer t.Stop()
	for {
		if err := b.files.done.PruneAll(time.Now(), b.cfg.Dedupe); err != nil {
			b.log.Error("prune completed ids", "err", err)
		}
		select {
		case <-b.quit:
			return
		case <-t.C:
		}
	}
}

// completedBefore reports whether id completed on this node for stage
// within its dedupe window (false when the stage does not dedupe), and
// counts the duplicate. A store that cannot be read lets the delivery
// through: at least once stays the guarantee.
func (b *Bridge) completedBefore(stage, id string) bool {
	p, ok := b.cfg.Dedupe[stage]
	if !ok || b.files.done == nil || id == "" {
		return false
	}
	hit, err := b.files.done.Seen(stage, id, time.Now().Add(-p.Window))
	if err != nil {
		b.log.Error("read completed ids; delivering", "stage", stage, "msg_id", id, "err", err)
		return false
	}
	if hit {
		b.m.deduplicated.WithLabelValues(stage).Inc()
	}
	return hit
}

// completedNow records that id completed on this node for stage, when the
// stage dedupes; a failed write is logged (the id may run again).
func (b *Bridge) completedNow(stage, id string) {
	p, ok := b.cfg.Dedupe[stage]
	if !ok || b.files.done == nil || id == "" {
		return
	}
	if err := b.files.done.Done(stage, id, time.Now(), p); err != nil {
		b.log.Error("record a completed id", "stage", stage, "msg_id", id, "err", err)
	}
}

// dedupes reports whether stage remembers its completed ids.
func (b *Bridge) dedupes(stage string) bool {
	if b.files.done == nil {
		return false
	}
	_, ok := b.cfg.Dedupe[stage]
	return ok
}

// DedupePolicy is a stage's idempotency at the node (Config.Dedupe).
type DedupePolicy = completed.DedupePolicy
