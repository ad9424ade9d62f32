package wire

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestNoProtocolLiteralsOutsideWire: the subjects, routing-key words and
// headers of the protocol are written here only; every other package
// takes them from wire, so that drift in the grammar is a compile error.
// It reads every non-test Go file of the module (tests and the test
// helpers under testing/ may spell the protocol out: they check it; so
// may the examples under docs/examples, which are users' programs).
func TestNoProtocolLiteralsOutsideWire(t *testing.T) {
	root := filepath.Join("..", "..")
	prefixes := []string{"cap.", "work.", "evt.", "cmd.", "$MESH.", "node.", "Meshbox-", HeaderServiceError}
	codes := map[string]bool{}
	for _, c := range []int{CodeBadInput, CodeForbidden, CodeNotFound, CodePermanent, CodeInternal, CodeUnavailable, CodeTimeout, CodeOutboxFull} {
		codes[strconv.Itoa(c)] = true
	}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch rel {
			case "internal/wire", "testing", ".git", "internal/names",
				"docs/examples": // programs as a user writes them: the protocol as documented, no internal package
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			// A code compared or set as a number: x.Code == 503, Code: 404.
			var code ast.Expr
			switch e := n.(type) {
			case *ast.BinaryExpr:
				if e.Op == token.EQL || e.Op == token.NEQ {
					code = e.Y
					if l, ok := e.X.(*ast.BasicLit); ok && l.Kind == token.INT {
						code = l
					}
				}
			case *ast.KeyValueExpr:
				if k, ok := e.Key.(*ast.Ident); ok && k.Name == "Code" {
					code = e.Value
				}
			}
			if l, ok := code.(*ast.BasicLit); ok && l.Kind == token.INT && codes[l.Value] {
				t.Errorf("%s: the number %s is an error code of the protocol; take it from internal/wire", rel, l.Value)
			}
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			v, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			if codes[v] {
				t.Errorf("%s: the literal %q is an error code of the protocol; take it from internal/wire", rel, v)
			}
			if v == "node.key" { // the node's key file in its data directory, not a subject
				return true
			}
			for _, p := range prefixes {
				if strings.HasPrefix(v, p) {
					t.Errorf("%s: the literal %q spells the protocol; take it from internal/wire", rel, v)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
