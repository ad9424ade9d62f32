package main

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/meshbox/meshbox/appliance"
)

// This file is what meshbox says about itself: `meshbox help CMD`, the
// shell completion scripts and their helper `meshbox __complete`, and the
// man page (`meshbox man`, which the Debian package ships). All of it
// walks the command tree (tree.go, commands.go) and asks each command's
// own flag set for its help as a user would: nothing to keep in step.

// helpOf prints command c's help (of its subcommand sub, if given) on
// Stdout.
func (m *Main) helpOf(ctx context.Context, c command, sub []string) error {
	fmt.Fprint(m.Stdout, m.captureHelp(ctx, c, sub))
	return nil
}

// captureHelp returns what `meshbox NAME [SUB] -h` prints.
func (m *Main) captureHelp(ctx context.Context, c command, sub []string) string {
	var buf bytes.Buffer
	hm := &Main{Stdin: strings.NewReader(""), Stdout: &buf, Stderr: &buf, Getenv: func(string) string { return "" }}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_ = c.run(hm, ctx, append(slices.Clone(sub), "-h"))
	return buf.String()
}

var flagLine = regexp.MustCompile(`(?m)^\s+-([A-Za-z0-9][A-Za-z0-9_-]*)`)

// flagsIn returns the flags a command's help lists, as --name.
func flagsIn(help string) []string {
	var out []string
	for _, m := range flagLine.FindAllStringSubmatch(help, -1) {
		if f := "--" + m[1]; !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out
}

// complete prints, one per line, what may come after the words given
// (the command line so far, without "meshbox" and the word being typed):
// the subcommands of the command the words name, or the flags of a
// command without subcommands, from the tree.
func (m *Main) complete(ctx context.Context, words []string) error {
	var out []string
	switch {
	case len(words) == 0 || (words[0] == "help" && len(words) == 1):
		out = commandNames()
		if len(words) == 0 {
			out = append(out, "help")
		}
	default:
		c, ok := findCommand(words[0])
		if !ok || c.group == "" {
			return nil
		}
		var pos []string // the words that are not flags
		for _, a := range words[1:] {
			if !strings.HasPrefix(a, "-") {
				pos = append(pos, a)
			}
		}
		path, rest := c.descend(pos)
		switch last := path[len(path)-1]; {
		case len(last.children) == 0:
			out = flagsIn(m.captureHelp(ctx, c, namesOf(path[1:])))
		case len(rest) == 0:
			out = last.subNames()
		}
	}
	for _, w := range out {
		fmt.Fprintln(m.Stdout, w)
	}
	return nil
}

// namesOf are the names of path's commands.
func namesOf(path []command) []string {
	out := make([]string, len(path))
	for i, c := range path {
		out[i] = c.name
	}
	return out
}

const bashCompletion = `# bash completion for meshbox. Load it with
#   source <(meshbox completion bash)
# or install it as /usr/share/bash-completion/completions/meshbox (the
# Debian package does).
_meshbox() {
	local cur=${COMP_WORDS[COMP_CWORD]}
	local words=("${COMP_WORDS[@]:1:COMP_CWORD-1}")
	local IFS=$'\n'
	COMPREPLY=($(compgen -W "$(meshbox __complete "${words[@]}" 2>/dev/null)" -- "$cur"))
}
complete -o default -F _meshbox meshbox
`

const fishCompletion = `# fish completion for meshbox: meshbox completion fish | source
complete -c meshbox -f -a '(meshbox __complete (commandline -opc)[2..-1])'
`

// completion prints the completion script of a shell.
func (m *Main) completion(args []string) error {
	if slices.Contains(args, "-h") || slices.Contains(args, "--help") {
		fmt.Fprintln(m.Stderr, "Usage: meshbox completion bash|zsh|fish\n\nPrints the shell's completion script: source <(meshbox completion bash)")
		return nil
	}
	if len(args) != 1 {
		return usagef("completion: want one shell: bash, zsh or fish")
	}
	switch args[0] {
	case "bash":
		fmt.Fprint(m.Stdout, bashCompletion)
	case "zsh":
		fmt.Fprint(m.Stdout, "# zsh completion for meshbox: source <(meshbox completion zsh)\nautoload -U +X bashcompinit && bashcompinit\n"+bashCompletion)
	case "fish":
		fmt.Fprint(m.Stdout, fishCompletion)
	default:
		return usagef("completion: unknown shell %q (bash, zsh or fish)", args[0])
	}
	return nil
}

// manPage prints meshbox(1) in roff.
func (m *Main) manPage(ctx context.Context, args []string) error {
	if len(args) > 0 {
		return usagef("man takes no arguments")
	}
	w := m.Stdout
	fmt.Fprintf(w, ".TH MESHBOX 1 \"\" \"meshbox %s\" \"User Commands\"\n", roff(appliance.Build().Version))
	fmt.Fprint(w, ".SH NAME\nmeshbox \\- turn a home server into a node of a mesh\n")
	fmt.Fprint(w, ".SH SYNOPSIS\n.B meshbox\n.I command\n[flags] [arguments]\n")
	fmt.Fprint(w, ".SH DESCRIPTION\nPrograms on the node, in any language and with any NATS client, talk to the node's embedded NATS server; "+
		"the node carries their requests, commands and events to the other nodes over one outbound connection to the mesh's RabbitMQ broker, "+
		"and keeps working when the internet, the broker or the mesh database is away. "+
		"The manual is in /usr/share/doc/meshbox/docs (getting-started.md first).\n")
	fmt.Fprint(w, ".SH COMMANDS\n")
	group := ""
	for _, c := range commands() {
		if c.group == "" {
			continue
		}
		if c.group != group {
			group = c.group
			fmt.Fprintf(w, ".SS %s\n", group)
		}
		fmt.Fprintf(w, ".TP\n.B %s\n%s\n", c.name, roff(c.summary))
		help := m.captureHelp(ctx, c, nil)
		fmt.Fprintf(w, ".RS\n.nf\n%s.fi\n.RE\n", roffBlock(help))
		c.leaves(func(names []string) {
			if h := m.captureHelp(ctx, c, names); h != help { // completion's are its own
				fmt.Fprintf(w, ".RS\n.nf\n%s.fi\n.RE\n", roffBlock(h))
			}
		})
	}
	fmt.Fprint(w, ".SH ENVIRONMENT\nEvery setting of meshbox run can come from the environment (or an env file, see FILES):\n.RS\n.nf\n")
	for _, e := range appliance.EnvVars {
		fmt.Fprintf(w, "%s\t%s\n", e.Name, e.Field)
	}
	fmt.Fprint(w, ".fi\n.RE\n")
	fmt.Fprint(w, ".SH FILES\n.TP\n/etc/meshbox/meshbox.env\nthe node's configuration, written by meshbox join (mode 0600); the client commands read it too\n"+
		".TP\n/var/lib/meshbox\nthe node's data directory: bindings cache, outbox, keys, programs' credentials\n"+
		".TP\n/etc/meshbox/modules\nthe module catalog\n")
	fmt.Fprint(w, ".SH SEE ALSO\n.BR systemctl (1),\n.BR journalctl (1),\n.BR nats (1)\n")
	return nil
}

// roff escapes text for a roff line.
func roff(s string) string { return strings.ReplaceAll(s, `\`, `\e`) }

// roffBlock escapes a block of text for .nf: backslashes, and lines that
// would start a request.
func roffBlock(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		l = roff(l)
		if strings.HasPrefix(l, ".") || strings.HasPrefix(l, "'") {
			l = `\&` + l
		}
		b.WriteString(l + "\n")
	}
	return b.String()
}
