package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/cache/meshdb"
)

// rejoin gives an existing node a new join token with a new generation of
// its credential (broker user and database role) and revokes the older
// generations: the way back for a node whose machine lost its
// configuration or that `rotate --force` locked out, keeping its record,
// assignments, overrides and grants. The old credentials stop working at
// once: a machine still running with them is refused and says so.
func (c *MeshCommand) rejoin(ctx context.Context, db *meshdb.DB, name, adminURL string, ttl time.Duration) error {
	out := c.m.Stdout
	if err := existingNode(ctx, db, name); err != nil {
		var nf *meshdb.NotFoundError
		if errors.As(err, &nf) {
			return fmt.Errorf("rejoin: %w (meshbox mesh node add makes a new node)", err)
		}
		return fmt.Errorf("rejoin: %w", err)
	}
	targets, err := c.rotateTargets(ctx, db, name)
	if err != nil {
		return fmt.Errorf("rejoin: %w", err)
	}
	if len(targets) == 0 {
		return fmt.Errorf("rejoin: node %q has no credential of its own yet (recorded by init or --record-only): meshbox mesh node add %s gives it one", name, name)
	}
	t := targets[0]
	admin, err := c.connectAdmin(ctx, db, adminURL)
	if err != nil {
		return fmt.Errorf("rejoin: %w", err)
	}
	stages, err := db.NodeStages(ctx, name)
	if err != nil {
		return fmt.Errorf("rejoin: %w", err)
	}
	gen := t.newest.Generation + 1
	cred, err := admin.CreateGeneration(ctx, name, gen, stages)
	if err != nil {
		return fmt.Errorf("rejoin: node %s: %w", name, err)
	}
	added, err := db.ReissueJoin(ctx, c.dbURL, name, meshdb.BrokerCredential{
		Generation: gen, User: cred.User, Password: cache.Credential(cred.Password.Reveal())}, ttl)
	if err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if derr := admin.DeleteGeneration(cctx, name, gen); derr != nil {
			err = errors.Join(err, fmt.Errorf("also failed to delete broker user %s: %w", cred.User, derr))
		}
		return fmt.Errorf("rejoin: node %s: %w", name, err)
	}
	fmt.Fprintf(out, "node %s: generation %d (broker user %s, database role %s) created (mesh revision %d)\n",
		name, gen, cred.User, added.Role, added.Revision)
	fmt.Fprintf(out, "join token for node %s (one use, expires %s); on the node's machine run: meshbox join TOKEN --force\n",
		name, added.Token.Expires.UTC().Format(time.RFC3339))
	fmt.Fprintln(out, added.Token.Encode())
	if failed := c.revokeGenerations(ctx, admin, db, name, append(t.older, t.newest.Generation)); len(failed) > 0 {
		return fmt.Errorf("rejoin: the join token above is valid, but %w; run meshbox mesh node rotate %s to finish revoking", errors.Join(failed...), name)
	}
	fmt.Fprintf(out, "node %s: rejoin complete; its older credentials no longer work\n", name)
	return nil
}
