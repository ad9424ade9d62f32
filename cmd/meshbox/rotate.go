package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/meshbox/meshbox/bridge/brokeradmin"
	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/cache/meshdb"
)

// This file holds the admin commands on a node's broker identity that need
// the broker's admin credential: rotate, set-stages and the broker side of
// remove.

// DefaultRotateWait bounds how long rotate waits for nodes to switch.
const DefaultRotateWait = 2 * time.Minute

// rotatePoll is how often rotate looks whether nodes switched.
const rotatePoll = 250 * time.Millisecond

// rotateTarget is one node in a rotation.
type rotateTarget struct {
	node    string
	newest  meshdb.CredentialGeneration
	older   []int
	waiting time.Time // since when rotate waits for the node to switch to newest
}

// connectAdmin checks the admin URL against the broker the mesh uses.
func (c *MeshCommand) connectAdmin(ctx context.Context, db *meshdb.DB, adminURL string) (*brokeradmin.Admin, error) {
	brokerURL, err := db.Setting(ctx, meshdb.SettingBrokerURL)
	if err != nil {
		return nil, fmt.Errorf("%w (run meshbox init first)", err)
	}
	vhost, err := brokeradmin.VhostOf(brokerURL)
	if err != nil {
		return nil, err
	}
	return brokeradmin.Connect(ctx, adminURL, vhost, brokeradmin.Options{})
}

// rotate makes a new generation of the broker credential of each node
// (one node, or all with a credential when name is ""), waits (at most
// wait) until each node recorded that it switched, and then revokes the
// older generations on the broker and in the database. A run that finds a
// rotation pending (older generations still valid, left by an earlier run
// that waited in vain) only finishes the pending ones; nodes without one
// get a new generation from the next run. A node that does not switch in
// time keeps its old credential, unless force; rotate then fails and
// names it. The new generation's passwords are sealed to the node's
// public key: a node that has not published one (it has not run since it
// joined) is not rotated, and rotate fails naming it after the others.
func (c *MeshCommand) rotate(ctx context.Context, db *meshdb.DB, name, adminURL string, wait time.Duration, force bool) error {
	out := c.m.Stdout
	if name != "" {
		if err := existingNode(ctx, db, name); err != nil {
			return fmt.Errorf("rotate: %w", err)
		}
	}
	targets, err := c.rotateTargets(ctx, db, name)
	if err != nil {
		return fmt.Errorf("rotate: %w", err)
	}
	if len(targets) == 0 {
		if name != "" {
			return fmt.Errorf("rotate: node %q has no broker credential (it was added with --record-only); nothing to rotate", name)
		}
		fmt.Fprintln(out, "no node has a broker credential; nothing to rotate")
		return nil
	}
	admin, err := c.connectAdmin(ctx, db, adminURL)
	if err != nil {
		return fmt.Errorf("rotate: %w", err)
	}
	if pending := slices.DeleteFunc(slices.Clone(targets), func(t *rotateTarget) bool { return len(t.older) == 0 }); len(pending) > 0 {
		for _, t := range targets {
			if len(t.older) == 0 {
				fmt.Fprintf(out, "node %s: no rotation pending; not rotated now (run rotate again once the pending ones are finished)\n", t.node)
			}
		}
		targets = pending
	}

	// 1. A new generation for each node without a rotation pending.
	var keyless []string // nodes whose new generation could not be sealed to them
	for _, t := range targets {
		if len(t.older) > 0 {
			fmt.Fprintf(out, "node %s: finishing the rotation to generation %d (%s); older generations %v still valid\n",
				t.node, t.newest.Generation, t.newest.User, t.older)
			continue
		}
		stages, err := db.NodeStages(ctx, t.node)
		if err != nil {
			return fmt.Errorf("rotate: %w", err)
		}
		gen := t.newest.Generation + 1
		cred, err := admin.CreateGeneration(ctx, t.node, gen, stages)
		if err != nil {
			return fmt.Errorf("rotate: node %s: %w", t.node, err)
		}
		ch, role, err := db.AddCredentialGeneration(ctx, t.node, meshdb.BrokerCredential{
			Generation: gen, User: cred.User, Password: cache.Credential(cred.Password.Reveal())})
		if err != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			if derr := admin.DeleteGeneration(cctx, t.node, gen); derr != nil {
				err = errors.Join(err, fmt.Errorf("also failed to delete broker user %s: %w", cred.User, derr))
			}
			cancel()
			if errors.Is(err, meshdb.ErrNoPublicKey) {
				fmt.Fprintf(out, "node %s: not rotated: %v\n", t.node, err)
				keyless = append(keyless, t.node)
				continue
			}
			return fmt.Errorf("rotate: node %s: %w", t.node, err)
		}
		fmt.Fprintf(out, "node %s: generation %d (broker user %s, database role %s) created (mesh revision %d); the node takes it from its bindings\n",
			t.node, gen, cred.User, role, ch.Revision)
		t.older = []int{t.newest.Generation}
		t.newest = meshdb.CredentialGeneration{Node: t.node, Generation: gen, User: cred.User, CreatedAt: time.Now()}
		t.waiting = time.Now()
	}

	targets = slices.DeleteFunc(targets, func(t *rotateTarget) bool { return slices.Contains(keyless, t.node) })

	// 2. Wait until every node switched, or the time is up.
	pending := c.waitSwitched(ctx, db, targets, wait)

	// 3. Revoke the older generations of the nodes that switched (and of
	// all with --force).
	var failed []error
	for _, t := range targets {
		late := slices.Contains(pending, t)
		if late && !force {
			continue
		}
		if late {
			fmt.Fprintf(out, "node %s: has not switched to generation %d; revoking its older generations anyway (--force)\n", t.node, t.newest.Generation)
		}
		failed = append(failed, c.revokeGenerations(ctx, admin, db, t.node, t.older)...)
		if !late {
			// Its new generation has the current permissions: it binds
			// its queues to mesh itself; an older mesh's node.<n> goes.
			if err := admin.DropNodeExchange(ctx, t.node); err != nil {
				failed = append(failed, fmt.Errorf("node %s: %w", t.node, err))
			}
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("rotate: %w", errors.Join(failed...))
	}
	if len(pending) > 0 && !force {
		var names []string
		for _, t := range pending {
			names = append(names, fmt.Sprintf("%s (generation %d waiting since %s)", t.node, t.newest.Generation, t.waiting.UTC().Format(time.RFC3339)))
		}
		return fmt.Errorf("rotate: %w: %s; their old credentials stay valid until they switch: run rotate again to finish, or with --force to revoke them now",
			ErrNotSwitched, strings.Join(names, ", "))
	}
	if len(keyless) > 0 {
		return fmt.Errorf("rotate: %w: %s; start them once (meshbox run) and rotate again", meshdb.ErrNoPublicKey, strings.Join(keyless, ", "))
	}
	fmt.Fprintln(out, "rotation complete")
	return nil
}

