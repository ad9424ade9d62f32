package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/cache/meshdb"
)

// JoinCommand makes this machine a node of a mesh with a join token from
// `meshbox mesh node add`: it redeems the token and writes the node's
// configuration file, which `meshbox run` (and the systemd unit) read.
type JoinCommand struct{ m *Main }

// flags defines join's flags; its action joins with TOKEN.
func (c *JoinCommand) flags(fs *flag.FlagSet) action {
	envFile := fs.String("env-file", appliance.DefaultEnvFile(), "where to write the node's configuration (MESHBOX_* variables, mode 0600)")
	force := fs.Bool("force", false, "replace an existing configuration file")
	return func(ctx context.Context, pos []string) error {
		if len(pos) != 1 {
			fs.Usage()
			return usagef("join: want one argument (the join token printed by meshbox mesh node add), got %d", len(pos))
		}
		if *envFile == "" {
			return usagef("join: --env-file is required (no default configuration directory)")
		}
		tok, err := meshdb.ParseJoinToken(pos[0])
		if err != nil {
			return fmt.Errorf("join: %w", err)
		}
		// Fail before the token is used up if the file cannot be written.
		if err := appliance.CheckEnvFileWritable(*envFile, *force); err != nil {
			return fmt.Errorf("join: %w", err)
		}
		db, err := meshdb.Open(ctx, tok.DB, meshdb.Options{})
		if err != nil {
			return fmt.Errorf("join: %w", err)
		}
		defer db.Close()
		fmt.Fprintf(c.m.Stdout, "joining the mesh at %s as node %s\n", db.Addr(), tok.Node)
		node, err := db.Redeem(ctx, tok)
		if err != nil {
			return fmt.Errorf("join: %w", err)
		}
		if node != tok.Node {
			return fmt.Errorf("join: the token names node %q but the database gave %q", tok.Node, node)
		}
		creds, err := db.BrokerCredentials(ctx, node)
		if err != nil {
			return fmt.Errorf("join: %w", err)
		}
		if len(creds) == 0 {
			return fmt.Errorf("join: node %q has no broker credential in the mesh database", node)
		}
		header := fmt.Sprintf("meshbox node %s, written by meshbox join at %s.\n"+
			"Keep it mode 0600: it holds the node's database password.\n"+
			"The node reads where the broker is (broker.url) and its broker credential from the mesh database.",
			node, time.Now().UTC().Format(time.RFC3339))
		vars := map[string]string{"MESHBOX_NODE": node, "MESHBOX_DB": tok.DB}
		if err := appliance.WriteEnvFile(*envFile, header, vars, *force); err != nil {
			if errors.Is(err, appliance.ErrEnvFileExists) {
				return fmt.Errorf("join: token used, but %w", err)
			}
			return fmt.Errorf("join: %w", err)
		}
		fmt.Fprintf(c.m.Stdout, "node %s joined (broker user %s); configuration written to %s (mode 0600)\n", node, creds[0].User, *envFile)
		if *envFile == appliance.DefaultEnvFile() {
			fmt.Fprintln(c.m.Stdout, "next: meshbox run  (or: systemctl enable --now meshbox)")
		} else {
			fmt.Fprintf(c.m.Stdout, "next: meshbox run --env-file %s\n", *envFile)
		}
		return nil
	}
}
