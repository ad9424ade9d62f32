package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/modules"
)

// RunCommand runs a node until it is signalled to stop.
type RunCommand struct{ m *Main }

// flags defines run's flags; its action parses the configuration (defaults, file, environment, flags), starts
// the node, and stops it gracefully when ctx ends.
func (c *RunCommand) flags(fs *flag.FlagSet) action {
	config := c.config(fs)
	return func(ctx context.Context, args []string) error {
		cfg, envFile, err := config(args)
		if err != nil {
			return err
		}
		logger := newLogger(c.m.Stderr, cfg.Log.Level, cfg.Log.Format, underJournal(c.m.Getenv, c.m.Stderr))
		// A misspelt variable is ignored: say so, once each, before anything
		// runs with the default it meant to change.
		unknown, _ := appliance.UnknownEnvVars(envFile, c.m.environ())
		for _, u := range unknown {
			logger.Warn(u.String())
		}
		a, err := appliance.New(cfg, logger)
		if err != nil {
			return err
		}
		if exe, err := os.Executable(); err == nil {
			a.SetModuleGuard([]string{exe, "module-guard"}) // no module outlives the node
		}
		if err := a.Start(ctx); err != nil {
			_ = a.Close()
			return fmt.Errorf("start: %w", err)
		}
		a.Logger().Info("node ready", "nats", a.NATSURL(), "http", a.HTTPURL(), "data", cfg.DataDir, "version", appliance.Build().Version)
		if err := sdNotify(c.m.Getenv, "READY=1"); err != nil {
			a.Logger().Warn("cannot tell systemd the node is ready (NOTIFY_SOCKET)", "err", err)
		}

		var runErr error
		select {
		case <-ctx.Done():
			a.Logger().Info("stopping")
		case runErr = <-a.Fatal():
			a.Logger().Error("stopping on a fatal error", "err", runErr)
		}
		_ = sdNotify(c.m.Getenv, "STOPPING=1")
		if err := a.Close(); err != nil {
			return errors.Join(runErr, fmt.Errorf("stop: %w", err))
		}
		if runErr == nil {
			a.Logger().Info("stopped")
		}
		return runErr
	}
}

// config builds the configuration with the appliance's loader: defaults,
// then the config file, then the environment, then flags. envFile is the
// env file it read ("" for none). It defines run's flags on fs and returns
// what reads them once fs has parsed the command line.
func (c *RunCommand) config(fs *flag.FlagSet) func(args []string) (cfg appliance.Config, envFile string, err error) {
	flags := addConfigFlags(fs)
	envFlag := fs.String("env-file", "", "read MESHBOX_* variables from this file first (default: "+
		appliance.DefaultEnvFile()+" if it exists, as written by meshbox join)")
	return func(args []string) (cfg appliance.Config, envFile string, err error) {
		if len(args) > 0 {
			return cfg, "", usagef("run takes no arguments, got %q", args[0])
		}
		envFile = *envFlag
		if envFile == "" {
			envFile = appliance.ExistingDefaultEnvFile()
		}
		cfg, err = flags.load(c.m, envFile)
		return cfg, envFile, err
	}
}

// ModuleGuardCommand is the node's module guard (not for people): it reads
// the process groups of the node's modules on its standard input and, if
// the node dies without saying goodbye, kills them (modules.RunGuard).
type ModuleGuardCommand struct{ m *Main }

// Run guards until its input ends. Signals meant for the node do not end
// it: only the node's end (its input closing) does.
func (c *ModuleGuardCommand) Run(ctx context.Context, args []string) error {
	if len(args) > 0 {
		return usagef("module-guard takes no arguments")
	}
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	if n := modules.RunGuard(c.m.Stdin); n > 0 {
		fmt.Fprintf(c.m.Stderr, "meshbox module-guard: the node died; killed %d module process groups\n", n)
	}
	return nil
}
