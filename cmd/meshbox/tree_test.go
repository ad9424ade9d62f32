package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/node"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
	"github.com/nats-io/nats.go"
)

// helpFlag is a flag's line in the defaults a flag set prints: "-name
// type" for a flag that takes a value, "-name" for a boolean one.
var helpFlag = regexp.MustCompile(`(?m)^  -([A-Za-z0-9][A-Za-z0-9_-]*)(?: (\S+))?(?:\t|$)`)

// TestFlagsAreTheTree: for every command of the tree, the flags the flag
// set that parses its command line defines (as `meshbox CMD -h` prints
// them) are the flags the tree declares for it: the same names, the same
// help, the same taking of a value; and the kinds of values it names
// belong to flags it has.
func TestFlagsAreTheTree(t *testing.T) {
	n := 0
	for _, top := range commands() {
		if top.group == "" {
			continue
		}
		top.walk(func(names []string, c command) {
			if len(c.children) > 0 {
				return
			}
			line := append([]string{top.name}, names...)
			help := runHelp(t, line)
			got := map[string]bool{}
			for _, f := range helpFlag.FindAllStringSubmatch(help, -1) {
				got[f[1]] = f[2] != ""
			}
			want := map[string]bool{}
			for _, f := range c.declared() {
				want[f.name] = f.value
				if !strings.Contains(help, f.help) {
					t.Errorf("%s -h: lacks the help of -%s, %q", strings.Join(line, " "), f.name, f.help)
				}
			}
			if len(got) != len(want) {
				t.Errorf("%s -h: flags %v, want the tree's %v", strings.Join(line, " "), got, want)
			}
			for name, value := range want {
				if g, ok := got[name]; !ok || g != value {
					t.Errorf("%s -h: flag -%s: got present=%v value=%v, want value=%v", strings.Join(line, " "), name, ok, g, value)
				}
			}
			for name := range c.values {
				if _, ok := want[name]; !ok && len(want) > 0 {
					t.Errorf("%s: names the kind of the value of -%s, which it does not have", strings.Join(line, " "), name)
				}
			}
			n++
		})
	}
	if n < 50 {
		t.Fatalf("checked %d commands, want every leaf of the tree", n)
	}
}

// TestOneFlagSet: the dispatcher's is the one flag set a command line is
// parsed with; no command makes one of its own.
func TestOneFlagSet(t *testing.T) {
	files, _ := filepath.Glob("*.go")
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") || f == "tree.go" {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(src), "flag.NewFlagSet") {
			t.Errorf("%s makes a flag set of its own: a command's flags are its tree value's (tree.go)", f)
		}
	}
}

// TestSubcommandOnce: a subcommand's name is written once, in the tree:
// rows' and cache's commands are found there, and a misspelt one is
// refused with the usage and the name meant.
func TestSubcommandOnce(t *testing.T) {
	c := cli{env: map[string]string{}}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"rows", "histroy", "jobs"}, `rows: unknown command "histroy" (did you mean history?)`},
		{[]string{"cache", "histroy"}, `cache: unknown command "histroy" (did you mean history?)`},
		{[]string{"module", "stat", "x"}, `module: unknown command "stat" (did you mean start?)`},
		{[]string{"dlq", "--json", "lst"}, `dlq: unknown command "lst" (did you mean list?)`},
		{[]string{"program"}, "program: no command given"},
		{[]string{"completion"}, "completion: no command given"},
	} {
		_, stderr, err := c.run(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("meshbox %s: got %v, want %s", strings.Join(tc.args, " "), err, tc.want)
		}
		if !strings.Contains(stderr, "Usage: meshbox "+tc.args[0]) {
			t.Errorf("meshbox %s: stderr %q, want its usage", strings.Join(tc.args, " "), stderr)
		}
	}
	if out := c.ok(t, "rows", "-h"); !strings.Contains(out, "history TABLE ROW FIELD") {
		t.Errorf("rows -h: %q, want rows' usage", out)
	}
}

// completeWith runs __complete with words on m and returns the words it
// offered.
func completeWith(t *testing.T, m *Main, words ...string) []string {
	t.Helper()
	var out, errOut strings.Builder
	m.Stdout, m.Stderr, m.Stdin = &out, &errOut, strings.NewReader("")
	if err := m.Run(t.Context(), append([]string{"__complete"}, words...)); err != nil {
		t.Fatalf("__complete %v: %v", words, err)
	}
	if errOut.Len() > 0 {
		t.Errorf("__complete %v: said %q on stderr, want nothing", words, errOut.String())
	}
	return strings.Fields(out.String())
}

