package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/meshbox/meshbox/internal/suggest"
)

// commands returns the tree's top level, in the order the usage lists
// them.
func commands() []command {
	return []command{
		{"run", "Node", "run a node (standalone without --db; joins the mesh with it)", nil,
			func(m *Main, ctx context.Context, a []string) error { return (&RunCommand{m: m}).Run(ctx, a) }},
		{"status", "Node", "show the status of the local node", nil,
			func(m *Main, ctx context.Context, a []string) error { return (&StatusCommand{m: m}).Run(ctx, a) }},
		{"nodes", "Node", "list the local node's peers: state, last seen, what they host", nil,
			func(m *Main, ctx context.Context, a []string) error { return (&NodesCommand{m: m}).Run(ctx, a) }},
		{"caps", "Node", "list capabilities and stages: hosted here, and by which peers", nil,
			func(m *Main, ctx context.Context, a []string) error { return (&CapsCommand{m: m}).Run(ctx, a) }},
		{"modules", "Node", "list the modules assigned to the local node: state, pid, restarts, last exit", nil,
			func(m *Main, ctx context.Context, a []string) error { return (&ModulesCommand{m: m}).Run(ctx, a) }},
		{"module", "Node", "control a module by hand: module start|stop|restart|logs NAME", sub("start", "stop", "restart", "logs"),
			func(m *Main, ctx context.Context, a []string) error { return (&ModuleCommand{m: m}).Run(ctx, a) }},
		{"doctor", "Node", "check the node's situation: data dir, database, broker, cache, clock, names", nil,
			func(m *Main, ctx context.Context, a []string) error { return (&DoctorCommand{m: m}).Run(ctx, a) }},
		{"program", "Node", "local programs' credentials: add, list, show, remove", sub("add", "list", "show", "remove"),
			func(m *Main, ctx context.Context, a []string) error { return (&ProgramCommand{m: m}).Run(ctx, a) }},
		{"dlq", "Node", "dead letters of a stage: list [STAGE], show STAGE ID, replay STAGE ID|--all, purge STAGE", sub("list", "show", "replay", "purge"),
			func(m *Main, ctx context.Context, a []string) error { return (&DlqCommand{m: m}).Run(ctx, a) }},
		{"version", "Node", "show the version of this binary and of the local node", nil,
			func(m *Main, ctx context.Context, a []string) error { return (&VersionCommand{m: m}).Run(ctx, a) }},
		{"completion", "Node", "print a shell completion script: completion bash|zsh|fish", sub("bash", "zsh", "fish"),
			func(m *Main, ctx context.Context, a []string) error { return m.completion(a) }},
		{"call", "Messages", "call a capability: call CAP [DATA] [--to NODE] [--timeout D]", nil,
			func(m *Main, ctx context.Context, a []string) error { return (&CallCommand{m: m}).Run(ctx, a) }},
		{"send", "Messages", "submit a command for a stage: send STAGE [DATA]", nil,
			func(m *Main, ctx context.Context, a []string) error { return (&SendCommand{m: m}).Run(ctx, a) }},
		{"emit", "Messages", "publish an event: emit TOPIC [DATA]", nil,
			func(m *Main, ctx context.Context, a []string) error { return (&EmitCommand{m: m}).Run(ctx, a) }},
		{"listen", "Messages", "print the messages on a subject: listen PATTERN", nil,
			func(m *Main, ctx context.Context, a []string) error { return (&ListenCommand{m: m}).Run(ctx, a) }},
		{"blob", "Messages", "exact bytes as blobs: blob put FILE, get REF [-o FILE], list, rm REF", sub("put", "get", "list", "rm"),
			func(m *Main, ctx context.Context, a []string) error { return (&BlobCommand{m: m}).Run(ctx, a) }},
		{"rows", "Messages", "tables of rows that converge across the mesh: rows put, get, list, watch, delete, history", sub("put", "get", "list", "watch", "delete", "history"),
			func(m *Main, ctx context.Context, a []string) error { return (&RowsCommand{m: m}).Run(ctx, a) }},
		{"init", "Mesh", "stand up a mesh: schema, broker setting, first node", nil,
			func(m *Main, ctx context.Context, a []string) error { return (&InitCommand{m: m}).Run(ctx, a) }},
		{"mesh", "Mesh", "administer the mesh database: nodes, assignments, overrides, settings, grants", meshChildren(),
			func(m *Main, ctx context.Context, a []string) error { return (&MeshCommand{m: m}).Run(ctx, a) }},
		{"join", "Mesh", "make this machine a node of a mesh: join TOKEN (from mesh node add)", nil,
			func(m *Main, ctx context.Context, a []string) error { return (&JoinCommand{m: m}).Run(ctx, a) }},
		{"cache", "Mesh", "inspect a stopped node's bindings cache: show, history, diff, verify", sub("show", "history", "diff", "verify"),
			func(m *Main, ctx context.Context, a []string) error { return (&CacheCommand{m: m}).Run(ctx, a) }},
		// Started by the node itself, not for people.
		{"module-guard", "", "", nil,
			func(m *Main, ctx context.Context, a []string) error { return (&ModuleGuardCommand{m: m}).Run(ctx, a) }},
		{"__complete", "", "", nil,
			func(m *Main, ctx context.Context, a []string) error { return m.complete(ctx, a) }},
		{"man", "", "", nil,
			func(m *Main, ctx context.Context, a []string) error { return m.manPage(ctx, a) }},
	}
}

// findCommand returns the command named name.
func findCommand(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// commandNames are the names of the commands for people.
func commandNames() []string {
	var out []string
	for _, c := range commands() {
		if c.group != "" {
			out = append(out, c.name)
		}
	}
	return out
}

// didYouMean is " (did you mean NAME?)" for the name of known nearest
// to name, or "" when none is near.
func didYouMean(name string, known []string) string {
	if near, ok := suggest.Nearest(name, known); ok {
		return " (did you mean " + near + "?)"
	}
	return ""
}

// usageText is `meshbox help`.
func usageText() string {
	var b strings.Builder
	b.WriteString("meshbox turns a home server into a node of a mesh.\n\nUsage:\n  meshbox <command> [flags] [arguments]\n")
	group := ""
	for _, c := range commands() {
		if c.group == "" {
			continue
		}
		if c.group != group {
			group = c.group
			fmt.Fprintf(&b, "\n%s:\n", group)
		}
		fmt.Fprintf(&b, "  %-10s %s\n", c.name, c.summary)
	}
	b.WriteString("\nRun 'meshbox help <command>' (or 'meshbox <command> -h') for a command's flags.\n")
	return b.String()
}

// Run runs the subcommand named by args[0].
func (m *Main) Run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(m.Stderr, usageText())
		return usagef("no command given")
	}
	name, rest := args[0], args[1:]
	switch name {
	case "--version", "-version":
		name = "version"
	case "help", "-h", "--help":
		if len(rest) == 0 {
			fmt.Fprint(m.Stdout, usageText())
			return nil
		}
		c, ok := findCommand(rest[0])
		if !ok || c.group == "" {
			return usagef("help: unknown command %q%s; run 'meshbox help' for the list", rest[0], didYouMean(rest[0], commandNames()))
		}
		return m.helpOf(ctx, c, rest[1:])
	}
	c, ok := findCommand(name)
	if !ok {
		return usagef("unknown command %q%s; run 'meshbox help' for the list", name, didYouMean(name, commandNames()))
	}
	return c.run(m, ctx, rest)
}
