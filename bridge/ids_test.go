package bridge

import (
	"encoding/base32"
	"strings"
	"testing"
)

// Correlation and message ids must be unguessable: seeing one (in a
// heartbeat, a dead letter, a reply) tells nothing about the next. Each is
// 128 random bits, so ids are unique, share no prefix worth the name and
// are not a counter.
func TestIDsAreUnpredictable(t *testing.T) {
	const n = 10000
	seen := make(map[string]bool, n)
	prev := newID()
	longestCommon := 0
	for range n {
		id := newID()
		if seen[id] {
			t.Fatalf("got id %q twice", id)
		}
		seen[id] = true
		raw, err := base32.StdEncoding.WithPadding(base32.NoPadding).DecodeString(id)
		if err != nil || len(raw) < 16 {
			t.Fatalf("id %q: got %d bytes (%v), want at least 128 random bits in base32", id, len(raw), err)
		}
		if strings.Contains(id, "local") {
			t.Fatalf("id %q names the node", id)
		}
		k := 0
		for k < len(id) && k < len(prev) && id[k] == prev[k] {
			k++
		}
		longestCommon = max(longestCommon, k)
		prev = id
	}
	// Consecutive ids from a counter share everything but the last digits;
	// random ones share a few leading characters at most (5 bits each).
	if longestCommon > 6 {
		t.Fatalf("consecutive ids shared a prefix of %d characters, want them unrelated", longestCommon)
	}
}
