package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/cache/meshdb"
)

// InitCommand stands up a mesh: schema, broker setting, first node.
type InitCommand struct{ m *Main }

// flags defines init's flags; its action initialises the mesh database. With
// the broker's admin (--broker-admin) the first node is a node like any
// other: its own broker user and database role, and a join token for its
// machine, as `mesh node add` makes them. Without it the first node is
// only recorded, for a mesh that runs on one broker credential shared by
// its nodes (a test broker), and init says how to give it its own.
func (c *InitCommand) flags(fs *flag.FlagSet) action {
	dbURL := c.m.envFlag(fs, "db", "MESHBOX_DB", "mesh database URL postgres://... (env MESHBOX_DB)")
	node := c.m.envFlag(fs, "node", "MESHBOX_NODE", "mesh name of the first node (env MESHBOX_NODE)")
	broker := fs.String("broker", "", "URL of the central broker, amqp:// or amqps://, without a user: each node gets its own")
	admin := c.m.adminFlag(fs)
	stages := fs.String("stages", "", "stages the first node may consume, comma-separated (* = all; default none)")
	ttl := fs.Duration("ttl", meshdb.DefaultJoinTTL, "how long the first node's join token stays valid")
	public := fs.String("public-name", "", "the first node's public name (optional)")
	force := fs.Bool("force", false, "overwrite an existing mesh with another first node or broker")
	kitFile := fs.String("kit", "", "write the mesh's recovery kit to this file (mode 0600, never over an existing file) and print it as words to write down")
	return func(ctx context.Context, args []string) error {
		if len(args) > 0 {
			return usagef("init: unexpected argument %q", args[0])
		}
		switch {
		case *dbURL == "":
			return usagef("init: --db is required (or set MESHBOX_DB)")
		case *node == "":
			return usagef("init: --node is required (or set MESHBOX_NODE)")
		case *broker == "":
			return usagef("init: --broker is required")
		case *ttl <= 0:
			return usagef("init: --ttl %s: must be more than 0", *ttl)
		}
		if *kitFile != "" {
			if _, err := os.Lstat(*kitFile); err == nil {
				return fmt.Errorf("init: --kit %s exists: a kit is never written over a file; give another (nothing was changed)", *kitFile)
			}
		}
		db, err := meshdb.Open(ctx, *dbURL, meshdb.Options{})
		if err != nil {
			return err
		}
		defer db.Close()
		_, err = db.Init(ctx, meshdb.InitOptions{
			Node: *node, PublicName: *public, BrokerURL: *broker, Force: *force, Progress: c.m.Stdout,
		})
		if err != nil {
			return err
		}
		if *kitFile != "" {
			if _, err := c.m.makeKit(ctx, db, *kitFile, false); err != nil {
				return fmt.Errorf("init: %w", err)
			}
		}
		if *admin != "" {
			mc := &MeshCommand{m: c.m, dbURL: *dbURL}
			_, identity, err := db.NodeHasIdentity(ctx, *node)
			if err != nil {
				return err
			}
			if identity {
				fmt.Fprintf(c.m.Stdout, "node %s has its own credential already; meshbox mesh node rejoin %s gives it a new join token\n", *node, *node)
				return nil
			}
			return mc.addNode(ctx, db, cache.NodeRecord{Name: *node, PublicName: *public}, *admin, newNodeOptions{stages: splitList(*stages), ttl: *ttl})
		}
		fmt.Fprintf(c.m.Stdout, "node %s is recorded without a credential of its own (no --broker-admin given).\n", *node)
		fmt.Fprintf(c.m.Stdout, "next: give it one and a join token for its machine: meshbox mesh node add %s --db %s --broker-admin http://ADMIN:PASSWORD@BROKER:15672\n", *node, db.Addr())
		fmt.Fprintf(c.m.Stdout, "  (or, on a broker whose one credential all nodes share: meshbox run --db %s --node %s --broker amqp://USER:PASSWORD@BROKER/VHOST)\n", db.Addr(), *node)
		return nil
	}
}
