package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestHintsParse: every hint in the code that names a meshbox command (a
// string literal with "meshbox" and a command line, in a log line, an
// error or a status text) is one that command's real parser accepts:
// known command, known subcommand, known flags. Each is run, in process,
// with -h after it: the parse must reach the -h.
func TestHintsParse(t *testing.T) {
	hints := hintsInSources(t, filepath.Join("..", ".."))
	if len(hints) < 40 {
		t.Fatalf("found %d hints in the sources, want the code's (is the module root right?)", len(hints))
	}
	for _, h := range hints {
		if err := checkHint(t.Context(), h.args); err != nil {
			t.Errorf("%s: hint `meshbox %s`: %v", h.at, strings.Join(h.args, " "), err)
		}
	}
}

// TestCheckHint: the checker refuses what a user could not type, and
// accepts placeholders in the place of arguments and flag values.
func TestCheckHint(t *testing.T) {
	for _, tc := range []struct {
		text string
		ok   bool
	}{
		{"meshbox mesh node set-stages NAME STAGE... --broker-admin URL", true},
		{"(meshbox mesh node rotate NAME)", true},
		{"meshbox mesh node add %s --db %s --broker-admin http://ADMIN:PASSWORD@BROKER:15672", true},
		{"run meshbox dlq list STAGE to see them", true},
		{"meshbox join TOKEN --force", true},
		{"meshbox status shows it", true},
		{"meshbox program add NAME --read tasks --write tasks", true},
		{"(meshbox mesh node set-stages %s STAGE... (every stage it may consume)", true},
		{"meshbox mesh node set-stages NAME --stages ... for a stage's queues", false},
		{"meshbox mesh node sett NAME", false},
		{"meshbox stauts --json", false},
		{"meshbox blob fetch REF", false},
		{"meshbox doctor --jsn", false},
	} {
		hs := hintsIn(tc.text)
		if len(hs) != 1 {
			t.Errorf("%q: got hints %q, want one", tc.text, hs)
			continue
		}
		err := checkHint(t.Context(), hs[0])
		if (err == nil) != tc.ok {
			t.Errorf("%q (args %q): got error %v, want ok=%v", tc.text, hs[0], err, tc.ok)
		}
	}
	for _, text := range []string{"meshbox turns a home server into a node", "meshbox <command> -h", "meshbox mesh ...", "meshbox help CMD"} {
		if hs := hintsIn(text); len(hs) != 0 {
			t.Errorf("%q: got hints %q, want none (prose or a synopsis)", text, hs)
		}
	}
}

// hint is a command line found in the sources, without "meshbox".
type hint struct {
	at   string // file:line
	args []string
}

// hintsInSources returns the hints in the string literals of the
// module's Go files under root, test files left out.
func hintsInSources(tb testing.TB, root string) []hint {
	tb.Helper()
	var out []hint
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if !bytes.Contains(src, []byte("meshbox ")) {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			pos := fset.Position(lit.Pos())
			rel, _ := filepath.Rel(root, pos.Filename)
			for _, args := range hintsIn(s) {
				out = append(out, hint{at: rel + ":" + strconv.Itoa(pos.Line), args: args})
			}
			return true
		})
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// hintEnd ends a hint in running text: a parenthesis, a quote, the end
// of a clause or a line.
var hintEnd = regexp.MustCompile(`[()"'` + "`" + `;]|, |: |\. |\.$| — |\n| \| `)

// ellipsis stands for "..." while hintEnd looks for the end of a
// sentence.
const ellipsis = "\u2026"

// hintsIn returns the command lines in text s that name a meshbox
// command: the words after "meshbox" up to the end of the clause or the
// first word of prose. An unknown word right after "meshbox" counts as a
// command when a flag follows it ("meshbox stauts --json"), and as prose
// otherwise ("meshbox turns a server into ..."). A synopsis whose command
// or subcommand is a placeholder ("meshbox <command>", "meshbox mesh
// ...") is left out, and so are the commands not for people (the ones
// the completion scripts call).
func hintsIn(s string) [][]string {
	var out [][]string
	for i := 0; ; {
		j := strings.Index(s[i:], "meshbox ")
		if j < 0 {
			return out
		}
		start := i + j
		i = start + len("meshbox ")
		if start > 0 && isWordByte(s[start-1]) {
			continue // part of a longer word or a path
		}
		rest := strings.ReplaceAll(s[i:], "...", ellipsis) // a placeholder's, not a sentence's end
		if loc := hintEnd.FindStringIndex(rest); loc != nil {
			rest = rest[:loc[0]]
		}
		if args := hintWords(strings.Fields(strings.ReplaceAll(rest, ellipsis, "..."))); args != nil {
			out = append(out, args)
		}
	}
}

func isWordByte(b byte) bool {
	return b == '_' || b == '-' || b == '/' || b == '.' || b == '$' ||
		'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9'
}

var proseWord = regexp.MustCompile(`^[a-z][a-z-]*$`)

// hintWords returns the words of a hint: the command path as the command
// table has it, then flags, their values and arguments up to the first
// word of prose; nil when words are no hint.
func hintWords(words []string) []string {
	for i, w := range words {
		w = strings.Trim(w, "[]")
		if strings.HasSuffix(w, ".") && !strings.HasSuffix(w, "...") {
			w = strings.TrimSuffix(w, ".")
		}
		words[i] = w
	}
	if len(words) == 0 {
		return nil
	}
	top := words[0]
	c, known := findCommand(top)
	var path int // the words of the command path
	switch {
	case top == "help":
		if len(words) == 1 || !proseWord.MatchString(words[1]) {
			return nil // the usage, or help CMD: a synopsis
		}
		return hintWords(words[1:])
	case !known:
		if proseWord.MatchString(top) && len(words) > 1 && strings.HasPrefix(words[1], "-") {
			return words[:2] // an unknown command with a flag
		}
		return nil // prose
	case c.group == "":
		return nil // not for people: called by the node or the completion scripts
	case c.name == "mesh":
		path = 1
		if len(words) > 1 {
			if !proseWord.MatchString(words[1]) {
				return nil // mesh <command>: a synopsis
			}
			path = 2
			if sub, ok := c.child(words[1]); ok && len(sub.children) > 0 && len(words) > 2 {
				path = 3 // node add, setting set, ...
			}
		}
	case len(c.children) > 0:
		path = 1
		if len(words) > 1 {
			if !proseWord.MatchString(words[1]) {
				return nil // blob <command>: a synopsis
			}
			path = 2
		}
	default:
		path = 1
	}
	takesValue := valueFlags(c, words[1:path])
	return append(words[:path:path], argWords(words[path:], takesValue)...)
}

// flagDefault is a flag's line in a flag set's defaults: "-name type" for
// a flag that takes a value, "-name" for a boolean one.
var flagDefault = regexp.MustCompile(`(?m)^\s+-([A-Za-z0-9][A-Za-z0-9_-]*)( \S+)?$`)

// valueFlags returns the flags of command c's subcommand sub that take a
// value, as the tree declares them.
func valueFlags(c command, sub []string) map[string]bool {
	path, _ := c.descend(sub)
	out := map[string]bool{}
	for _, f := range path[len(path)-1].declared() {
		out[f.name] = f.value
	}
	return out
}

// argWords returns the leading words that are flags, flag values and
// arguments: up to the first word of prose. A flag that takes a value
// (takesValue) takes the next word, whatever it is.
func argWords(words []string, takesValue map[string]bool) []string {
	var out []string
	for i := 0; i < len(words); i++ {
		w := words[i]
		switch {
		case strings.HasPrefix(w, "-") && len(w) > 1:
			out = append(out, w)
			name, _, hasValue := strings.Cut(strings.TrimLeft(w, "-"), "=")
			if !hasValue && takesValue[name] && i+1 < len(words) {
				i++
				out = append(out, words[i])
			}
		case proseWord.MatchString(w):
			return out
		case strings.ContainsAny(w, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789%:/,*.=@|<>"):
			out = append(out, w) // a placeholder or an argument: NAME, %s, A,B, a URL
		default:
			return out
		}
	}
	return out
}

// checkHint runs meshbox with args and -h after them, in process, with
// no environment: the parse must reach the -h (a flag.ErrHelp, or the
// usage printed by a command that takes no flags), and a subcommand must
// be one of its command's. A hint's action never runs: an unknown
// command, subcommand or flag is a usage error first, and the -h ends
// every parse that gets to it.
func checkHint(ctx context.Context, args []string) error {
	if c, ok := findCommand(args[0]); ok && len(c.children) > 0 && len(args) > 1 && !slices.Contains(c.subNames(), args[1]) {
		return fmt.Errorf("unknown subcommand %q of %s (%s)", args[1], c.name, strings.Join(c.subNames(), ", "))
	}
	var out bytes.Buffer
	m := &Main{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &out, Getenv: func(string) string { return "" }}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := m.Run(ctx, append(slices.Clone(args), "-h"))
	switch {
	case errors.Is(err, flag.ErrHelp), err == nil && strings.Contains(out.String(), "Usage: meshbox"):
		return nil
	case err == nil:
		return errors.New("the parse did not reach -h (a flag after the arguments of a command that takes flags first?)")
	default:
		return err
	}
}
