package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// command is one command or subcommand of meshbox, a node of the one
// tree (commands) that running, `meshbox help`, usage errors, shell
// completion and the man page walk, so that they cannot drift from what
// runs. A command has subcommands (children), or flags and an action
// (flags), or, for the few not for people, a run of its own.
type command struct {
	name    string
	group   string // top level: Node, Messages, Mesh; "" for a command not for people
	summary string
	// usage is what a command with subcommands prints for -h, a missing
	// or an unknown subcommand; a subcommand without one prints its
	// parent's.
	usage string
	// children are its subcommands, in the order help lists them.
	children []command

	// synopsis is a leaf's usage line, after "meshbox ": its arguments
	// and flags.
	synopsis string
	// flags defines the command's flags on fs and returns its action,
	// which runs with the arguments fs leaves once it has parsed the
	// command line. The flags are declared there alone: the dispatcher,
	// help, completion and the man page all read them from a flag set it
	// filled.
	flags func(m *Main, fs *flag.FlagSet) action
	// flagsFirst: the flags end at the first argument (flag.Parse);
	// otherwise they may come before, between or after the arguments.
	flagsFirst bool
	// args are the kinds of words its arguments are, in order, and
	// values the kinds of its flags' values, for completion; a kind not
	// named is any word.
	args   []word
	values map[string]word

	// run runs a command that reads its arguments itself (not for
	// people: it has no flags).
	run func(m *Main, ctx context.Context, args []string) error
}

// action is what a command does with its arguments once its flags are
// parsed.
type action func(ctx context.Context, args []string) error

// word is a kind of word a command line holds, for completion.
type word string

const (
	wordAny   word = ""
	wordFile  word = "file"  // a file name: the shell completes it
	wordNode  word = "node"  // a node of the mesh
	wordTable word = "table" // a table of rows
	wordStage word = "stage" // a stage
)

// subNames are the names of c's subcommands.
func (c command) subNames() []string {
	out := make([]string, len(c.children))
	for i, ch := range c.children {
		out[i] = ch.name
	}
	return out
}

// child returns c's subcommand named name.
func (c command) child(name string) (command, bool) {
	for _, ch := range c.children {
		if ch.name == name {
			return ch, true
		}
	}
	return command{}, false
}

// descend follows words through c's subcommands: the commands they name
// from c down (c first), and the words after the last of them.
func (c command) descend(words []string) (path []command, rest []string) {
	path = []command{c}
	for len(words) > 0 {
		ch, ok := path[len(path)-1].child(words[0])
		if !ok {
			break
		}
		path, words = append(path, ch), words[1:]
	}
	return path, words
}

// leaves calls f with the names below c of each of its subcommands that
// has none of its own, depth first, in order.
func (c command) leaves(f func(names []string)) {
	c.walk(func(names []string, c command) {
		if len(c.children) == 0 && len(names) > 0 {
			f(names)
		}
	})
}

// walk calls f with c and every command below it, with their names
// below c, depth first, in order.
func (c command) walk(f func(names []string, c command)) {
	var walk func(c command, names []string)
	walk = func(c command, names []string) {
		f(names, c)
		for _, ch := range c.children {
			walk(ch, append(names[:len(names):len(names)], ch.name))
		}
	}
	walk(c, nil)
}

// flagDecl is one flag a command declares: what help, completion and the
// man page know of it.
type flagDecl struct {
	name, help string
	value      bool // it takes a value (it is no boolean flag)
	kind       word // what its value is, for completion
}

// flagSet returns a flag set with c's flags on m's streams, and the
// action they belong to; nil for a command without flags of its own.
func (c command) flagSet(m *Main, path string) (*flag.FlagSet, action) {
	if c.flags == nil {
		return nil, nil
	}
	fs := flag.NewFlagSet(path, flag.ContinueOnError)
	fs.SetOutput(m.Stderr)
	synopsis := c.synopsis
	fs.Usage = func() { printUsage(m.Stderr, synopsis, fs) }
	return fs, c.flags(m, fs)
}

// printUsage writes a leaf's help: its synopsis and its flags.
func printUsage(w io.Writer, synopsis string, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: meshbox %s\n", synopsis)
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		fmt.Fprint(w, "\nFlags:\n")
		fs.PrintDefaults()
	}
}

