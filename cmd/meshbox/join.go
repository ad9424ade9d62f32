package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/internal/seal"
)

// JoinCommand makes this machine a node of a mesh with a join token from
// `meshbox mesh node add`: it redeems the token and writes the node's
// configuration file, which `meshbox run` (and the systemd unit) read.
type JoinCommand struct{ m *Main }

// flags defines join's flags; its action joins with TOKEN.
func (c *JoinCommand) flags(fs *flag.FlagSet) action {
	envFile := fs.String("env-file", appliance.DefaultEnvFile(), "where to write the node's configuration (MESHBOX_* variables, mode 0600)")
	force := fs.Bool("force", false, "replace an existing configuration file")
	data := c.m.envFlag(fs, "data", "MESHBOX_DATA", "the node's data directory, for a token that carries the node's key (node add --kit; env MESHBOX_DATA, default "+appliance.DefaultDataDir()+")")
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
		keyFile := ""
		if tok.NodeKey != "" {
			dir := *data
			if dir == "" {
				dir = appliance.DefaultDataDir()
			}
			if keyFile, err = checkJoinNodeKey(dir, tok.NodeKey); err != nil {
				return fmt.Errorf("join: %w", err)
			}
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
		if keyFile != "" {
			if err := writeJoinNodeKey(keyFile, tok.NodeKey); err != nil {
				return fmt.Errorf("join: token used, but %w", err)
			}
			fmt.Fprintf(c.m.Stdout, "node %s's key, with which its keys were sealed by the recovery kit, written to %s (mode 0600)\n", node, keyFile)
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

// checkJoinNodeKey checks that the node key text of a join token can be
// written to dir's node.key before the token is used: dir has none, or
// the same. It returns the file's path.
func checkJoinNodeKey(dir, text string) (string, error) {
	if _, err := seal.ParseNodeKey([]byte(text)); err != nil {
		return "", fmt.Errorf("the token's node key: %w", err)
	}
	file := filepath.Join(dir, kitNodeKeyFile)
	have, err := os.ReadFile(file)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return file, nil
	case err != nil:
		return "", err
	case string(have) == text:
		return file, nil
	}
	return "", fmt.Errorf("%s holds another node key: join into an empty data directory (--data) (nothing was changed)", file)
}

// writeJoinNodeKey writes the node key text to file, mode 0600.
func writeJoinNodeKey(file, text string) error {
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return nil // the same key: checkJoinNodeKey
	}
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
