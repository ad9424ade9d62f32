package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/cache/meshdb"
)

// This file is what meshbox says about itself: `meshbox help CMD`, the
// shell completion scripts and their helper `meshbox __complete`, and the
// man page (`meshbox man`, which the Debian package ships). All of it
// walks the command tree (tree.go, commands.go) and reads each command's
// flags from it: nothing to keep in step.

// helpOf prints the help of command c (of its subcommand sub, if given)
// on Stdout, as `meshbox c sub... -h` does.
func (m *Main) helpOf(c command, sub []string) error {
	path, rest := c.descend(sub)
	if last := path[len(path)-1]; len(rest) > 0 && len(last.children) > 0 {
		below := strings.Join(append(namesOf(path[1:]), rest[0]), " ")
		return usagef("help %s: unknown command %q%s", c.name, below, didYouMean(below, last.subNames()))
	}
	fmt.Fprint(m.Stdout, helpText(path))
	return nil
}

// complete prints, one per line, what may come after the words given
// (the command line so far, without "meshbox" and the word being typed):
// the subcommands of the command the words name; or the flags of a
// command without subcommands and the names its next argument may be; or
// the names a flag's value may be. Names (nodes, tables, stages) come
// from the local node, or from the mesh database for a command that
// works on it, found as the command would find them; when neither
// answers, there are none, and nothing is said.
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
		out = m.completeAfter(ctx, c, words[1:])
	}
	for _, w := range out {
		fmt.Fprintln(m.Stdout, w)
	}
	return nil
}

// completeAfter returns what may come after words, the words that follow
// command c's name.
func (m *Main) completeAfter(ctx context.Context, c command, words []string) []string {
	path := []command{c}
	var pos, flagWords []string
	value := "" // the flag whose value is due
	for i := 0; i < len(words); i++ {
		w, last := path[len(path)-1], i == len(words)-1
		switch a := words[i]; {
		case len(a) > 1 && a[0] == '-':
			flagWords = append(flagWords, a)
			name, _, inline := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if !inline && takesValue(w, name) {
				if last {
					value = name
				} else {
					i++
					flagWords = append(flagWords, words[i])
				}
			}
		case len(w.children) > 0:
			ch, ok := w.child(a)
			if !ok {
				return nil
			}
			path = append(path, ch)
		default:
			pos = append(pos, a)
		}
	}
	leaf := path[len(path)-1]
	if len(leaf.children) > 0 {
		if value != "" {
			return nil
		}
		return leaf.subNames()
	}
	var kind word
	switch {
	case value != "":
		kind = leaf.values[value]
	case len(pos) < len(leaf.args):
		kind = leaf.args[len(pos)]
	}
	var out []string
	if value == "" {
		for _, f := range leaf.declared() {
			out = append(out, "--"+f.name)
		}
	}
	return append(out, m.namesOf(ctx, leaf, flagWords, kind)...)
}

// takesValue reports whether flag name of c (of any of its subcommands,
// for a command that has them) takes a value.
func takesValue(c command, name string) bool {
	found := false
	c.walk(func(_ []string, c command) {
		for _, f := range c.declared() {
			found = found || (f.name == name && f.value)
		}
	})
	return found
}

// namesOf returns the names of kind k that leaf c's argument or flag
// value may be, asking where c itself asks, as its flags (flagWords, the
// flags on the command line) say: the mesh database for a command with
// --db, else the local node. A kind that is no name gives none.
func (m *Main) namesOf(ctx context.Context, c command, flagWords []string, k word) []string {
	if k != wordNode && k != wordTable && k != wordStage {
		return nil
	}
	if m.names != nil {
		return m.names(ctx, k)
	}
	cm := &Main{Stdin: strings.NewReader(""), Stdout: io.Discard, Stderr: io.Discard, Getenv: m.Getenv, envFiles: m.envFiles}
	fs, _ := c.flagSet(cm, c.name)
	_ = fs.Parse(flagWords) // a mistake in them leaves the defaults
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if db := fs.Lookup("db"); db != nil && k != wordStage {
		return cm.namesInDB(ctx, db.Value.String(), k)
	}
	server := ""
	if f := fs.Lookup("server"); f != nil {
		server = f.Value.String()
	}
	st, _, err := cm.nodeStatus(ctx, server)
	if err != nil {
		return nil
	}
	set := map[string]bool{}
	switch k {
	case wordNode:
		set[st.Node] = true
		for _, p := range st.Peers {
			set[p.Name] = true
		}
	case wordTable:
		for _, t := range st.Rows {
			set[t.Table] = true
		}
	case wordStage:
		for _, s := range st.Capabilities.LocalStages {
			set[s] = true
		}
		for s := range st.Capabilities.RemoteStages {
			set[s] = true
		}
	}
	delete(set, "")
	return slices.Sorted(maps.Keys(set))
}

// namesInDB returns the names of nodes or tables in the mesh database at
// url; none when it does not answer.
func (m *Main) namesInDB(ctx context.Context, url string, k word) []string {
	if url == "" {
		return nil
	}
	db, err := meshdb.Open(ctx, url, meshdb.Options{})
	if err != nil {
		return nil
	}
	defer db.Close()
	var out []string
	switch k {
	case wordNode:
		nodes, err := db.Nodes(ctx)
		if err != nil {
			return nil
		}
		for _, n := range nodes {
			out = append(out, n.Name)
		}
	case wordTable:
		tables, err := (&MeshCommand{m: m}).tables(ctx, db)
		if err != nil {
			return nil
		}
		out = slices.Sorted(maps.Keys(tables))
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

const completionUsage = `Usage: meshbox completion bash|zsh|fish

Prints the shell's completion script: source <(meshbox completion bash)
`

// completionCommands are completion's subcommands: one a shell, each
// printing its script.
func completionCommands() []command {
	var out []command
	for _, sh := range []struct{ name, script string }{
		{"bash", bashCompletion},
		{"zsh", "# zsh completion for meshbox: source <(meshbox completion zsh)\nautoload -U +X bashcompinit && bashcompinit\n" + bashCompletion},
		{"fish", fishCompletion},
	} {
		out = append(out, command{name: sh.name, synopsis: "completion " + sh.name,
			flags: func(m *Main, fs *flag.FlagSet) action {
				return func(ctx context.Context, args []string) error {
					if len(args) > 0 {
						return usagef("completion %s takes no arguments", sh.name)
					}
					fmt.Fprint(m.Stdout, sh.script)
					return nil
				}
			}})
	}
	return out
}

// manPage prints meshbox(1) in roff.
func (m *Main) manPage(_ context.Context, args []string) error {
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
		fmt.Fprintf(w, ".TP\n.B %s\n%s\n", c.name, roff(summaryOf(c)))
		c.walk(func(names []string, _ command) {
			path, _ := c.descend(names)
			if last := path[len(path)-1]; len(names) > 0 && last.usage == "" && len(last.children) > 0 {
				return // a group of subcommands ("mesh node"): its parent's usage says it
			}
			fmt.Fprintf(w, ".RS\n.nf\n%s.fi\n.RE\n", roffBlock(helpText(path)))
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
