package main

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/meshbox/meshbox/internal/suggest"
)

// commands returns the tree's top level, in the order the usage lists
// them.
func commands() []command {
	return []command{
		{name: "run", group: "Node", summary: "run a node (standalone without --db; joins the mesh with it)",
			synopsis: "run [flags]", flagsFirst: true, values: map[string]word{"config": wordFile, "env-file": wordFile},
			flags: func(m *Main, fs *flag.FlagSet) action { return (&RunCommand{m: m}).flags(fs) }},
		{name: "status", group: "Node", summary: "show the status of the local node",
			synopsis: "status [--json] [--server URL]", flagsFirst: true,
			flags: func(m *Main, fs *flag.FlagSet) action { return (&StatusCommand{m: m}).flags(fs) }},
		{name: "nodes", group: "Node", summary: "list the local node's peers: state, last seen, what they host",
			synopsis: "nodes [--json] [--server URL]", flagsFirst: true,
			flags: func(m *Main, fs *flag.FlagSet) action { return (&NodesCommand{m: m}).flags(fs) }},
		{name: "caps", group: "Node", summary: "list capabilities and stages: hosted here, and by which peers",
			synopsis: "caps [--json] [--server URL]", flagsFirst: true,
			flags: func(m *Main, fs *flag.FlagSet) action { return (&CapsCommand{m: m}).flags(fs) }},
		{name: "modules", group: "Node", summary: "list the modules assigned to the local node: state, pid, restarts, last exit",
			synopsis: "modules [--json] [--server URL]", flagsFirst: true,
			flags: func(m *Main, fs *flag.FlagSet) action { return (&ModulesCommand{m: m}).flags(fs) }},
		{name: "module", group: "Node", summary: "control a module by hand: module start|stop|restart|logs NAME",
			usage: moduleUsage, children: moduleCommands()},
		{name: "doctor", group: "Node", summary: "check the node's situation: data dir, database, broker, cache, clock, names",
			synopsis: "doctor [--db URL] [--broker URL] [--data DIR] [--nats HOST:PORT] [--server URL] [--json]", flagsFirst: true,
			values: map[string]word{"config": wordFile, "env-file": wordFile, "hosts": wordFile},
			flags:  func(m *Main, fs *flag.FlagSet) action { return (&DoctorCommand{m: m}).flags(fs) }},
		{name: "program", group: "Node", summary: "local programs' credentials",
			usage: programUsage, children: programCommands()},
		{name: "dlq", group: "Node", summary: "dead letters of a stage: list [STAGE], show STAGE ID, replay STAGE ID|--all, purge STAGE",
			usage: dlqUsage, children: dlqCommands()},
		{name: "backup", group: "Node", summary: "write a backup of the node, running or stopped, its secrets sealed: backup --out FILE",
			synopsis: "backup --out FILE (--kit FILE | --passphrase-file FILE) [--blobs] [--data DIR] [--server URL]", flagsFirst: true,
			values: map[string]word{"out": wordFile, "kit": wordFile, "passphrase-file": wordFile, "data": wordFile, "config": wordFile, "env-file": wordFile, "creds": wordFile},
			flags:  func(m *Main, fs *flag.FlagSet) action { return (&BackupCommand{m: m}).flags(fs) }},
		{name: "restore", group: "Node", summary: "make a new or empty data directory the node of a backup: restore FILE --data DIR",
			synopsis: "restore FILE --data DIR (--kit FILE | --passphrase-file FILE) [--env-out FILE]",
			args:     []word{wordFile},
			values:   map[string]word{"kit": wordFile, "passphrase-file": wordFile, "data": wordFile, "config": wordFile, "env-file": wordFile, "env-out": wordFile},
			flags:    func(m *Main, fs *flag.FlagSet) action { return (&RestoreCommand{m: m}).flags(fs) }},
		{name: "version", group: "Node", summary: "show the version of this binary and of the local node",
			synopsis: "version [--server URL] [--json]", flagsFirst: true,
			flags: func(m *Main, fs *flag.FlagSet) action { return (&VersionCommand{m: m}).flags(fs) }},
		{name: "completion", group: "Node", summary: "print a shell completion script",
			usage: completionUsage, children: completionCommands()},
		{name: "call", group: "Messages", summary: "call a capability: call CAP [DATA] [--to NODE] [--timeout D]",
			synopsis: "call CAPABILITY [DATA] [--to NODE] [--timeout D] [--header K=V]...\n\nDATA is read from standard input when not given.",
			values:   map[string]word{"to": wordNode},
			flags:    func(m *Main, fs *flag.FlagSet) action { return (&CallCommand{m: m}).flags(fs) }},
		{name: "send", group: "Messages", summary: "submit a command for a stage: send STAGE [DATA]",
			synopsis: "send STAGE [DATA] [--id ID] [--header K=V]...\n\nDATA is read from standard input when not given.",
			args:     []word{wordStage, wordAny},
			flags:    func(m *Main, fs *flag.FlagSet) action { return (&SendCommand{m: m}).flags(fs) }},
		{name: "emit", group: "Messages", summary: "publish an event: emit TOPIC [DATA]",
			synopsis: "emit TOPIC [DATA] [--header K=V]...\n\nDATA is read from standard input when not given.",
			flags:    func(m *Main, fs *flag.FlagSet) action { return (&EmitCommand{m: m}).flags(fs) }},
		{name: "listen", group: "Messages", summary: "print the messages on a subject: listen PATTERN",
			synopsis: "listen PATTERN [--count N] [-v]\n\nPATTERN is a NATS subject, wildcards allowed (evt.>, cap.echo).",
			flags:    func(m *Main, fs *flag.FlagSet) action { return (&ListenCommand{m: m}).flags(fs) }},
		{name: "blob", group: "Messages", summary: "exact bytes as blobs: blob put FILE, get REF [-o FILE], list, rm REF",
			usage: blobUsage, children: blobCommands()},
		{name: "rows", group: "Messages", summary: "tables of rows that converge across the mesh",
			usage: rowsUsage, children: rowsCommands()},
		{name: "init", group: "Mesh", summary: "stand up a mesh: schema, broker setting, first node",
			synopsis: "init --db URL --node NAME --broker AMQP_URL --broker-admin URL [--stages S,...] [--public-name NAME] [--ttl 24h] [--kit FILE] [--force]", flagsFirst: true,
			flags: func(m *Main, fs *flag.FlagSet) action { return (&InitCommand{m: m}).flags(fs) }},
		{name: "mesh", group: "Mesh", summary: "administer the mesh database: nodes, assignments, overrides, settings, grants",
			usage: meshUsage, children: meshCommands()},
		{name: "join", group: "Mesh", summary: "make this machine a node of a mesh: join TOKEN (from mesh node add)",
			synopsis: "join TOKEN [--env-file PATH] [--data DIR] [--force]", values: map[string]word{"env-file": wordFile, "data": wordFile},
			flags: func(m *Main, fs *flag.FlagSet) action { return (&JoinCommand{m: m}).flags(fs) }},
		{name: "cache", group: "Mesh", summary: "inspect a stopped node's bindings cache",
			usage: cacheUsage, children: cacheCommands()},
		// Started by the node itself, not for people.
		{name: "module-guard", run: func(m *Main, ctx context.Context, a []string) error { return (&ModuleGuardCommand{m: m}).Run(ctx, a) }},
		{name: "__complete", run: func(m *Main, ctx context.Context, a []string) error { return m.complete(ctx, a) }},
		{name: "man", run: func(m *Main, ctx context.Context, a []string) error { return m.manPage(ctx, a) }},
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

// summaryOf is c's line in `meshbox help`: its summary, then its
// subcommands when they are few enough to list.
func summaryOf(c command) string {
	if len(c.children) == 0 || len(c.children) > 8 || strings.Contains(c.summary, ":") {
		return c.summary
	}
	return c.summary + ": " + strings.Join(c.subNames(), ", ")
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
		fmt.Fprintf(&b, "  %-10s %s\n", c.name, summaryOf(c))
	}
	b.WriteString("\nRun 'meshbox help <command>' (or 'meshbox <command> -h') for a command's flags.\n")
	return b.String()
}

// Run runs the command named by args[0].
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
		return m.helpOf(c, rest[1:])
	}
	c, ok := findCommand(name)
	if !ok {
		return usagef("unknown command %q%s; run 'meshbox help' for the list", name, didYouMean(name, commandNames()))
	}
	return m.dispatch(ctx, c, rest)
}