// revokeGenerations deletes the broker users of node's generations gens
// and their rows and login roles in the database, printing each, and
// returns what failed.
func (c *MeshCommand) revokeGenerations(ctx context.Context, admin *brokeradmin.Admin, db *meshdb.DB, node string, gens []int) []error {
	var failed []error
	for _, g := range gens {
		if err := admin.DeleteGeneration(ctx, node, g); err != nil {
			failed = append(failed, fmt.Errorf("node %s: revoke generation %d: %w", node, g, err))
			continue
		}
		_, rev, err := db.DeleteCredentialGeneration(ctx, node, g)
		if err != nil {
			failed = append(failed, fmt.Errorf("node %s: revoke generation %d in the database: %w", node, g, err))
			continue
		}
		what := "broker user deleted"
		if len(rev.Roles) > 0 {
			what += ", database role " + strings.Join(rev.Roles, ", ") + " dropped"
		}
		switch {
		case rev.EndErr != nil:
			what += "; its sessions could not be ended: " + rev.EndErr.Error()
		case rev.Lingering > 0:
			what += fmt.Sprintf("; %d of its sessions still run (ending them needs a superuser or pg_signal_backend)", rev.Lingering)
		}
		fmt.Fprintf(c.m.Stdout, "node %s: generation %d revoked (%s)\n", node, g, what)
	}
	return failed
}

// existingNode checks that name is a node name and a node of the mesh.
func existingNode(ctx context.Context, db *meshdb.DB, name string) error {
	if err := cache.ValidateNodeName(name); err != nil {
		return err
	}
	ok, err := db.NodeExists(ctx, name)
	if err != nil {
		return err
	}
	if !ok {
		return &meshdb.NotFoundError{What: fmt.Sprintf("node %q", name)}
	}
	return nil
}

// ErrNotSwitched means rotate waited in vain for nodes to switch.
var ErrNotSwitched = errors.New("nodes did not switch to their new credential in time")

// rotateTargets returns the nodes to rotate with their newest and older
// generations.
func (c *MeshCommand) rotateTargets(ctx context.Context, db *meshdb.DB, name string) ([]*rotateTarget, error) {
	gens, err := db.CredentialGenerations(ctx, name)
	if err != nil {
		return nil, err
	}
	var out []*rotateTarget
	byNode := map[string]*rotateTarget{}
	for _, g := range gens { // by node, oldest first
		t := byNode[g.Node]
		if t == nil {
			t = &rotateTarget{node: g.Node}
			byNode[g.Node] = t
			out = append(out, t)
		} else {
			t.older = append(t.older, t.newest.Generation)
		}
		t.newest = g
		if !g.Switched() {
			t.waiting = g.CreatedAt
		}
	}
	return out, nil
}

