package main

import (
	"bytes"
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
)

// TestHelpOfACommand: meshbox help CMD prints that command's flags on
// stdout; an unknown command is refused.
func TestHelpOfACommand(t *testing.T) {
	c := cli{env: map[string]string{}}
	out := c.ok(t, "help", "call")
	for _, want := range []string{"Usage: meshbox call", "-timeout", "-to"} {
		if !strings.Contains(out, want) {
			t.Errorf("help call: %q lacks %q", out, want)
		}
	}
	if out := c.ok(t, "help", "program", "add"); !strings.Contains(out, "-host") {
		t.Errorf("help program add: %q lacks -host", out)
	}
	c.fails(t, `unknown command "nosuch"`, "help", "nosuch")
	if out := c.ok(t, "help"); !strings.Contains(out, "completion") || strings.Contains(out, "__complete") || strings.Contains(out, "module-guard") {
		t.Errorf("help: %q, want the commands for people only", out)
	}
}

// TestSubcommandsAreTheCommands: every subcommand the table lists (for
// completion and the man page) is one its command accepts, and mesh's
// come from its own table.
func TestSubcommandsAreTheCommands(t *testing.T) {
	for _, c := range commands() {
		c.leaves(func(sub []string) {
			help := runHelp(t, append([]string{c.name}, sub...))
			if strings.Contains(help, "unknown") || help == "" {
				t.Errorf("%s %s -h: %q, want its help", c.name, strings.Join(sub, " "), help)
			}
		})
	}
	mesh, _ := findCommand("mesh")
	next := mesh.subNames()
	for _, want := range []string{"node", "assign", "setting", "key", "scope"} {
		found := false
		for _, w := range next {
			found = found || w == want
		}
		if !found {
			t.Errorf("mesh's first words %v lack %s", next, want)
		}
	}
}

// TestComplete: what __complete offers after each kind of word.
func TestComplete(t *testing.T) {
	c := cli{env: map[string]string{}}
	cases := []struct {
		words []string
		want  []string
		not   []string
	}{
		{nil, []string{"status", "program", "mesh", "help"}, []string{"__complete", "module-guard", "man"}},
		{[]string{"program"}, []string{"add", "list", "show", "remove"}, nil},
		{[]string{"program", "add"}, []string{"--host", "--serve", "--data", "--env-file"}, nil},
		{[]string{"call"}, []string{"--timeout", "--to", "--server"}, nil},
		{[]string{"mesh"}, []string{"node", "assign", "status"}, nil},
		{[]string{"mesh", "status"}, []string{"--json", "--server"}, []string{"--db"}},
		{[]string{"mesh", "node"}, []string{"add", "rotate", "set-stages"}, nil},
		{[]string{"mesh", "node", "add"}, []string{"--broker-admin", "--stages", "--ttl"}, nil},
		{[]string{"nosuch"}, nil, []string{"--server"}},
	}
	for _, tc := range cases {
		out := c.ok(t, append([]string{"__complete"}, tc.words...)...)
		got := strings.Fields(out)
		for _, w := range tc.want {
			if !contains(got, w) {
				t.Errorf("__complete %v: %v lacks %s", tc.words, got, w)
			}
		}
		for _, w := range tc.not {
			if contains(got, w) {
				t.Errorf("__complete %v: %v offers %s", tc.words, got, w)
			}
		}
	}
}

// TestManPage: meshbox(1) in roff, with every command for people and its
// flags.
func TestManPage(t *testing.T) {
	c := cli{env: map[string]string{}}
	out := c.ok(t, "man")
	if !strings.HasPrefix(out, ".TH MESHBOX 1 ") {
		t.Fatalf("man: starts %q", out[:min(len(out), 40)])
	}
	for _, cmd := range commands() {
		if cmd.group == "" {
			continue
		}
		if !strings.Contains(out, "\n.B "+cmd.name+"\n") {
			t.Errorf("man page lacks command %s", cmd.name)
		}
	}
	for _, want := range []string{"-broker-admin", "-env-file", "MESHBOX_DATA", "/etc/meshbox/meshbox.env"} {
		if !strings.Contains(out, want) {
			t.Errorf("man page lacks %q", want)
		}
	}
	for i, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, ".") && !strings.HasPrefix(l, ".TH") && !strings.HasPrefix(l, ".S") && !strings.HasPrefix(l, ".B") &&
			!strings.HasPrefix(l, ".I") && !strings.HasPrefix(l, ".TP") && !strings.HasPrefix(l, ".RS") && !strings.HasPrefix(l, ".RE") &&
			!strings.HasPrefix(l, ".nf") && !strings.HasPrefix(l, ".fi") {
			t.Errorf("man page line %d is an unknown request: %q", i+1, l)
		}
	}
}

// runHelp runs meshbox with args and -h, with no environment, and
// returns what it printed.
func runHelp(t *testing.T, args []string) string {
	t.Helper()
	var out bytes.Buffer
	m := &Main{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &out, Getenv: func(string) string { return "" }}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_ = m.Run(ctx, append(slices.Clone(args), "-h"))
	return out.String()
}

func contains(list []string, w string) bool {
	for _, x := range list {
		if x == w {
			return true
		}
	}
	return false
}

// TestTakesConstantsFromWire: the CLI and doctor take the protocol's
// names (headers, broker names, link states) from wire; neither imports
// the runtime itself.
func TestTakesConstantsFromWire(t *testing.T) {
	for _, pkg := range []string{".", "./doctor"} {
		out, err := exec.Command("go", "list", "-f", "{{join .Imports \" \"}}", pkg).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", pkg, err)
		}
		imports := strings.Fields(string(out))
		if contains(imports, "github.com/meshbox/meshbox/bridge") {
			t.Errorf("%s imports bridge; the constants it needs are wire's", pkg)
		}
		if !contains(imports, "github.com/meshbox/meshbox/internal/wire") {
			t.Errorf("%s does not import internal/wire: %v", pkg, imports)
		}
	}
}

// TestManPageEnvironment: the man page's ENVIRONMENT section lists each
// setting's variable and key from the one table of settings, and no other.
func TestManPageEnvironment(t *testing.T) {
	c := cli{env: map[string]string{}}
	out := c.ok(t, "man")
	_, sect, ok := strings.Cut(out, ".SH ENVIRONMENT\n")
	if !ok {
		t.Fatal("man page: no ENVIRONMENT section")
	}
	sect, _, _ = strings.Cut(sect, ".SH ")
	var got []string
	for _, l := range strings.Split(sect, "\n") {
		if strings.HasPrefix(l, "MESHBOX_") {
			got = append(got, l)
		}
	}
	var want []string
	for _, e := range appliance.EnvVars {
		want = append(want, e.Name+"\t"+e.Field)
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("ENVIRONMENT: got %q, want %q", got, want)
	}
}
