package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/cmd/meshbox/doctor"
)

// DoctorCommand checks the situation of a node — its data directory, the
// mesh database, the broker, the cached bindings, clocks, names — and says
// what is wrong and what to do about it. The checks are in package doctor.
type DoctorCommand struct{ m *Main }

// flags defines doctor's flags on fs; its action runs every check,
// prints them, and fails when any check failed.
func (c *DoctorCommand) flags(fs *flag.FlagSet) action {
	parse := c.parse(fs)
	return func(ctx context.Context, args []string) error {
		opts, asJSON, err := parse(args)
		if err != nil {
			return err
		}
		rep := doctor.New(opts).Run(ctx)
		if asJSON {
			enc := json.NewEncoder(c.m.Stdout)
			enc.SetIndent("", "  ")
			if err := enc.Encode(rep); err != nil {
				return err
			}
		} else {
			rep.WriteText(c.m.Stdout)
		}
		if rep.Fail > 0 {
			return &exitError{code: 1, msg: fmt.Sprintf("doctor: %d of %d checks failed", rep.Fail, len(rep.Checks))}
		}
		return nil
	}
}

// parse builds the node's configuration with the same loader `meshbox run`
// uses (defaults, config file, environment file, environment, flags) and
// reads doctor's own flags: it defines them on fs, and returns what reads
// them once fs has parsed the command line.
func (c *DoctorCommand) parse(fs *flag.FlagSet) func(args []string) (doctor.Options, bool, error) {
	cfgFlags := addConfigFlags(fs, "node", "data", "nats", "db", "broker")
	envFile := fs.String("env-file", "", "read MESHBOX_* variables from this file first (default: "+appliance.DefaultEnvFile()+" if it exists, as meshbox run reads it)")
	server := c.m.envFlag(fs, "server", "MESHBOX_SERVER", "NATS URL to ask the running node (env MESHBOX_SERVER; default: from --nats)")
	hosts := fs.String("hosts", doctor.DefaultHostsFile, "hosts file to look for this node's pinned public name")
	publicName := fs.String("public-name", "", "this node's public name (default: from the bindings)")
	timeout := fs.Duration("timeout", 3*time.Second, "time allowed for each network check")
	asJSON := fs.Bool("json", false, "print the checks as JSON")
	return func(args []string) (doctor.Options, bool, error) {
		if len(args) > 0 {
			return doctor.Options{}, false, usagef("doctor takes no arguments, got %q", args[0])
		}
		if *timeout <= 0 {
			return doctor.Options{}, false, usagef("--timeout: must be positive, got %s", *timeout)
		}
		if *envFile == "" {
			named := *server != "" || *cfgFlags.file != ""
			cfgFlags.fs.Visit(func(f *flag.Flag) { named = named || f.Name == "data" || f.Name == "nats" })
			var err error
			if *envFile, err = c.m.defaultEnvFile(named); err != nil {
				return doctor.Options{}, false, err
			}
		}
		cfg, err := cfgFlags.load(c.m, *envFile)
		if err != nil {
			return doctor.Options{}, false, err
		}
		if c.m.creds == "" && c.m.Getenv("MESHBOX_CREDS") == "" {
			// The node's own credential, where this configuration keeps it.
			if f, err := os.Open(filepath.Join(cfg.DataDir, programs.AdminFile)); err == nil {
				f.Close()
				c.m.creds = f.Name()
			}
		} else if c.m.creds == "" {
			c.m.creds = c.m.Getenv("MESHBOX_CREDS")
		}
		url := *server
		if url == "" {
			url = "nats://" + doctor.ConnectAddr(cfg.NATS)
		}
		return doctor.Options{
			Config: cfg,
			Server: url,
			Status: func(ctx context.Context) (appliance.Status, error) {
				st, _, err := c.m.nodeStatus(ctx, url)
				return st, err
			},
			HostsFile:  *hosts,
			PublicName: *publicName,
			Timeout:    *timeout,
			EnvFile:    *envFile,
			Environ:    c.m.environ(),
		}, *asJSON, nil
	}
}
