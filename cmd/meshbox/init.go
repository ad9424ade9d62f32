package main

import (
	"context"
	"fmt"

	"github.com/meshbox/meshbox/cache/meshdb"
)

// InitCommand stands up a mesh: schema, first node, broker setting.
type InitCommand struct{ m *Main }

// Run parses `meshbox init` flags and initialises the mesh database.
func (c *InitCommand) Run(ctx context.Context, args []string) error {
	fs := c.m.newFlagSet("init", "init --db URL --node NAME --broker AMQP_URL [--public-name NAME] [--force]")
	dbURL := fs.String("db", c.m.envOr("MESHBOX_DB", ""), "mesh database URL postgres://... (env MESHBOX_DB)")
	node := fs.String("node", c.m.envOr("MESHBOX_NODE", ""), "mesh name of the first node (env MESHBOX_NODE)")
	broker := fs.String("broker", "", "URL of the central broker, amqp:// or amqps://")
	public := fs.String("public-name", "", "the first node's public name (optional)")
	force := fs.Bool("force", false, "overwrite an existing mesh with another first node or broker")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("init: unexpected argument %q", fs.Arg(0))
	}
	switch {
	case *dbURL == "":
		return usagef("init: --db is required (or set MESHBOX_DB)")
	case *node == "":
		return usagef("init: --node is required (or set MESHBOX_NODE)")
	case *broker == "":
		return usagef("init: --broker is required")
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
	fmt.Fprintf(c.m.Stdout, "next: meshbox run --db %s --node %s\n", db.Addr(), *node)
	return nil
}
