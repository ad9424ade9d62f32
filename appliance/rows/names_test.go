package rows_test

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/meshbox/meshbox/appliance/rows"
)

// The names of tables, rows and fields follow the rules their errors
// state; the rules as regular expressions are the oracle, over edge
// cases and random strings of the characters that matter.
func TestNames(t *testing.T) {
	rules := []struct {
		name  string
		valid func(string) error
		re    *regexp.Regexp
		max   int
	}{
		{"table", rows.ValidTable, regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*$`), rows.MaxTableLen},
		{"row", rows.ValidRow, regexp.MustCompile(`^[A-Za-z0-9_=-][A-Za-z0-9_.=-]*$`), rows.MaxRowLen},
		{"field", rows.ValidField, regexp.MustCompile(`^[A-Za-z0-9_-]+$`), rows.MaxFieldLen},
	}
	cases := []string{"", "a", "A", "0", "_", "-", "=", ".", "a.b", ".a", "a.", "jobs", "Jobs", "job-42", "job_42",
		"k=v", "a b", "a/b", "a*", "a>", "é", "a\x00", strings.Repeat("a", 64), strings.Repeat("a", 65),
		strings.Repeat("a", 200), strings.Repeat("a", 201)}
	alphabet := "aZ09_-=. */>$é\x00"
	r := rand.New(rand.NewPCG(1, 2))
	for range 5000 {
		var sb strings.Builder
		for range r.IntN(8) {
			sb.WriteByte(alphabet[r.IntN(len(alphabet))])
		}
		cases = append(cases, sb.String())
	}
	for _, rule := range rules {
		for _, c := range cases {
			want := len(c) > 0 && len(c) <= rule.max && rule.re.MatchString(c)
			if got := rule.valid(c) == nil; got != want {
				t.Errorf("%s %q: valid %v, want %v", rule.name, c, got, want)
			}
		}
	}
	// A control: each kind takes an ordinary name.
	if rows.ValidTable("jobs") != nil || rows.ValidRow("job-42.a=b") != nil || rows.ValidField("status") != nil {
		t.Fatal("ordinary names refused")
	}
}
