package nodecred

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/meshbox/meshbox/cache/meshdb"
)

const (
	// poll is how often Rotate looks whether nodes switched.
	poll = 250 * time.Millisecond
	// waitingEvery is how often Rotate reports whom it waits for.
	waitingEvery = 10 * time.Second
)

// RotateOptions says which nodes Rotate rotates and how long it waits.
type RotateOptions struct {
	// Node is the node to rotate; "": every node with a credential.
	Node string
	// Wait bounds how long Rotate waits for the nodes to switch.
	Wait time.Duration
	// Force revokes the older generations of the nodes that did not switch
	// in time too: they are locked out until they rejoin.
	Force bool
}

// Rotate gives each node of opts (with a credential of its own) a new
// generation of its credential, waits at most opts.Wait until each
// recorded that it switched, and revokes the older generations of those
// that did (of all, with opts.Force); a node that switched also loses an
// older mesh's exchange node.<n>, which its new generation no longer uses.
//
// When some nodes have a rotation pending (their older generations still
// valid, left by a Rotate that waited in vain), Rotate only finishes
// those (Resumed) and leaves the others for a later run (Skipped).
//
// With a nil error, Rotate returns the nodes whose rotation it finished;
// none means no node has a credential of its own. A named node that has
// none gives ErrNoCredential. See the package documentation for the
// errors after the checks.
func (r *Rotator) Rotate(ctx context.Context, opts RotateOptions) ([]string, error) {
	if opts.Node != "" {
		if err := r.checkNode(ctx, opts.Node); err != nil {
			return nil, err
		}
	}
	targets, err := r.targets(ctx, opts.Node)
	if err != nil {
		return nil, err
	}
	if len(targets) == 0 {
		if opts.Node != "" {
			return nil, fmt.Errorf("node %q: %w", opts.Node, ErrNoCredential)
		}
		return nil, nil
	}
	broker, err := r.Connect(ctx)
	if err != nil {
		return nil, err
	}
	if pending := slices.DeleteFunc(slices.Clone(targets), func(t *target) bool { return len(t.older) == 0 }); len(pending) > 0 {
		for _, t := range targets {
			if len(t.older) == 0 {
				r.report(Skipped{Node: t.node})
			}
		}
		targets = pending
	}

	// 1. A new generation for each node without a rotation pending.
	var keyless []string // nodes whose new generation could not be sealed to them
	for _, t := range targets {
		if len(t.older) > 0 {
			r.report(Resumed{Node: t.node, Generation: t.newest.Generation, User: t.newest.User, Older: slices.Clone(t.older)})
			continue
		}
		stages, err := r.DB.NodeStages(ctx, t.node)
		if err != nil {
			return nil, err
		}
		gen := t.newest.Generation + 1
		cred, err := broker.CreateGeneration(ctx, t.node, gen, stages)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", t.node, err)
		}
		ch, role, err := r.DB.AddCredentialGeneration(ctx, t.node, brokerCredential(gen, cred))
		if err != nil {
			err = undoCreate(ctx, broker, t.node, gen, cred.User, err)
			if errors.Is(err, meshdb.ErrNoPublicKey) {
				r.report(NotRotated{Node: t.node, Err: err})
				keyless = append(keyless, t.node)
				continue
			}
			return nil, fmt.Errorf("node %s: %w", t.node, err)
		}
		r.report(Created{Node: t.node, Generation: gen, User: cred.User, Role: role, Revision: ch.Revision})
		t.older = []int{t.newest.Generation}
		t.newest = meshdb.CredentialGeneration{Node: t.node, Generation: gen, User: cred.User, CreatedAt: time.Now()}
		t.waiting = time.Now()
	}

	targets = slices.DeleteFunc(targets, func(t *target) bool { return slices.Contains(keyless, t.node) })

	// 2. Wait until every node switched, or the time is up.
	pending := r.waitSwitched(ctx, targets, opts.Wait)

	// 3. Revoke the older generations of the nodes that switched (and of
	// all with Force).
	var failed []error
	for _, t := range targets {
		late := slices.Contains(pending, t)
		if late && !opts.Force {
			continue
		}
		if late {
			r.report(Forced{Node: t.node, Generation: t.newest.Generation})
		}
		failed = append(failed, r.revoke(ctx, broker, t.node, t.older)...)
		if !late {
			// Its new generation has the current permissions: it binds
			// its queues to mesh itself; an older mesh's node.<n> goes.
			if err := broker.DropNodeExchange(ctx, t.node); err != nil {
				failed = append(failed, fmt.Errorf("node %s: %w", t.node, err))
			}
		}
	}
	if len(failed) > 0 {
		return nil, &RevokeError{Errs: failed}
	}
	if len(pending) > 0 && !opts.Force {
		return nil, &NotSwitchedError{Nodes: pendingOf(pending)}
	}
	if len(keyless) > 0 {
		return nil, &NoPublicKeyError{Nodes: keyless}
	}
	rotated := make([]string, 0, len(targets))
	for _, t := range targets {
		rotated = append(rotated, t.node)
	}
	return rotated, nil
}

// waitSwitched looks every poll until every target's newest generation is
// switched or wait passed (or ctx is done), reporting each switch and,
// every waitingEvery, whom it waits for. It returns the targets that did
// not switch.
func (r *Rotator) waitSwitched(ctx context.Context, targets []*target, wait time.Duration) []*target {
	deadline := time.Now().Add(wait)
	var lastReport time.Time
	for {
		gens, err := r.DB.CredentialGenerations(ctx, "")
		if err != nil {
			r.report(ReadError{Err: err})
		}
		var pending []*target
		for _, t := range targets {
			if t.newest.Switched() {
				continue
			}
			for _, g := range gens {
				if g.Node == t.node && g.Generation == t.newest.Generation && g.Switched() {
					t.newest.SwitchedAt = g.SwitchedAt
					r.report(Switched{Node: t.node, Generation: g.Generation, At: g.SwitchedAt})
				}
			}
			if !t.newest.Switched() {
				pending = append(pending, t)
			}
		}
		now := time.Now()
		if len(pending) == 0 || now.After(deadline) || ctx.Err() != nil {
			return pending
		}
		if now.Sub(lastReport) >= waitingEvery {
			lastReport = now
			r.report(Waiting{Nodes: pendingOf(pending), At: now, Left: deadline.Sub(now)})
		}
		select {
		case <-ctx.Done():
		case <-time.After(poll):
		}
	}
}
