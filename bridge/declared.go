package bridge

import (
	"context"
	"maps"

	"github.com/meshbox/meshbox/bridge/codec"

	amqp "github.com/rabbitmq/amqp091-go"
)

// SetDeclaredStages tells the bridge the stages this node's assigned
// modules declare they host (their manifests), before any of their
// handlers subscribes: the bridge declares and binds each stage's queue,
// now when the link is up and on every reconnect, but does not consume it
// until a local program serves work.<stage> (SetLocalInterest). A command
// submitted anywhere in the mesh for such a stage is accepted and waits in
// its queue, watched by the stall alarm, instead of being refused for want
// of a route. A stage nobody declares or hosts stays unroutable.
//
// It returns once the queues are confirmed, or the first error (the
// session declares them again when it next syncs its consumers). It may
// be called before Start.
func (b *Bridge) SetDeclaredStages(ctx context.Context, stages []string) error {
	set := map[string]bool{}
	for _, s := range stages {
		if codec.ValidName(s) {
			set[s] = true
		}
	}
	b.route.mu.Lock()
	changed := !maps.Equal(set, b.route.declared)
	b.route.declared = set
	b.route.mu.Unlock()
	if changed {
		signal(b.cmds.stall.watch) // a stall checker with nothing to watch wakes
		for s := range set {
			b.log.Info("stage declared for an assigned module", "stage", s)
		}
	}
	return b.declareStages(ctx, set)
}

// declaredStages returns a copy of the stages declared by SetDeclaredStages.
func (b *Bridge) declaredStages() map[string]bool {
	b.route.mu.RLock()
	defer b.route.mu.RUnlock()
	return maps.Clone(b.route.declared)
}

// declareDeclaredLocked declares the queues of declared stages that the session
// does not consume (their consumers are declared by syncStages). flows.mu
// is held on entry.
func (s *session) declareDeclaredLocked(decl **amqp.Channel) {
	for stage := range s.b.declaredStages() {
		if s.flows.stages[stage] != nil {
			continue
		}
		if err := s.declareStage(decl, stage); err != nil {
			s.b.log.Error("cannot declare the queue of a declared stage", "stage", stage, "err", err)
		}
	}
}
