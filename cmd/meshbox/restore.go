package main

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/backup"
	"github.com/meshbox/meshbox/cache/meshdb"
)

// RestoreCommand makes a data directory from a backup (package
// appliance/backup): `meshbox run` with it is the node again.
type RestoreCommand struct{ m *Main }

// flags defines restore's flags; its action restores.
func (c *RestoreCommand) flags(fs *flag.FlagSet) action {
	c.m.nodeFlags(fs)
	keys := c.m.backupKeyFlags(fs, "open")
	envOut := fs.String("env-out", "", "write the node's configuration (its env file), when the backup holds it, to FILE (never over an existing file; e.g. "+appliance.DefaultEnvFile()+")")
	return func(ctx context.Context, args []string) error {
		if len(args) != 1 {
			return usagef("restore: want the archive, as in: meshbox restore FILE --data DIR")
		}
		cfg, err := c.m.nodeConfig()
		if err != nil {
			return err
		}
		// The archive first: a damaged one is said before any key is asked.
		a, err := backup.Open(args[0])
		if err != nil {
			return err
		}
		key, err := keys.key("restore")
		if err != nil {
			return err
		}
		return c.restore(ctx, a, key, cfg, *envOut)
	}
}

func (c *RestoreCommand) restore(ctx context.Context, a *backup.Archive, key backup.Key, cfg appliance.Config, envOut string) error {
	m := a.Manifest()
	dir := cfg.DataDir
	// The node the configuration names, when it names one: the node that
	// runs on the restored directory is that one.
	if cfg.Node != appliance.DefaultConfig().Node && cfg.Node != m.Node {
		return fmt.Errorf("restore: this is a backup of node %s, and the configuration names node %s: restore it where %s's configuration is (--env-file, MESHBOX_NODE), or restore a backup of %s (nothing was written)",
			m.Node, cfg.Node, m.Node, cfg.Node)
	}
	if err := backup.CheckTarget(dir); err != nil {
		return err
	}
	if err := c.checkMesh(ctx, m, cfg); err != nil {
		return err
	}
	if err := a.Unseal(key); err != nil {
		return err
	}
	r, err := a.Restore(dir, envOut, time.Now())
	if err != nil {
		return err
	}
	abs, _ := filepath.Abs(dir)
	mesh := m.Mesh
	if mesh == "" {
		mesh = "not recorded"
	}
	fmt.Fprintf(c.m.Stdout, "restored node %s (mesh %s) into %s from a backup taken %s (%s old)\n",
		m.Node, mesh, abs, m.TakenAt.Format(time.RFC3339), r.Age().Round(time.Second))
	fmt.Fprintf(c.m.Stdout, "outbox: %d commands, events and dead letters marked as possible duplicates: whatever the node did after the backup is not in it\n", r.Marked)
	switch {
	case r.EnvFile != "" && envOut != "":
		fmt.Fprintf(c.m.Stdout, "the node's configuration written to %s (mode 0600)\n", envOut)
	case r.EnvFile != "":
		fmt.Fprintf(c.m.Stdout, "the backup holds the node's configuration: restore it with --env-out FILE (into a new directory again), or write MESHBOX_NODE=%s and its database's URL yourself\n", m.Node)
	}
	fmt.Fprintf(c.m.Stdout, "next: meshbox run --data %s (as the node's user; with its configuration: MESHBOX_NODE=%s and its database)\n", abs, m.Node)
	return nil
}

// checkMesh refuses a backup of another mesh than the one the
// configuration's mesh database holds, when both are known; a database
// that does not answer is said, not an error (the kit, when given, is
// checked against the archive's mesh still).
func (c *RestoreCommand) checkMesh(ctx context.Context, m backup.Manifest, cfg appliance.Config) error {
	if m.Mesh == "" || cfg.DB == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	mesh, err := func() (string, error) {
		db, err := meshdb.Open(ctx, string(cfg.DB), meshdb.Options{})
		if err != nil {
			return "", err
		}
		defer db.Close()
		return db.MeshID(ctx)
	}()
	switch {
	case err != nil:
		fmt.Fprintf(c.m.Stdout, "note: the mesh database did not answer (%v): the backup's mesh (%s) is not checked against it\n", err, m.Mesh)
	case mesh != m.Mesh:
		return fmt.Errorf("restore: %w: the backup is of mesh %s, the configuration's database holds mesh %s: restore it where that mesh's configuration is, or restore a backup of this mesh (nothing was written)",
			backup.ErrOtherMesh, m.Mesh, mesh)
	}
	return nil
}
