package bridge

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/meshbox/meshbox/internal/backoff"
	"github.com/meshbox/meshbox/internal/wire"
)

// A stage is granted to a node in two places that the admin changes
// together (meshbox mesh node set-stages, node add --stages, rotate): the
// stage allow-list of its node record, which reaches the node in its
// bindings, and its broker user's permissions (wire.NodePermissions),
// which the broker enforces. The bridge consumes a stage a local program
// serves as soon as the broker lets it. A refusal is recorded, shown in
// the status while it lasts, and the stage is tried again:
//
//   - at once when the allow-list changes (SetAllowedStages): a grant
//     reaches a running node through its bindings, and the handlers that
//     serve the stage already get its commands, without a restart;
//   - with backoff (stageRetry) while the allow-list names the stage, or
//     while there is none: the bindings may say so before the broker
//     does, and a node without them learns of a grant no other way.
//
// A stage the allow-list leaves out is tried again when the list changes.

// stageRetry is the schedule of the tries of a refused stage.
var stageRetry = backoff.Policy{Min: time.Second, Max: 30 * time.Second}

// SetAllowedStages tells the bridge the stages the mesh allows this node
// to consume: the stage allow-list of its bindings (wire.AllStages: every
// stage; empty: none), or nil when no allow-list governs its broker user
// (a broker URL of its configuration, or no credential of its own). The
// broker decides what the node may consume; a change of the list makes
// the session try the stages served here that it does not consume yet,
// at once. It may be called before Start.
func (b *Bridge) SetAllowedStages(stages []string) {
	list := slices.Compact(slices.Sorted(slices.Values(stages)))
	g := &b.route.grants
	g.mu.Lock()
	changed := g.known != (stages != nil) || !slices.Equal(g.allowed, list)
	g.known, g.allowed = stages != nil, list
	g.mu.Unlock()
	if !changed {
		return
	}
	if stages != nil {
		b.log.Info("stages this node may consume", "stages", list)
	}
	signal(b.route.stagesChanged) // the consumer manager tries the refused stages
}

// allowsLocked reports whether the allow-list names stage, and whether
// there is one. g.mu is held.
func (g *stageGrants) allowsLocked(stage string) (allowed, known bool) {
	return slices.Contains(g.allowed, wire.AllStages) || slices.Contains(g.allowed, stage), g.known
}

// stageRefused records that the session could not consume stage, for
// err. The first refusal of each cause is logged; the status shows the
// last until the stage is consumed (refusedStages).
func (b *Bridge) stageRefused(stage string, err error) {
	why := err.Error()
	g := &b.route.grants
	g.mu.Lock()
	if g.refused == nil {
		g.refused = map[string]string{}
	}
	news := g.refused[stage] != why
	g.refused[stage] = why
	allowed, known := g.allowsLocked(stage)
	g.mu.Unlock()
	switch {
	case !news:
		b.log.Debug("stage still refused", "stage", stage, "err", err)
	case known && !allowed:
		b.log.Warn("a local program serves a stage this node may not consume; its commands wait until the admin grants it",
			"stage", stage, "err", err)
	default:
		b.log.Error("cannot consume a stage served here; trying again", "stage", stage, "err", err)
	}
}

// stageConsumed records that the session consumes stage.
func (b *Bridge) stageConsumed(stage string) {
	g := &b.route.grants
	g.mu.Lock()
	why, was := g.refused[stage]
	delete(g.refused, stage)
	g.mu.Unlock()
	if was {
		b.log.Info("stage consumed after a refusal", "stage", stage, "refused", why)
	}
}

// keepRefusals forgets the refusals of stages not in hosted.
func (b *Bridge) keepRefusals(hosted map[string]bool) {
	g := &b.route.grants
	g.mu.Lock()
	maps.DeleteFunc(g.refused, func(stage, _ string) bool { return !hosted[stage] })
	g.mu.Unlock()
}

// retryRefused reports whether a refused stage is to be tried again on
// stageRetry's schedule: one the allow-list names, or any without one.
func (b *Bridge) retryRefused() bool {
	g := &b.route.grants
	g.mu.Lock()
	defer g.mu.Unlock()
	for stage := range g.refused {
		if allowed, known := g.allowsLocked(stage); allowed || !known {
			return true
		}
	}
	return false
}

// refusedStages returns a status line for each stage served here that
// no session consumes, saying why and, when the allow-list leaves it out,
// how the admin grants it.
func (b *Bridge) refusedStages() []string {
	g := &b.route.grants
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for _, stage := range slices.Sorted(maps.Keys(g.refused)) {
		if allowed, known := g.allowsLocked(stage); known && !allowed {
			has := "none"
			if len(g.allowed) > 0 {
				has = strings.Join(g.allowed, ", ")
			}
			out = append(out, fmt.Sprintf("stage %s is served here, but this node may not consume it (the stages it may consume: %s); the admin grants it with meshbox mesh node set-stages %s %s",
				stage, has, b.cfg.Node, strings.Join(append(slices.Clone(g.allowed), stage), " ")))
			continue
		}
		out = append(out, fmt.Sprintf("stage %s is served here, but this node cannot consume it (trying again): %s", stage, g.refused[stage]))
	}
	return out
}

// retryTimer is the consumer manager's timer for the next try of the
// refused stages, and the tries so far. Consumer manager only.
type retryTimer struct {
	t     *time.Timer
	tries int
}

// newRetryTimer returns a stopped retryTimer.
func newRetryTimer() *retryTimer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &retryTimer{t: t}
}

// plan sets the timer after a sync of the stages: the next try of a
// refused stage on stageRetry's schedule (from its start when fresh: the
// stages or their grants changed), or none.
func (r *retryTimer) plan(b *Bridge, fresh bool) {
	if fresh {
		r.tries = 0
	}
	if !b.retryRefused() {
		r.tries = 0
		r.t.Stop()
		return
	}
	r.tries++
	r.t.Reset(stageRetry.Delay(r.tries))
}
