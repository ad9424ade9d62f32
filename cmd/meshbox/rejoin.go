package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/cache/meshdb/nodecred"
)

// rejoin gives an existing node a new join token with a new generation of
// its credential (broker user and database role) and revokes the older
// generations (nodecred.Rotator.Rejoin): the way back for a node whose
// machine lost its configuration or that `rotate --force` locked out,
// keeping its record, assignments, overrides and grants. The old
// credentials stop working at once: a machine still running with them is
// refused and says so.
func (c *MeshCommand) rejoin(ctx context.Context, db *meshdb.DB, name, adminURL string, ttl time.Duration) error {
	_, err := c.rotator(db, adminURL).Rejoin(ctx, name, c.dbURL, ttl)
	var revoke *nodecred.RevokeError
	switch {
	case errors.Is(err, nodecred.ErrUnknownNode):
		return fmt.Errorf("rejoin: %w (meshbox mesh node add makes a new node)", err)
	case errors.Is(err, nodecred.ErrNoCredential):
		return fmt.Errorf("rejoin: node %q has no credential of its own yet (recorded by init or --record-only): meshbox mesh node add %s gives it one", name, name)
	case errors.As(err, &revoke):
		return fmt.Errorf("rejoin: the join token above is valid, but %w; run meshbox mesh node rotate %s to finish revoking", err, name)
	case err != nil:
		return fmt.Errorf("rejoin: %w", err)
	}
	fmt.Fprintf(c.m.Stdout, "node %s: rejoin complete; its older credentials no longer work\n", name)
	return nil
}
