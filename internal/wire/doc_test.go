package wire

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestSubjectTableMatchesWire: the manual's table of the node's subjects
// (docs/programs.md) names the grammar and every $MESH.* subject a program
// may ask the node, as wire defines them, and no other.
func TestSubjectTableMatchesWire(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "docs", "programs.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(raw), "### Subjects on the node's NATS server\n")
	if !ok {
		t.Fatal("docs/programs.md: no section Subjects on the node's NATS server")
	}
	table, _, _ := strings.Cut(rest, "\n\n")
	for _, row := range []string{
		"`" + CapSubject("<name>") + "`", "`" + NodeCapSubject("<node>", "<name>") + "`",
		"`" + CommandSubject("<stage>") + "`", "`" + WorkSubject("<stage>") + "`", "`" + EventSubject("<topic>") + "`",
	} {
		if !strings.Contains(table, "| "+row+" |") {
			t.Errorf("the subject table has no row %s", row)
		}
	}
	asked := []string{SubjectStatus, SubjectPeers, SubjectCaps, SubjectModules, SubjectModuleControl, SubjectModuleLogs,
		SubjectModuleLogPrefix + "<module>", SubjectDeadLetters, SubjectBackup, SubjectBlobsOpen, SubjectBlobsFetches,
		SubjectRowsPrefix + "<table>.<op>", SubjectRowsPrefix + "<table>.changed.<row>"}
	var documented []string
	for _, m := range regexp.MustCompile("`(\\$MESH\\.[^`]*)`").FindAllStringSubmatch(table, -1) {
		documented = append(documented, m[1])
	}
	for _, s := range asked {
		if !slices.Contains(documented, s) {
			t.Errorf("the subject table does not name %s", s)
		}
	}
	for _, s := range documented {
		if !slices.Contains(asked, s) {
			t.Errorf("the subject table names %s, which wire does not define", s)
		}
	}
}

// The manual's table of error codes (docs/programs.md) names every code
// of wire, and no other.
func TestErrorTableMatchesWire(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "docs", "programs.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(raw), "### Error replies\n")
	if !ok {
		t.Fatal("docs/programs.md: no section Error replies")
	}
	if i := strings.Index(rest, "\n#"); i >= 0 {
		rest = rest[:i] // the section only
	}
	if !strings.Contains(rest, "`"+HeaderServiceError+"`") || !strings.Contains(rest, "`"+HeaderServiceErrorCode+"`") {
		t.Errorf("the section Error replies does not name the headers %s and %s", HeaderServiceError, HeaderServiceErrorCode)
	}
	var documented []int
	for _, m := range regexp.MustCompile(`(?m)^\| (\d{3}) \|`).FindAllStringSubmatch(rest, -1) {
		n, _ := strconv.Atoi(m[1])
		documented = append(documented, n)
	}
	codes := []int{CodeBadInput, CodeForbidden, CodeNotFound, CodePermanent, CodeInternal, CodeUnavailable, CodeTimeout, CodeOutboxFull}
	for _, c := range codes {
		if !slices.Contains(documented, c) {
			t.Errorf("the error table has no row for %d", c)
		}
	}
	for _, c := range documented {
		if !slices.Contains(codes, c) {
			t.Errorf("the error table names %d, which wire does not define", c)
		}
	}
}
