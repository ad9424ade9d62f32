package bridge

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/meshbox/meshbox/bridge/codec"
)

// SetLocalInterest tells the bridge what local programs subscribe to on
// the node's NATS server: the cap.* and work.* subjects of every
// connection but the node's own (the appliance's watcher of local interest
// computes them and hands the node the same snapshot right after). A
// capability hosted by a local program gets no stand-in: the local host
// wins. Each work.<stage> makes the stage hosted here, with Config.Stages.
//
// When the link is up, SetLocalInterest returns once the queue of every
// hosted stage is declared and bound on the broker, so a command for the
// stage is routable before the node advertises it to the mesh; the
// stage's consumer follows on the session's own channel. It returns an
// error when a declaration fails or ctx ends first: the stages stay
// hosted, and the session declares them again when it syncs its
// consumers. It may be called before Start (then it only records them).
func (b *Bridge) SetLocalInterest(ctx context.Context, subjects []string) error {
	localCaps := map[string]bool{}
	hosted := map[string]bool{}
	for _, s := range b.cfg.Stages {
		hosted[s] = true
	}
	for _, s := range subjects {
		if name, ok := strings.CutPrefix(s, codec.SubjCapPrefix); ok && codec.ValidName(name) {
			localCaps[name] = true
		}
		if stage, ok := strings.CutPrefix(s, codec.SubjWorkPrefix); ok && codec.ValidName(stage) {
			hosted[stage] = true
		}
	}
	b.route.mu.Lock()
	capsChanged := !maps.Equal(localCaps, b.route.localCaps)
	b.route.localCaps = localCaps
	for s := range hosted {
		if !b.route.hosted[s] {
			b.log.Info("stage hosted here", "stage", s)
		}
	}
	for s := range b.route.hosted {
		if !hosted[s] {
			b.log.Info("stage no longer hosted here", "stage", s)
		}
	}
	stagesChanged := !maps.Equal(hosted, b.route.hosted)
	b.route.hosted = hosted
	if capsChanged {
		// At once, in the same critical section: from the moment the
		// capability counts as local, no stand-in competes with its host.
		b.reconcileLocked()
	}
	bc := b.bc
	b.route.mu.Unlock()
	if capsChanged && bc != nil {
		_ = bc.Flush() // the server has the stand-ins' changes before we return
	}
	err := b.declareStages(ctx, b.hostedStages())
	if stagesChanged {
		b.keepRefusals(b.hostedStages()) // a stage no longer served is refused no more, with or without a session
		signal(b.route.stagesChanged)    // the session's consumer manager consumes (and cancels)
		signal(b.cmds.stall.watch)       // a stall checker with nothing to watch wakes
	}
	return err
}

// declareStages declares and binds the queues of the stages the current
// session does not consume yet, on a channel of its own, and returns once
// the broker confirmed them. A consumer sync in progress is waited for
// (it holds flows.mu while it declares). Without a session it does
// nothing: a session declares every hosted stage before it consumes.
func (b *Bridge) declareStages(ctx context.Context, stages map[string]bool) error {
	s := b.link.sess.Load()
	if s == nil || s.ctx.Err() != nil {
		return nil
	}
	var missing []string
	s.flows.mu.Lock()
	for stage := range stages {
		if s.flows.stages[stage] == nil {
			missing = append(missing, stage)
		}
	}
	s.flows.mu.Unlock()
	if len(missing) == 0 {
		return nil
	}
	slices.Sort(missing)
	ch, err := s.con.conn.Channel()
	if err != nil {
		return fmt.Errorf("declare stages: open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	for _, stage := range missing {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("declare stage %s: %w", stage, err)
		}
		if err := s.declareStage(&ch, stage); err != nil {
			return fmt.Errorf("declare stage %s: %w", stage, err)
		}
	}
	return nil
}

// runReconciler keeps the stand-ins in line with the routes and the local
// capabilities. Exits when the bridge closes.
func (b *Bridge) runReconciler() {
	for {
		select {
		case <-b.quit:
			return
		case <-b.route.changed:
		}
		b.reconcile()
	}
}

// reconcile updates the stand-ins: one subscription to cap.<name> per
// capability routed elsewhere and not hosted by a local program (a local
// host always wins).
func (b *Bridge) reconcile() {
	b.route.mu.Lock()
	b.reconcileLocked()
	b.route.mu.Unlock()
	_ = b.bc.Flush()
}

// reconcileLocked is reconcile's work; route.mu is held on entry.
func (b *Bridge) reconcileLocked() {
	if b.bc == nil {
		return // before Start: the reconciler's first round subscribes
	}
	want := map[string]bool{}
	for name, nodes := range b.route.routes {
		if b.route.localCaps[name] {
			continue
		}
		for _, n := range nodes {
			if n != b.cfg.Node {
				want[name] = true
				break
			}
		}
	}
	for name, sub := range b.route.standins {
		if !want[name] {
			_ = sub.Unsubscribe()
			delete(b.route.standins, name)
		}
	}
	for name := range want {
		if _, ok := b.route.standins[name]; ok {
			continue
		}
		sub, err := b.bc.Subscribe(codec.SubjCapPrefix+name, b.onCapRequest)
		if err != nil {
			b.log.Error("cannot subscribe a stand-in", "capability", name, "err", err)
			continue
		}
		_ = sub.SetPendingLimits(1<<20, 256<<20)
		b.route.standins[name] = sub
	}
}

// hostedStages returns a copy of the stages hosted here: subscribed by a
// local program (or configured), and not bound to a scope this node is
// not in (scopes.go).
func (b *Bridge) hostedStages() map[string]bool {
	b.route.mu.RLock()
	defer b.route.mu.RUnlock()
	out := make(map[string]bool, len(b.route.hosted))
	for s := range b.route.hosted {
		if b.mayHost(s) {
			out[s] = true
		}
	}
	return out
}

// hostsStage reports whether stage is hosted here.
func (b *Bridge) hostsStage(stage string) bool {
	b.route.mu.RLock()
	defer b.route.mu.RUnlock()
	return b.route.hosted[stage] && b.mayHost(stage)
}

// LocalCapabilities returns the capabilities local programs host, as last
// seen in the local subscriptions.
func (b *Bridge) LocalCapabilities() []string {
	b.route.mu.RLock()
	defer b.route.mu.RUnlock()
	return sortedKeys(b.route.localCaps)
}

// HostedStages returns the stages this node hosts.
func (b *Bridge) HostedStages() []string {
	return sortedKeys(b.hostedStages())
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
