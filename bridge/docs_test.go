package bridge

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	brokerlink "github.com/meshbox/meshbox/bridge/link"

	"github.com/meshbox/meshbox/bridge/codec"
	"github.com/meshbox/meshbox/bridge/flow"
)

// internalsPage is the bridge's page in docs/.
const internalsPage = "../docs/internals-bridge.md"

// Every number the package doc and the internals page state about a
// constant is the constant's value. A claim's pattern holds one number,
// written with thousands separators or not; the claim must be found in
// each document it names, so a reworded sentence fails here until its
// claim is updated too.
func TestDocNumbersMatchConstants(t *testing.T) {
	claims := []struct {
		docs    []string
		pattern string // one (\d[\d,]*) group
		want    int64
	}{
		{[]string{"doc.go"}, `among the last (\d[\d,]*) this node handed out`, codec.HandedOutLen},
		{[]string{internalsPage}, `it remembers the last (\d[\d,]*)`, codec.HandedOutLen},
		{[]string{internalsPage}, `among its last (\d[\d,]*) \(codec/seen.go\)`, codec.HandedOutLen},
		{[]string{internalsPage}, `and at most (\d[\d,]*) of them`, codec.EventMemoryLen},
		{[]string{internalsPage}, `more than (\d[\d,]*) seconds \(the clock skew`, int64(codec.MaxClockSkew / time.Second)},
		{[]string{internalsPage}, `expires after (\d[\d,]*) days unused`, int64(codec.EventQueueExpiry / (24 * time.Hour))},
		{[]string{internalsPage}, `CommandBatch \(default (\d[\d,]*)\)`, DefaultCommandBatch},
		{[]string{internalsPage}, `Prefetch (?:\(default|\(default) (\d[\d,]*)\) and MaxStagePrefetch`, DefaultPrefetch},
		{[]string{internalsPage}, `MaxStagePrefetch \(default (\d[\d,]*)\)`, DefaultMaxStagePrefetch},
		{[]string{internalsPage}, `for up to (\d[\d,]*) µs`, int64(flow.AckLinger / time.Microsecond)},
		{[]string{internalsPage}, `within (\d[\d,]*) ms \(2 s for`, int64(noRouteWindow / time.Millisecond)},
		{[]string{internalsPage}, `ms \((\d[\d,]*) s for a node that answered lately`, int64(noRouteKnownWindow / time.Second)},
		{[]string{internalsPage}, `sent again for up to (\d[\d,]*) s`, int64(noRouteReplyWindow / time.Second)},
		{[]string{internalsPage}, `answered \(at most (\d[\d,]*) s\)`, int64(brokerlink.HandoverDrain / time.Second)},
		{[]string{internalsPage}, `\((\d[\d,]*) x Prefetch`, openCallsPerPrefetch},
		{[]string{internalsPage}, `x Prefetch, at least (\d[\d,]*)\)`, openCallsMin},
		{[]string{"../docs/messages.md"}, `bindings of\s+its previous run for (\d[\d,]*) s`, int64(brokerlink.EventKeepAfterStart / time.Second)},
	}
	for _, c := range claims {
		for _, doc := range c.docs {
			text := docText(t, doc)
			re := regexp.MustCompile(strings.ReplaceAll(c.pattern, " ", `\s+`))
			m := re.FindStringSubmatch(text)
			if m == nil {
				t.Errorf("%s: no claim %q", doc, c.pattern)
				continue
			}
			got, err := strconv.ParseInt(strings.ReplaceAll(m[1], ",", ""), 10, 64)
			if err != nil {
				t.Errorf("%s: %q: %v", doc, m[0], err)
				continue
			}
			if got != c.want {
				t.Errorf("%s says %q: got %d, want %d (the constant)", doc, m[0], got, c.want)
			}
		}
	}
}

// docText returns the text of a Go file's comments (with the comment
// markers gone, so that a claim may wrap) or of a Markdown page.
func docText(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(path, ".go") {
		return string(b)
	}
	var lines []string
	for l := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "//"); ok {
			lines = append(lines, rest)
		}
	}
	return strings.Join(lines, "\n")
}

// The file map of the internals page names every non-test file of the
// bridge and of its layers under its package's heading, and no file that
// is not there.
func TestInternalsFileMap(t *testing.T) {
	text := docText(t, internalsPage)
	_, fileMap, ok := strings.Cut(text, "\n## Packages and files\n")
	if !ok {
		t.Fatalf("%s: no section Packages and files", internalsPage)
	}
	heading := regexp.MustCompile(`(?m)^### (\S+):`)
	named := regexp.MustCompile("`([a-z_]+\\.go)`")
	locs := heading.FindAllStringSubmatchIndex(fileMap, -1)
	if len(locs) == 0 {
		t.Fatal("no package headings in the file map")
	}
	for i, loc := range locs {
		pkg := fileMap[loc[2]:loc[3]]
		end := len(fileMap)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		var inMap []string
		for _, m := range named.FindAllStringSubmatch(fileMap[loc[1]:end], -1) {
			inMap = append(inMap, m[1])
		}
		dir, _ := strings.CutPrefix(pkg, "bridge")
		files, err := filepath.Glob(filepath.Join("."+dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		var onDisk []string
		for _, f := range files {
			if !strings.HasSuffix(f, "_test.go") {
				onDisk = append(onDisk, filepath.Base(f))
			}
		}
		for _, f := range onDisk {
			if !slices.Contains(inMap, f) {
				t.Errorf("%s: %s/%s is not in the file map", internalsPage, pkg, f)
			}
		}
		for _, f := range inMap {
			if !slices.Contains(onDisk, f) {
				t.Errorf("%s: the file map names %s/%s, which does not exist", internalsPage, pkg, f)
			}
		}
	}
}
