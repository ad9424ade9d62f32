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

// This file is `meshbox mesh node remove NAME --compromised`: the node's
// removal (its record, database roles and broker users, as remove does)
// and, in the same database transaction, the rotation of every key it
// held (meshdb.RemoveCompromised). The command holds no key: the
// remaining nodes make the new keys and seal them for each other and for
// the recovery kit; it waits for them and says who lacks a new key.

// DefaultCompromiseWait bounds how long remove --compromised waits for the
// remaining nodes to hold the new keys.
const DefaultCompromiseWait = time.Minute

// removeCompromised removes node name as compromised: its credentials are
// revoked, every key it held is marked compromised and replaced, and the
// event recorded; then it waits at most wait for every remaining node
// (and the recovery kit) to hold the new keys.
func (c *MeshCommand) removeCompromised(ctx context.Context, db *meshdb.DB, name string, force bool, adminURL string, retention, wait time.Duration) error {
	out := c.m.Stdout
	if here := c.m.Getenv("MESHBOX_NODE"); here == name {
		return usagef("mesh node remove --compromised: this machine is configured as node %s (MESHBOX_NODE): do not trust a compromised node's machine with the admin credential; run the command from another machine", name)
	}
	gens, err := db.CredentialGenerations(ctx, name)
	if err != nil {
		return fmt.Errorf("remove compromised node: %w", err)
	}
	var admin *brokeradmin.Admin
	if len(gens) > 0 {
		if adminURL == "" {
			return usagef("mesh node remove --compromised: --broker-admin is required (or set MESHBOX_BROKER_ADMIN) to delete node %s's broker users", name)
		}
		if admin, err = c.connectAdmin(ctx, db, adminURL); err != nil {
			return fmt.Errorf("remove compromised node: %w", err)
		}
	}
	comp, err := db.RemoveCompromised(ctx, name, force, retention)
	var missing *meshdb.NotFoundError
	switch {
	case errors.As(err, &missing):
		return fmt.Errorf("remove compromised node: %w: nothing was changed (meshbox mesh node list shows the mesh's nodes)", err)
	case err != nil:
		return err
	}
	fmt.Fprintf(out, "node %s: removed as compromised: record and database roles removed, its copies of the mesh's keys withdrawn (mesh revision %d)\n",
		name, comp.Change.Revision)
	switch s := comp.Sessions; {
	case s.EndErr != nil:
		fmt.Fprintf(out, "node %s: the sessions of its database roles could not be ended: %v\n", name, s.EndErr)
	case s.Lingering > 0:
		fmt.Fprintf(out, "node %s: %d sessions of its dropped database roles still run (ending them needs a superuser or pg_signal_backend); they may read nothing\n", name, s.Lingering)
	}
	if admin != nil {
		if err := c.deleteBrokerUsers(ctx, admin, name); err != nil {
			return fmt.Errorf("remove compromised node %s: record, database roles and keys handled, but: %w (run the command again to delete its broker users)", name, err)
		}
	}
	fmt.Fprintf(out, "keys node %s held, marked compromised: %s; no node seals with them any more, members open what they sealed until %s\n",
		name, list(comp.Compromised), comp.RetireAt.UTC().Format(time.RFC3339))
	for _, sc := range append([]string{""}, comp.Scopes...) {
		fmt.Fprintf(out, "%s: new content key %s\n", scopeLabel(sc), comp.NewKeys[sc])
	}
	fmt.Fprintln(out, "recorded in the key history (meshbox mesh key list --history)")
	return c.waitNewKeys(ctx, db, comp, wait)
}

// deleteBrokerUsers deletes every broker user of node and its event
// queue, printing each step.
func (c *MeshCommand) deleteBrokerUsers(ctx context.Context, admin *brokeradmin.Admin, node string) error {
	onBroker, err := admin.Generations(ctx, node)
	if err != nil {
		return err
	}
	for _, g := range onBroker {
		if err := admin.DeleteGeneration(ctx, node, g); err != nil {
			return err
		}
		fmt.Fprintf(c.m.Stdout, "node %s: broker user of generation %d deleted\n", node, g)
	}
	if err := admin.DeleteNodeQueues(ctx, node); err != nil {
		return err
	}
	fmt.Fprintf(c.m.Stdout, "node %s: its event queue deleted\n", node)
	return nil
}

// waitNewKeys waits at most wait until every remaining node that may hold
// each new key holds it and opens with it (then the nodes seal with it),
// and the recovery kit, if the mesh has one, has a copy; it then says who
// lacks which. A node that lacks a key is no failure of the command: it
// receives the key when it next runs, and until then the nodes seal
// nothing under that key's scope.
func (c *MeshCommand) waitNewKeys(ctx context.Context, db *meshdb.DB, comp meshdb.Compromise, wait time.Duration) error {
	out := c.m.Stdout
	kitPub, _, err := db.RecoveryKit(ctx, "")
	if err != nil {
		return err
	}
	lacking := func() (map[string][]string, error) {
		_, holders, err := db.ContentKeys(ctx)
		if err != nil {
			return nil, err
		}
		var kit map[string]string
		if kitPub != nil {
			if _, kit, err = db.RecoveryKit(ctx, ""); err != nil {
				return nil, err
			}
		}
		lack := map[string][]string{}
		for _, id := range comp.NewKeys {
			members, err := db.KeyMembers(ctx, id)
			if err != nil {
				return nil, err
			}
			for _, n := range members {
				if !slices.ContainsFunc(holders, func(h cache.KeyHolder) bool { return h.KeyID == id && h.Node == n && h.Opened }) {
					lack[id] = append(lack[id], n)
				}
			}
			if kitPub != nil && kit[id] == "" {
				lack[id] = append(lack[id], "the recovery kit")
			}
		}
		return lack, nil
	}
	if wait > 0 {
		fmt.Fprintf(out, "waiting for the remaining nodes to make, seal and open the new keys (at most %s)\n", wait)
	}
	deadline := time.Now().Add(wait)
	for {
		lack, err := lacking()
		if err != nil {
			return fmt.Errorf("remove compromised node: the node is removed and its keys rotated, but: %w", err)
		}
		if len(lack) == 0 {
			fmt.Fprintln(out, "every remaining node holds the new keys and seals with them")
			return nil
		}
		if !time.Now().Before(deadline) {
			for _, sc := range append([]string{""}, comp.Scopes...) {
				id := comp.NewKeys[sc]
				if len(lack[id]) == 0 {
					continue
				}
				fmt.Fprintf(out, "%s: new key %s not yet held by %s: it receives the key from a node that holds it when it runs; until every node holds it (or %s), no node seals under %s\n",
					scopeLabel(sc), id, strings.Join(lack[id], ", "), comp.RetireAt.UTC().Format(time.RFC3339), scopeLabel(sc))
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// scopeLabel names the keys of scope ("": the mesh's).
func scopeLabel(scope string) string {
	if scope == "" {
		return "the mesh's key"
	}
	return "scope " + scope
}
