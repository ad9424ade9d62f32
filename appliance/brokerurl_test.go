package appliance

import (
	"testing"

	"github.com/meshbox/meshbox/cache"
)

func TestWithBrokerCredential(t *testing.T) {
	cred := &cache.BrokerCredential{Generation: 2, User: "node.alpha.g2", Password: "p@ss/w:rd"}
	tests := []struct {
		raw  string
		cred *cache.BrokerCredential
		want string
	}{
		{"amqp://broker.example.org:5672/mesh", cred, "amqp://node.alpha.g2:p%40ss%2Fw%3Ard@broker.example.org:5672/mesh"},
		{"amqps://broker.example.org/", cred, "amqps://node.alpha.g2:p%40ss%2Fw%3Ard@broker.example.org/"},
		{"amqp://broker.example.org:5672/", nil, "amqp://broker.example.org:5672/"},
		{"", cred, ""},
		{"amqp://a.example:5672/mesh, amqp://b.example:5672/mesh", cred,
			"amqp://node.alpha.g2:p%40ss%2Fw%3Ard@a.example:5672/mesh,amqp://node.alpha.g2:p%40ss%2Fw%3Ard@b.example:5672/mesh"},
	}
	for _, tt := range tests {
		if got := withBrokerCredential(tt.raw, tt.cred); got != tt.want {
			t.Errorf("withBrokerCredential(%q): got %q, want %q", tt.raw, got, tt.want)
		}
	}
}
