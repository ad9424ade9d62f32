package link

import (
	"strings"
	"testing"

	"github.com/meshbox/meshbox/internal/backoff"
)

// TestLinkFailoverOrder: the link starts on some broker of its list, goes
// round all of them on failures, keeps the broker it is on across a new
// list that still names it, and records a failover only when the broker
// changes.
func TestLinkFailoverOrder(t *testing.T) {
	list := "amqp://u:p@a:5672/v,amqp://u:p@b:5672/v,amqp://u:p@c:5672/v"
	l := New(list, backoff.Policy{Min: 1, Max: 2})
	first := l.Target()
	if l.Target() != first {
		t.Fatal("target moved without a failure")
	}
	seen := map[string]bool{first: true}
	for range 2 {
		seen[l.Advance()] = true
	}
	if len(seen) != 3 {
		t.Fatalf("advance visited %d brokers in three tries, want all 3", len(seen))
	}
	if got := l.Advance(); got != first {
		t.Errorf("after a round: got %s, want %s again", got, first)
	}

	if _, moved := l.ConnectedTo("amqp://u:p@b:5672/v", ""); moved {
		t.Error("the first connection counted as a failover")
	}
	if _, moved := l.ConnectedTo("amqp://u:p@b:5672/v", "x"); moved {
		t.Error("a reconnect to the same broker counted as a failover")
	}
	fo, moved := l.ConnectedTo("amqp://u:p@c:5672/v", "publishing connection closed")
	if !moved || fo.From != "b:5672" || fo.To != "c:5672" || fo.Reason != "publishing connection closed" {
		t.Errorf("got %+v moved=%v, want a failover from b:5672 to c:5672", fo, moved)
	}
	if st := l.Status(); len(st.Failovers) != 1 || len(st.URLs) != 3 || st.URLs[0] != "amqp://u:xxxxx@a:5672/v" {
		t.Errorf("status failovers %+v urls %q", st.Failovers, st.URLs)
	}

	// A new list (new credential) that still names c keeps the link on c.
	l.SetURL("amqp://u:q@c:5672/v,amqp://u:q@d:5672/v")
	if got := l.Target(); got != "amqp://u:q@c:5672/v" {
		t.Errorf("after a new list: target %s, want the same broker c", got)
	}
	if got := l.SameBrokerAs("amqp://u:p@c:5672/v"); got != "amqp://u:q@c:5672/v" {
		t.Errorf("sameBrokerAs: got %q", got)
	}
	if l.Holds("amqp://u:p@c:5672/v") {
		t.Error("holds a URL of the old list")
	}
}

func TestCheckBrokerURLList(t *testing.T) {
	for _, tc := range []struct {
		raw string
		ok  bool
	}{
		{"", true},
		{"amqp://u:p@a/v", true},
		{"amqp://u:p@a/v, amqps://u:p@b/v", true},
		{"amqp://u:p@a/v,", false},
		{"amqp://u:p@a/v,,amqp://u:p@b/v", false},
		{"amqp://u:p@a/v,http://b", false},
		{"amqp://u:p@a/v,amqp://w:p@b/v", false},                        // two users
		{"amqp://node.alpha.g1:p@a/v,amqp://node.alpha.g1:p@b/v", true}, // the node's own user
		{"amqp://node.beta.g1:p@a/v,amqp://node.beta.g1:p@b/v", false},  // another node's
	} {
		err := CheckURL(tc.raw, "alpha")
		if (err == nil) != tc.ok {
			t.Errorf("CheckURL(%q): got %v, want ok=%v", tc.raw, err, tc.ok)
		}
	}
}

// A node cannot be started, or moved, on another node's broker user.
func TestBrokerURLOfAnotherNode(t *testing.T) {
	for _, tt := range []struct {
		url string
		ok  bool
	}{
		{"amqp://node.alpha.g2:pw@127.0.0.1:5672/mesh", true},
		{"amqp://guest:guest@127.0.0.1:5672/", true},
		{"amqp://127.0.0.1:5672/", true},
		{"amqp://node.beta.g1:pw@127.0.0.1:5672/mesh", false},
	} {
		err := CheckURL(tt.url, "alpha")
		if (err == nil) != tt.ok {
			t.Errorf("node alpha on %s: got %v, want ok %v", tt.url, err, tt.ok)
		}
		if err != nil && (!strings.Contains(err.Error(), "node beta's") || strings.Contains(err.Error(), ":pw@")) {
			t.Errorf("error %q: want it to name beta and hide the password", err)
		}
	}
}
