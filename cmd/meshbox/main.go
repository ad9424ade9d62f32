// Command meshbox turns a home server into a node of a mesh.
//
// main only builds the logger, handles signals and exits; every subcommand is
// a small type with Run(ctx, args) in this package.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/meshbox/meshbox/internal/redact"
)

func main() {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() { // lives as long as the process: the first signal stops gracefully, the second aborts
		<-sigs
		cancel()
		<-sigs
		fmt.Fprintln(os.Stderr, "meshbox: second signal: aborting")
		os.Exit(130)
	}()

	m := NewMain()
	err := m.Run(ctx, os.Args[1:])
	cancel()
	os.Exit(exitCode(m.Stderr, err))
}

// exitCode reports err on w and returns the process exit status: 0 for
// success and -h, 2 for usage errors, the code of an exitError, 1 otherwise.
func exitCode(w io.Writer, err error) int {
	var ee *exitError
	var ue *usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ee):
		if ee.msg != "" {
			fmt.Fprintln(w, "meshbox: "+ee.msg)
		}
		return ee.code
	case errors.As(err, &ue):
		fmt.Fprintln(w, "meshbox: "+ue.Error())
		return 2
	default:
		fmt.Fprintln(w, "meshbox: "+err.Error())
		return 1
	}
}

// exitError ends the program with a given exit status.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// usageError is a mistake in the command line.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{msg: fmt.Sprintf(format, args...)} }

// Main is the meshbox program: its streams and environment, so that tests can
// run it in-process.
type Main struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	Getenv func(string) string
	// Environ lists the environment as KEY=VALUE; nil: the names in it
	// are not checked (UnknownEnvVars).
	Environ func() []string

	// envFiles are where a command looks for the node's env file when
	// none is named (defaultEnvFile); nil: appliance.NodeEnvFiles().
	envFiles []string
	// names, when set, are the names completion offers (of nodes,
	// tables, stages) instead of those the node or the mesh database
	// knows.
	names func(ctx context.Context, k word) []string

	creds  string       // --creds of the command that runs (see serverFlag)
	client *clientFlags // the flags naming the node a client command talks to (serverFlag)
}

// NewMain returns a Main on the process's streams and environment.
func NewMain() *Main {
	return &Main{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv, Environ: os.Environ}
}

// newLogger builds the process's slog logger. It is the one place that
// chooses a handler; secrets are hidden before anything is written.
// Under systemd, each record carries its syslog priority for journald
// (journal: systemd.go).
func newLogger(w io.Writer, level, format string, journal bool) *slog.Logger {
	var lv slog.Level
	_ = lv.UnmarshalText([]byte(level)) // validated with the config; info otherwise
	opts := &slog.HandlerOptions{Level: lv}
	inner := func(w io.Writer) slog.Handler {
		if format == "json" {
			return slog.NewJSONHandler(w, opts)
		}
		return slog.NewTextHandler(w, opts)
	}
	if journal {
		return slog.New(redact.NewHandler(newPriorityHandler(w, inner)))
	}
	return slog.New(redact.NewHandler(inner(w)))
}

// parseFlags parses args and turns flag errors into usage errors.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usageError{msg: err.Error()}
	}
	return nil
}

// environ is the environment as KEY=VALUE, nil when m has none.
func (m *Main) environ() []string {
	if m.Environ == nil {
		return nil
	}
	return m.Environ()
}

// envFlag registers a string flag whose default is the value of the
// environment variable env. Help shows the default as "$ENV", never the
// value: a variable may hold a password or a token, and help, usage and
// error text never show one.
func (m *Main) envFlag(fs *flag.FlagSet, name, env, usage string) *string {
	p := new(string)
	m.envFlagVar(fs, p, name, env, usage)
	return p
}

// envFlagVar is envFlag storing the flag's value in p.
func (m *Main) envFlagVar(fs *flag.FlagSet, p *string, name, env, usage string) {
	v := m.Getenv(env)
	fs.StringVar(p, name, v, usage)
	if v != "" {
		fs.Lookup(name).DefValue = "$" + env
	}
}