// declared returns the flags c declares, in the order of their names,
// as they are with no environment.
func (c command) declared() []flagDecl {
	fs, _ := c.flagSet(quietMain(), c.name)
	if fs == nil {
		return nil
	}
	var out []flagDecl
	fs.VisitAll(func(f *flag.Flag) {
		out = append(out, flagDecl{name: f.Name, help: f.Usage, value: !isBool(f), kind: c.values[f.Name]})
	})
	return out
}

// withValues returns c with the kinds of values, of kinds, of the flags
// it has.
func (c command) withValues(kinds map[string]word) command {
	c.values = map[string]word{}
	for _, f := range c.declared() {
		if k, ok := kinds[f.name]; ok {
			c.values[f.name] = k
		}
	}
	return c
}

// isBool reports whether f is a boolean flag (-f, not -f VALUE).
func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// quietMain is a Main with no environment that writes nowhere: the one
// help, completion and the man page define flags on.
func quietMain() *Main {
	return &Main{Stdin: strings.NewReader(""), Stdout: io.Discard, Stderr: io.Discard, Getenv: func(string) string { return "" }}
}

// helpText is what `meshbox PATH -h` prints for the command at the end
// of path: a leaf's synopsis and flags, or the usage of a command with
// subcommands (its nearest ancestor's, when it has none of its own).
func helpText(path []command) string {
	c := path[len(path)-1]
	if len(c.children) > 0 || c.flags == nil {
		for i := len(path) - 1; i >= 0; i-- {
			if path[i].usage != "" {
				return path[i].usage
			}
		}
		return ""
	}
	var b strings.Builder
	m := quietMain()
	m.Stderr = &b
	fs, _ := c.flagSet(m, c.name)
	fs.Usage()
	return b.String()
}

// pathName is the command line of path: "mesh node add".
func pathName(path []command) string {
	return strings.Join(namesOf(path), " ")
}

// namesOf are the names of path's commands.
func namesOf(path []command) []string {
	out := make([]string, len(path))
	for i, c := range path {
		out[i] = c.name
	}
	return out
}

// isHelp reports whether a is a request for help.
func isHelp(a string) bool { return a == "-h" || a == "-help" || a == "--help" }

// dispatch runs the command top with args, the words after its name: it
// descends to the subcommand they name (flags may come before it), and
// runs it. A missing or unknown subcommand prints its parent's usage and
// is a usage error; -h (or help) where a subcommand is due prints the
// usage.
func (m *Main) dispatch(ctx context.Context, top command, args []string) error {
	path := []command{top}
	for {
		c := path[len(path)-1]
		if len(c.children) == 0 {
			return m.runLeaf(ctx, path, args)
		}
		i := subcommandAt(c, args)
		switch {
		case slices.ContainsFunc(args[:max(i, 0)], isHelp), i >= 0 && args[i] == "help", i < 0 && slices.ContainsFunc(args, isHelp):
			fmt.Fprint(m.Stdout, helpText(path))
			return nil
		case i < 0:
			fmt.Fprint(m.Stderr, helpText(path))
			return usagef("%s: no command given", pathName(path))
		}
		ch, ok := c.child(args[i])
		if !ok {
			fmt.Fprint(m.Stderr, helpText(path))
			below := strings.Join(append(namesOf(path[1:]), args[i]), " ")
			var known []string
			top.walk(func(names []string, _ command) { known = append(known, strings.Join(names, " ")) })
			return usagef("%s: unknown command %q%s", top.name, below, didYouMean(below, known[1:]))
		}
		path = append(path, ch)
		args = slices.Concat(args[:i], args[i+1:])
	}
}

// subcommandAt returns the index in args of the word that names one of
// c's subcommands: the first that is no flag nor a flag's value; -1 if
// there is none.
func subcommandAt(c command, args []string) int {
	takesValue := map[string]bool{}
	c.walk(func(_ []string, c command) {
		for _, f := range c.declared() {
			takesValue[f.name] = takesValue[f.name] || f.value
		}
	})
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return -1
		case len(a) > 1 && a[0] == '-':
			name, _, inline := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if takesValue[name] && !inline {
				i++
			}
		default:
			return i
		}
	}
	return -1
}

// runLeaf parses the flags of the command at the end of path from args
// and runs its action.
func (m *Main) runLeaf(ctx context.Context, path []command, args []string) error {
	c := path[len(path)-1]
	if c.run != nil {
		return c.run(m, ctx, args)
	}
	fs, act := c.flagSet(m, pathName(path))
	if c.flagsFirst {
		if err := parseFlags(fs, args); err != nil {
			return err
		}
		return act(ctx, fs.Args())
	}
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	return act(ctx, pos)
}