// TestCompleteNames: where a node, a table or a stage is due, completion
// offers the names its source knows, and only there.
func TestCompleteNames(t *testing.T) {
	names := map[word][]string{wordNode: {"alpha", "beta"}, wordTable: {"jobs"}, wordStage: {"thumb"}}
	m := &Main{Getenv: func(string) string { return "" },
		names: func(_ context.Context, k word) []string { return names[k] }}
	for _, tc := range []struct {
		words []string
		want  []string
		not   []string
	}{
		{[]string{"mesh", "node", "remove"}, []string{"alpha", "beta", "--force", "--db"}, []string{"jobs", "thumb"}},
		{[]string{"mesh", "node", "add"}, []string{"--ttl"}, []string{"alpha"}},
		{[]string{"mesh", "assign"}, []string{"alpha"}, nil},
		{[]string{"mesh", "assign", "alpha"}, []string{"--autostart"}, []string{"alpha"}},
		{[]string{"mesh", "assignments", "--node"}, []string{"alpha"}, []string{"--json"}},
		{[]string{"call", "--to"}, []string{"alpha", "beta"}, []string{"--to", "jobs"}},
		{[]string{"call", "--to", "alpha"}, []string{"--timeout"}, []string{"alpha"}},
		{[]string{"call", "--to=alpha"}, []string{"--timeout"}, []string{"alpha"}},
		{[]string{"rows", "get"}, []string{"jobs", "--field"}, []string{"alpha", "thumb"}},
		{[]string{"rows", "get", "jobs"}, []string{"--field"}, []string{"jobs"}},
		{[]string{"rows", "--server", "nats://x", "list"}, []string{"jobs", "--limit"}, nil},
		{[]string{"send"}, []string{"thumb", "--id"}, []string{"jobs"}},
		{[]string{"send", "thumb"}, []string{"--id"}, []string{"thumb"}},
		{[]string{"dlq", "list"}, []string{"thumb", "--json"}, []string{"--all"}},
		{[]string{"dlq", "replay"}, []string{"thumb", "--all"}, nil},
		{[]string{"dlq"}, []string{"list", "show", "replay", "purge"}, []string{"thumb"}},
		{[]string{"blob", "get", "-o"}, nil, []string{"alpha", "--patience"}},
		{[]string{"status"}, []string{"--json"}, []string{"alpha"}},
	} {
		got := completeWith(t, m, tc.words...)
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

// TestCompleteNamesFromTheNode: the names come from the local node's
// status, asked as the commands ask it; when no node answers, completion
// offers the flags alone and says nothing.
func TestCompleteNamesFromTheNode(t *testing.T) {
	srv := natstest.Start(t)
	nc := natstest.ConnectTCP(t, srv)
	st := appliance.Status{Node: "solo", Peers: []node.Peer{{Name: "beta"}},
		Capabilities: node.Capabilities{LocalStages: []string{"thumb"}, RemoteStages: map[string][]string{"print": {"beta"}}},
		Rows:         []rows.TableStatus{{Table: "jobs"}}}
	data, _ := json.Marshal(st)
	if _, err := nc.Subscribe(appliance.SubjectStatus, func(m *nats.Msg) { _ = m.Respond(data) }); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	m := &Main{Getenv: getenvOf(map[string]string{"MESHBOX_SERVER": srv.ClientURL()}), envFiles: []string{}}
	for _, tc := range []struct {
		words []string
		want  []string
	}{
		{[]string{"call", "--to"}, []string{"beta", "solo"}},
		{[]string{"rows", "get"}, []string{"jobs"}},
		{[]string{"send"}, []string{"print", "thumb"}},
		{[]string{"dlq", "list"}, []string{"print", "thumb"}},
	} {
		got := completeWith(t, m, tc.words...)
		if names := slices.DeleteFunc(slices.Clone(got), func(w string) bool { return strings.HasPrefix(w, "-") }); !slices.Equal(names, tc.want) {
			t.Errorf("__complete %v: names %v, want %v", tc.words, names, tc.want)
		}
	}
	// Another node, named on the command line, that is not there.
	closed := "nats://" + meshtest.ClosedAddr(t)
	if got := completeWith(t, m, "rows", "get", "--server", closed); contains(got, "jobs") {
		t.Errorf("__complete rows get --server (none there): %v, want the flags alone", got)
	}
	m.Getenv = getenvOf(map[string]string{"MESHBOX_SERVER": closed})
	if got := completeWith(t, m, "send"); !slices.Equal(got, []string{"--config", "--creds", "--data", "--env-file", "--header", "--id", "--server", "--timeout", "--v"}) {
		t.Errorf("__complete send (no node): %v, want the flags alone", got)
	}
}

// getenvOf is a Getenv of the variables in env.
func getenvOf(env map[string]string) func(string) string {
	return func(k string) string { return env[k] }
}
