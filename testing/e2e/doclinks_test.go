package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocLinks checks every relative link of README.md and docs/: the
// file or folder it names exists in the repository, and an anchor
// (#section) names a heading of the page it points to.
func TestDocLinks(t *testing.T) {
	root := filepath.Join("..", "..")
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join(root, "README.md"))
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	checked := 0
	for _, page := range pages {
		raw, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, page)
		for i, line := range strings.Split(string(raw), "\n") {
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				path := page
				if file != "" {
					path = filepath.Join(filepath.Dir(page), filepath.FromSlash(file))
				}
				checked++
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s:%d: link %s: %s does not exist", rel, i+1, target, file)
					continue
				}
				if anchor != "" && strings.HasSuffix(path, ".md") && !hasHeading(t, path, anchor) {
					t.Errorf("%s:%d: link %s: no heading #%s in %s", rel, i+1, target, anchor, file)
				}
			}
		}
	}
	if checked < 50 {
		t.Errorf("checked %d relative links; the pattern finds too few to mean anything", checked)
	}
}

// hasHeading reports whether the Markdown page at path has a heading
// whose anchor (GitHub's: lower case, punctuation dropped, spaces as
// '-') is anchor.
func hasHeading(t *testing.T, path, anchor string) bool {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fence := false
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
		}
		if fence || !strings.HasPrefix(line, "#") {
			continue
		}
		if headingAnchor(strings.TrimLeft(line, "#")) == anchor {
			return true
		}
	}
	return false
}

func headingAnchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}