// waitSwitched polls until every target's newest generation is switched
// or wait passed, printing each switch and, every 10 s, whom it waits for.
// It returns the targets that did not switch.
func (c *MeshCommand) waitSwitched(ctx context.Context, db *meshdb.DB, targets []*rotateTarget, wait time.Duration) []*rotateTarget {
	out := c.m.Stdout
	start := time.Now()
	deadline := start.Add(wait)
	lastReport := time.Time{}
	for {
		gens, err := db.CredentialGenerations(ctx, "")
		if err != nil {
			fmt.Fprintf(out, "cannot read the credential generations (retrying): %v\n", err)
		}
		var pending []*rotateTarget
		for _, t := range targets {
			if t.newest.Switched() {
				continue
			}
			for _, g := range gens {
				if g.Node == t.node && g.Generation == t.newest.Generation && g.Switched() {
					t.newest.SwitchedAt = g.SwitchedAt
					fmt.Fprintf(out, "node %s: switched to generation %d at %s\n", t.node, g.Generation, g.SwitchedAt.UTC().Format(time.RFC3339))
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
		if now.Sub(lastReport) >= 10*time.Second {
			lastReport = now
			var parts []string
			for _, t := range pending {
				parts = append(parts, fmt.Sprintf("%s (since %s, %s)", t.node, t.waiting.UTC().Format(time.RFC3339), now.Sub(t.waiting).Round(time.Second)))
			}
			fmt.Fprintf(out, "waiting for %s to switch (at most %s more)\n", strings.Join(parts, ", "), deadline.Sub(now).Round(time.Second))
		}
		select {
		case <-ctx.Done():
		case <-time.After(rotatePoll):
		}
	}
}

// setStages replaces a node's stage allow-list in the database and the
// permissions of each of its broker users.
func (c *MeshCommand) setStages(ctx context.Context, db *meshdb.DB, name string, stages []string, adminURL string) error {
	gens, err := db.CredentialGenerations(ctx, name)
	if err != nil {
		return fmt.Errorf("set stages: %w", err)
	}
	var admin *brokeradmin.Admin
	if len(gens) > 0 {
		if adminURL == "" {
			return usagef("mesh node set-stages: --broker-admin is required (or set MESHBOX_BROKER_ADMIN): node %s has broker users whose permissions change", name)
		}
		if admin, err = c.connectAdmin(ctx, db, adminURL); err != nil {
			return fmt.Errorf("set stages: %w", err)
		}
	}
	ch, err := db.SetNodeStages(ctx, name, stages)
	if err != nil {
		return err
	}
	for _, g := range gens {
		if err := admin.SetStages(ctx, name, g.Generation, stages); err != nil {
			return fmt.Errorf("set stages: node %s: %w", name, err)
		}
		fmt.Fprintf(c.m.Stdout, "node %s: permissions of broker user %s updated\n", name, g.User)
	}
	c.report(fmt.Sprintf("node %s: stages %s", name, strings.Join(stages, ",")), ch)
	return nil
}

// removeNode removes a node: its record and database roles and, when it
// has any, its broker users (which needs adminURL).
func (c *MeshCommand) removeNode(ctx context.Context, db *meshdb.DB, name string, force bool, adminURL string) error {
	gens, err := db.CredentialGenerations(ctx, name)
	if err != nil {
		return fmt.Errorf("remove node: %w", err)
	}
	var admin *brokeradmin.Admin
	if len(gens) > 0 {
		if adminURL == "" {
			return usagef("mesh node remove: --broker-admin is required (or set MESHBOX_BROKER_ADMIN) to delete node %s's broker users", name)
		}
		if admin, err = c.connectAdmin(ctx, db, adminURL); err != nil {
			return fmt.Errorf("remove node: %w", err)
		}
	}
	ch, err := db.RemoveNode(ctx, name, force)
	if err != nil {
		return err
	}
	if admin != nil {
		onBroker, err := admin.Generations(ctx, name)
		if err != nil {
			return fmt.Errorf("remove node %s: record and database roles removed, but: %w", name, err)
		}
		for _, g := range onBroker {
			if err := admin.DeleteGeneration(ctx, name, g); err != nil {
				return fmt.Errorf("remove node %s: record and database roles removed, but: %w", name, err)
			}
			fmt.Fprintf(c.m.Stdout, "node %s: broker user of generation %d deleted\n", name, g)
		}
		if err := admin.DeleteNodeQueues(ctx, name); err != nil {
			return fmt.Errorf("remove node %s: record, database roles and broker users removed, but: %w", name, err)
		}
		fmt.Fprintf(c.m.Stdout, "node %s: its event queue deleted\n", name)
	}
	c.report(fmt.Sprintf("node %s removed (record and database roles)", name), ch)
	return nil
}

// describeGenerations says which credential generations node has: "g2",
// "g3 (switched; g2 not revoked yet)", "g3 (not switched yet; g2 in use)",
// or "none" for a node recorded without an identity.
func describeGenerations(gens []meshdb.CredentialGeneration, node string) string {
	var mine []meshdb.CredentialGeneration
	for _, g := range gens {
		if g.Node == node {
			mine = append(mine, g)
		}
	}
	if len(mine) == 0 {
		return "none"
	}
	newest := mine[len(mine)-1]
	s := fmt.Sprintf("g%d", newest.Generation)
	if len(mine) == 1 {
		return s
	}
	var older []string
	for _, g := range mine[:len(mine)-1] {
		older = append(older, fmt.Sprintf("g%d", g.Generation))
	}
	if newest.Switched() {
		return s + " (switched; " + strings.Join(older, ",") + " not revoked yet)"
	}
	return s + " (not switched yet; " + strings.Join(older, ",") + " still valid)"
}
