package bridge

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// maxFields is the most fields a struct of the bridge holds: past it, a
// struct has parts that want a struct of their own.
const maxFields = 20

// The bridge's state, and its outbox's, is cut into parts (docs/internals-bridge.md, Concurrency): no struct grows past
// maxFields, and a mutex's comment that says what it guards names only
// fields of its own struct.
func TestStructsHoldOnlyTheirParts(t *testing.T) {
	files := map[string]*ast.File{}
	for _, dir := range []string{".", "outbox"} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
				continue
			}
			path := filepath.Join(dir, e.Name())
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			files[path] = f
		}
	}
	guards := regexp.MustCompile(`guards ([\w, ]+)`)
	structs := 0
	{
		for name, f := range files {
			ast.Inspect(f, func(n ast.Node) bool {
				ts, ok := n.(*ast.TypeSpec)
				if !ok {
					return true
				}
				st, ok := ts.Type.(*ast.StructType)
				if !ok {
					return true
				}
				structs++
				fields := map[string]bool{}
				count := 0
				for _, fl := range st.Fields.List {
					if len(fl.Names) == 0 {
						count++ // embedded
						continue
					}
					for _, id := range fl.Names {
						fields[id.Name] = true
						count++
					}
				}
				// Config is options, not state: a value the caller fills in
				// once, flat like nats-server's Options and amqp091-go's
				// Config, with no lock and no owner; nesting it would only
				// lengthen its names.
				if count > maxFields && ts.Name.Name != "Config" {
					t.Errorf("%s: struct %s has %d fields, want at most %d: give its parts structs of their own", name, ts.Name.Name, count, maxFields)
				}
				for _, fl := range st.Fields.List {
					for _, c := range []*ast.CommentGroup{fl.Doc, fl.Comment} {
						if c == nil {
							continue
						}
						m := guards.FindStringSubmatch(c.Text())
						if m == nil {
							continue
						}
						for _, g := range strings.FieldsFunc(m[1], func(r rune) bool { return r == ',' || r == ' ' }) {
							if g == "and" {
								continue
							}
							if !fields[g] {
								t.Errorf("%s: in struct %s a mutex guards %s, which is not a field of %s", name, ts.Name.Name, g, ts.Name.Name)
							}
						}
					}
				}
				return true
			})
		}
	}
	if structs < 20 {
		t.Fatalf("found %d structs in the bridge's files, want the package's (is the test in the right directory?)", structs)
	}
}
