package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/meshbox/meshbox/bridge/brokeradmin"
	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/cache/meshdb/nodecred"
)

// This file holds the admin commands on a node's broker identity that need
// the broker's admin credential: rotate (and the printing of its steps and
// rejoin's), set-stages and the broker side of remove.

// DefaultRotateWait bounds how long rotate waits for nodes to switch.
const DefaultRotateWait = 2 * time.Minute

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

// rotator returns the Rotator of db's nodes for rotate and rejoin: it
// connects to the broker with adminURL when it needs to, and prints each
// step.
func (c *MeshCommand) rotator(db *meshdb.DB, adminURL string) *nodecred.Rotator {
	return &nodecred.Rotator{
		DB: db,
		Connect: func(ctx context.Context) (nodecred.Broker, error) {
			admin, err := c.connectAdmin(ctx, db, adminURL)
			if err != nil {
				return nil, err
			}
			return admin, nil
		},
		Progress: func(e nodecred.Event) { printCredentialStep(c.m.Stdout, e) },
	}
}

// rotate rotates the broker credential of one node, or of all with a
// credential when name is "" (nodecred.Rotator.Rotate), waiting at most
// wait for them to switch. A node that does not switch in time keeps its
// old credential, unless force; rotate then fails and names it. A node
// that has not published its public key is not rotated, and rotate fails
// naming it after the others.
func (c *MeshCommand) rotate(ctx context.Context, db *meshdb.DB, name, adminURL string, wait time.Duration, force bool) error {
	rotated, err := c.rotator(db, adminURL).Rotate(ctx, nodecred.RotateOptions{Node: name, Wait: wait, Force: force})
	var keyless *nodecred.NoPublicKeyError
	switch {
	case errors.Is(err, nodecred.ErrNoCredential):
		return fmt.Errorf("rotate: node %q has no broker credential (it was added with --record-only); nothing to rotate", name)
	case errors.Is(err, nodecred.ErrNotSwitched):
		return fmt.Errorf("rotate: %w; their old credentials stay valid until they switch: run rotate again to finish, or with --force to revoke them now", err)
	case errors.As(err, &keyless):
		return fmt.Errorf("rotate: %w; start them once (meshbox run) and rotate again", err)
	case err != nil:
		return fmt.Errorf("rotate: %w", err)
	case len(rotated) == 0:
		fmt.Fprintln(c.m.Stdout, "no node has a broker credential; nothing to rotate")
	default:
		fmt.Fprintln(c.m.Stdout, "rotation complete")
	}
	return nil
}

// printCredentialStep prints one step of rotate or rejoin on out.
func printCredentialStep(out io.Writer, e nodecred.Event) {
	switch e := e.(type) {
	case nodecred.Skipped:
		fmt.Fprintf(out, "node %s: no rotation pending; not rotated now (run rotate again once the pending ones are finished)\n", e.Node)
	case nodecred.Resumed:
		fmt.Fprintf(out, "node %s: finishing the rotation to generation %d (%s); older generations %v still valid\n",
			e.Node, e.Generation, e.User, e.Older)
	case nodecred.NotRotated:
		fmt.Fprintf(out, "node %s: not rotated: %v\n", e.Node, e.Err)
	case nodecred.Created:
		if e.Token == nil {
			fmt.Fprintf(out, "node %s: generation %d (broker user %s, database role %s) created (mesh revision %d); the node takes it from its bindings\n",
				e.Node, e.Generation, e.User, e.Role, e.Revision)
			return
		}
		fmt.Fprintf(out, "node %s: generation %d (broker user %s, database role %s) created (mesh revision %d)\n",
			e.Node, e.Generation, e.User, e.Role, e.Revision)
		fmt.Fprintf(out, "join token for node %s (one use, expires %s); on the node's machine run: meshbox join TOKEN --force\n",
			e.Node, e.Token.Expires.UTC().Format(time.RFC3339))
		fmt.Fprintln(out, e.Token.Encode())
	case nodecred.ReadError:
		fmt.Fprintf(out, "cannot read the credential generations (retrying): %v\n", e.Err)
	case nodecred.Switched:
		fmt.Fprintf(out, "node %s: switched to generation %d at %s\n", e.Node, e.Generation, e.At.UTC().Format(time.RFC3339))
	case nodecred.Waiting:
		var parts []string
		for _, p := range e.Nodes {
			parts = append(parts, fmt.Sprintf("%s (since %s, %s)", p.Node, p.Since.UTC().Format(time.RFC3339), e.At.Sub(p.Since).Round(time.Second)))
		}
		fmt.Fprintf(out, "waiting for %s to switch (at most %s more)\n", strings.Join(parts, ", "), e.Left.Round(time.Second))
	case nodecred.Forced:
		fmt.Fprintf(out, "node %s: has not switched to generation %d; revoking its older generations anyway (--force)\n", e.Node, e.Generation)
	case nodecred.Revoked:
		what := "broker user deleted"
		if len(e.Database.Roles) > 0 {
			what += ", database role " + strings.Join(e.Database.Roles, ", ") + " dropped"
		}
		switch {
		case e.Database.EndErr != nil:
			what += "; its sessions could not be ended: " + e.Database.EndErr.Error()
		case e.Database.Lingering > 0:
			what += fmt.Sprintf("; %d of its sessions still run (ending them needs a superuser or pg_signal_backend)", e.Database.Lingering)
		}
		fmt.Fprintf(out, "node %s: generation %d revoked (%s)\n", e.Node, e.Generation, what)
	}
}

// setStages replaces the permissions of each of a node's broker users
// (and declares the queues of its stages), then its stage allow-list in
// the database: the running node, which follows its bindings, tries the
// stages it serves again when the list changes, and by then the broker
// lets it consume them.
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
	for _, g := range gens {
		if err := admin.SetStages(ctx, name, g.Generation, stages); err != nil {
			return fmt.Errorf("set stages: node %s: %w", name, err)
		}
		fmt.Fprintf(c.m.Stdout, "node %s: permissions of broker user %s updated\n", name, g.User)
	}
	ch, err := db.SetNodeStages(ctx, name, stages)
	if err != nil {
		return err
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
		if err := c.deleteBrokerUsers(ctx, admin, name); err != nil {
			return fmt.Errorf("remove node %s: record and database roles removed, but: %w", name, err)
		}
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
