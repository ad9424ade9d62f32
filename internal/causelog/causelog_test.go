package causelog

import (
	"strconv"
	"testing"
)

// A cause is logged once per key, and the keys remembered are bounded.
func TestOncePerKeyAndBounded(t *testing.T) {
	var l Log
	if !l.First("a/node.a.g9") || l.First("a/node.a.g9") {
		t.Fatal("the same cause and sender: want logged once")
	}
	if !l.First("b/node.a.g9") || !l.First("a/node.a.g8") {
		t.Fatal("another cause or sender: want logged")
	}
	for i := range 2 * Max {
		l.First("x/" + strconv.Itoa(i))
	}
	if n := l.Len(); n != Max {
		t.Errorf("remembered %d, want at most %d", n, Max)
	}
	if l.First("new cause") {
		t.Error("a new cause past the bound: want not logged")
	}
}
