package main

import (
	"context"
	"errors"
	"flag"
	"fmt"

	"github.com/meshbox/meshbox/appliance"
)

// RunCommand runs a node until it is signalled to stop.
type RunCommand struct{ m *Main }

// Run parses the configuration (defaults, file, environment, flags), starts
// the node, and stops it gracefully when ctx ends.
func (c *RunCommand) Run(ctx context.Context, args []string) error {
	cfg, err := c.config(args)
	if err != nil {
		return err
	}
	logger := newLogger(c.m.Stderr, cfg.Log.Level, cfg.Log.Format)
	a, err := appliance.New(cfg, logger)
	if err != nil {
		return err
	}
	if err := a.Start(ctx); err != nil {
		_ = a.Close()
		return fmt.Errorf("start: %w", err)
	}
	a.Logger().Info("node ready", "nats", a.NATSURL(), "http", a.HTTPURL(), "data", cfg.DataDir, "version", appliance.Build().Version)

	var runErr error
	select {
	case <-ctx.Done():
		a.Logger().Info("stopping")
	case runErr = <-a.Fatal():
		a.Logger().Error("stopping on a fatal error", "err", runErr)
	}
	if err := a.Close(); err != nil {
		return errors.Join(runErr, fmt.Errorf("stop: %w", err))
	}
	if runErr == nil {
		a.Logger().Info("stopped")
	}
	return runErr
}

// config builds the configuration: defaults, then the config file, then the
// environment, then flags.
func (c *RunCommand) config(args []string) (appliance.Config, error) {
	cfg := appliance.DefaultConfig()
	fs := c.m.newFlagSet("run", "run [flags]")
	configFile := fs.String("config", "", "JSON config file (env MESHBOX_CONFIG)")
	flags := []struct{ name, field, help string }{
		{"node", "node", "this node's mesh name (env MESHBOX_NODE; default: the host name)"},
		{"data", "data", "data directory (env MESHBOX_DATA; default " + cfg.DataDir + ")"},
		{"nats", "nats", "NATS listen address host:port, port 0 = any free (env MESHBOX_NATS; default " + appliance.DefaultNATS + ")"},
		{"http", "http", "HTTP listen address host:port, port 0 = any free, or off (env MESHBOX_HTTP; default " + appliance.DefaultHTTP + ")"},
		{"db", "db", "mesh database URL postgres://... (env MESHBOX_DB; default: none, standalone)"},
		{"broker", "broker", "broker URL amqp(s)://..., overrides the broker.url setting (env MESHBOX_BROKER)"},
		{"log-level", "log.level", "debug, info, warn or error (env MESHBOX_LOG_LEVEL)"},
		{"log-format", "log.format", "text or json (env MESHBOX_LOG_FORMAT)"},
	}
	vals := map[string]*string{}
	for _, f := range flags {
		vals[f.name] = fs.String(f.name, "", f.help)
	}
	if err := parseFlags(fs, args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, usagef("run takes no arguments, got %q", fs.Arg(0))
	}
	if *configFile == "" {
		*configFile = c.m.Getenv("MESHBOX_CONFIG")
	}
	if *configFile != "" {
		if err := cfg.LoadFile(*configFile); err != nil {
			return cfg, err
		}
	}
	if err := cfg.ApplyEnv(c.m.Getenv); err != nil {
		return cfg, err
	}
	var setErr error
	fs.Visit(func(f *flag.Flag) {
		for _, d := range flags {
			if d.name == f.Name {
				if err := cfg.Set(d.field, f.Value.String()); err != nil && setErr == nil {
					setErr = err
				}
			}
		}
	})
	if setErr != nil {
		return cfg, setErr
	}
	if err := cfg.Validate(); err != nil {
		return cfg, err
	}
	return cfg, nil
}
