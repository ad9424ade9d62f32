package main

import (
	"context"
	"strings"
)

// command is one command or subcommand of meshbox, a node of the one
// tree (commands) that running, `meshbox help`, usage errors, shell
// completion and the man page walk, so that they cannot drift from what
// runs.
type command struct {
	name    string
	group   string // top level: Node, Messages, Mesh; "" for a command not for people
	summary string
	// children are its subcommands, in the order help lists them. A
	// command's run takes the arguments that follow its own name, a
	// subcommand's name first; a child without a run of its own is run
	// by its parent's.
	children []command
	run      func(m *Main, ctx context.Context, args []string) error
}

// sub returns subcommands named names that their parent's run runs.
func sub(names ...string) []command {
	out := make([]command, len(names))
	for i, n := range names {
		out[i] = command{name: n}
	}
	return out
}

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
	var walk func(c command, names []string)
	walk = func(c command, names []string) {
		if len(c.children) == 0 && len(names) > 0 {
			f(names)
			return
		}
		for _, ch := range c.children {
			walk(ch, append(names[:len(names):len(names)], ch.name))
		}
	}
	walk(c, nil)
}

// meshChildren are mesh's subcommands, from its table of commands: a
// command of two words ("node add") is a subcommand of its first.
func meshChildren() []command {
	// Only the names are read: no leaf runs on this Main.
	var out []command
	for _, n := range (&MeshCommand{m: &Main{}}).names() {
		first, second, two := strings.Cut(n, " ")
		i := len(out)
		for j, c := range out {
			if c.name == first {
				i = j
			}
		}
		if i == len(out) {
			out = append(out, command{name: first})
		}
		if two {
			out[i].children = append(out[i].children, command{name: second})
		}
	}
	return out
}
