// Package namestest holds the names every layer's tests check against
// package names: the edge cases of every rule, in one list, so that the
// appliance, node, cache and bridge tests all ask about the same names and
// seed their fuzz tests with them.
package namestest

import "strings"

// Inputs returns the names worth asking every layer about: valid and
// invalid names of every kind, at and past every limit. The caller owns
// the slice.
func Inputs() []string {
	return []string{
		// Plain names.
		"echo", "alpha", "n1", "Node-1_B", "image.resize", "billing.charge.v2",
		"broker.url", "pg.main", "bucket@n2", "s3://bucket/path", "db:5432",
		"box1.example.org", "a-b.example", "UPPER", "_INBOX", "-dash", "_under",
		"9lives", ".hidden", "..", ".", "a.b.c.d",
		// The name the layers used to disagree on: hosted by the bridge,
		// never advertised by the node.
		"café", "cap.café", "ünïcode.ok",
		// Dots out of place.
		"", ".a", "a.", "a..b", "a...", "-.-", "a.-", "-a-.b",
		// Wildcards and separators of NATS and AMQP.
		"*", ">", "#", "a.*", "a.>", "a#b", "a.#", "a*b", "a>b",
		"$SYS", "$MESH.status",
		// Whitespace and control bytes.
		" ", "a b", "a\tb", "a\nb", "a\rb", "a\x00b", "a\x7fb", "\x00", "echo ",
		// Other punctuation.
		"a/b", "a:b", "a@b", "a,b", "a;b", "a'b", `a"b`, "a\\b", "a+b", "a=b", "a%b",
		"a~b", "a|b", "a(b)", "a[b]", "a{b}", "a!", "a?",
		// Invalid UTF-8, non-ASCII letters and look-alikes.
		"\xff", "a\xc3", "\xc3\xa9", "ｅｃｈｏ", "echo\u200b", "Ωmega", "日本",
		// Lengths at and past every limit.
		strings.Repeat("a", 63), strings.Repeat("a", 64), strings.Repeat("a", 65),
		strings.Repeat("a", 127), strings.Repeat("a", 128), strings.Repeat("a", 129),
		strings.Repeat("a", 200), strings.Repeat("a", 201),
		strings.Repeat("a.", 63) + "ab", strings.Repeat("a.", 64) + "a",
		strings.Repeat("a", 63) + ".example", strings.Repeat("a", 64) + ".example",
		strings.Repeat(strings.Repeat("a", 63)+".", 3) + strings.Repeat("a", 61),
		strings.Repeat(strings.Repeat("a", 63)+".", 3) + strings.Repeat("a", 62),
		// Case: setting keys are lower case, every name is case-sensitive.
		"Broker.url", "broker.URL", "Echo",
	}
}
