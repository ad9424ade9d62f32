package bridge

import "testing"

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
		err := checkBrokerURL(tc.raw, "alpha")
		if (err == nil) != tc.ok {
			t.Errorf("checkBrokerURL(%q): got %v, want ok=%v", tc.raw, err, tc.ok)
		}
	}
}
