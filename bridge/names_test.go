package bridge

import (
	"testing"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/internal/names"
	"github.com/meshbox/meshbox/internal/names/namestest"
)

// TestNamesAgree checks that every way a name enters the bridge - a local
// subject, a broker routing key, a delivery, the config - accepts exactly
// the names package names accepts (package outbox checks its records the
// same way).
func TestNamesAgree(t *testing.T) {
	inputs := namestest.Inputs()
	for _, s := range inputs {
		checkBridgeNames(t, s)
	}
	// The name the layers used to disagree on: the bridge hosted it, the
	// node never advertised it. Now nobody takes it.
	if codec.ValidName("café") {
		t.Error(`validName("café"): got true, want false`)
	}
	if _, _, ok := codec.ParseNodeCapSubject("node.alpha.cap.café"); ok {
		t.Error("node.alpha.cap.café: parsed, want rejected")
	}
}

// FuzzBridgeNames checks the bridge's name entry points against package
// names for any input.
func FuzzBridgeNames(f *testing.F) {
	for _, s := range namestest.Inputs() {
		f.Add(s)
	}
	f.Fuzz(checkBridgeNames)
}

func checkBridgeNames(t *testing.T, s string) {
	t.Helper()
	nodeOK := names.Node(s) == nil
	capOK := names.Capability(s) == nil
	for _, k := range []names.Kind{names.KindStage, names.KindTopic, names.KindSystemKey} {
		if (names.Check(k, s) == nil) != capOK {
			t.Fatalf("%q: %s and capability name disagree in package names", s, k)
		}
	}
	agree := func(what string, got, want bool) {
		t.Helper()
		if got != want {
			t.Fatalf("%s %q: bridge says valid=%v, package names says %v", what, s, got, want)
		}
	}
	agree("validNodeName", codec.ValidNodeName(s), nodeOK)
	agree("validName", codec.ValidName(s), capOK)

	// Local subjects and broker names.
	n, c, ok := codec.ParseNodeCapSubject("node.alpha.cap." + s)
	agree("capability in node.<node>.cap.<name>", ok && n == "alpha" && c == s, capOK)
	n, c, ok = codec.ParseNodeCapSubject("node." + s + ".cap.echo")
	agree("node in node.<node>.cap.<name>", ok && n == s && c == "echo", nodeOK)
	n, c, ok = codec.ParseRequestKey("to.alpha.req." + s)
	agree("capability in a request key", ok && n == "alpha" && c == s, capOK)
	n, c, ok = codec.ParseRequestKey("to." + s + ".req.echo")
	agree("node in a request key", ok && n == s && c == "echo", nodeOK)
	n, ok = codec.ParseReplyQueue(codec.ReplyQueue(s))
	agree("node in a reply queue", ok && n == s, nodeOK)
	c, ok = codec.ParseSystemKey(codec.SystemKey(s))
	agree("system key", ok && c == s, capOK)
	c, ok = codec.ParseSystemKey(codec.AddressedSystemKey("alpha", s))
	agree("addressed system key", ok && c == s, capOK)

	// Deliveries from the broker.
	origin := amqp.Table{codec.HeaderOrigin: "alpha"}
	_, err := codec.Decode(codec.TypeCommand, codec.Delivery{Type: codec.TypeCommand, RoutingKey: codec.CommandKey(s), MessageId: "m1", Headers: origin}, 1<<20)
	agree("stage of a command delivery", err == nil, capOK)
	_, err = codec.Decode(codec.TypeEvent, codec.Delivery{Type: codec.TypeEvent, RoutingKey: codec.EventKey(s), MessageId: "m1", Headers: origin}, 1<<20)
	agree("topic of an event delivery", err == nil, capOK)
	_, err = codec.Decode(codec.TypeRequest, codec.Delivery{Type: codec.TypeRequest, RoutingKey: codec.RequestQueue("beta"), CorrelationId: "c1",
		ReplyTo: "node.alpha.replies", Headers: amqp.Table{codec.HeaderOrigin: "alpha", codec.HeaderCapability: s}}, 1<<20)
	agree("capability header of a request delivery", err == nil, capOK)
	_, err = codec.Decode(codec.TypeEvent, codec.Delivery{Type: codec.TypeEvent, RoutingKey: "evt.t", MessageId: "m1", Headers: amqp.Table{codec.HeaderOrigin: s}}, 1<<20)
	agree("origin of a delivery", err == nil, nodeOK)

	// Configuration.
	dial := func(...nats.Option) (*nats.Conn, error) { return nil, nil }
	base := Config{Node: "alpha", OutboxPath: "outbox", Dial: dial}
	cfg := base
	cfg.Node = s
	agree("Config.Node", cfg.withDefaults().validate() == nil, nodeOK)
	cfg = base
	cfg.Routes = map[string]string{s: "beta"}
	agree("Config.Routes capability", cfg.withDefaults().validate() == nil, capOK)
	cfg.Routes = map[string]string{"echo": s}
	agree("Config.Routes node", cfg.withDefaults().validate() == nil, nodeOK)
	cfg = base
	cfg.Stages = []string{s}
	agree("Config.Stages", cfg.withDefaults().validate() == nil, capOK)
}

func TestRoutingKeys(t *testing.T) {
	if k := codec.RequestKey("beta", "billing.charge"); k != "to.beta.req.billing.charge" {
		t.Errorf("requestKey: got %q", k)
	}
	tests := []struct {
		key        string
		node, name string
		ok         bool
	}{
		{"to.beta.req.echo", "beta", "echo", true},
		{"to.beta.req.a.b", "beta", "a.b", true},
		{"to.beta.sys.echo", "", "", false},
		{"to..req.echo", "", "", false},
		{"from.beta.req.echo", "", "", false},
		{"to.beta.req.", "", "", false},
	}
	for _, tt := range tests {
		node, name, ok := codec.ParseRequestKey(tt.key)
		if node != tt.node || name != tt.name || ok != tt.ok {
			t.Errorf("parseRequestKey(%q): got %q %q %v, want %q %q %v", tt.key, node, name, ok, tt.node, tt.name, tt.ok)
		}
	}
	for _, tt := range []struct {
		key, want string
		ok        bool
	}{
		{"sys.hello", "hello", true},
		{"to.a.sys.hello.x", "hello.x", true},
		{"sys.", "", false},
		{"to.a.b.sys.x", "", false},
	} {
		got, ok := codec.ParseSystemKey(tt.key)
		if got != tt.want || ok != tt.ok {
			t.Errorf("parseSystemKey(%q): got %q %v, want %q %v", tt.key, got, ok, tt.want, tt.ok)
		}
	}
	for _, tt := range []struct {
		q, node string
		ok      bool
	}{
		{"node.alpha.replies", "alpha", true},
		{"node.alpha.requests", "", false},
		{"node.a.b.replies", "", false},
		{"amq.rabbitmq.reply-to", "", false},
	} {
		node, ok := codec.ParseReplyQueue(tt.q)
		if node != tt.node || ok != tt.ok {
			t.Errorf("parseReplyQueue(%q): got %q %v, want %q %v", tt.q, node, ok, tt.node, tt.ok)
		}
	}
	for _, tt := range []struct {
		subj, node, name string
		ok               bool
	}{
		{"node.beta.cap.echo", "beta", "echo", true},
		{"node.beta.cap.a.b", "beta", "a.b", true},
		{"node.beta.echo", "", "", false},
		{"node.b.c.cap.echo", "", "", false},
	} {
		node, name, ok := codec.ParseNodeCapSubject(tt.subj)
		if node != tt.node || name != tt.name || ok != tt.ok {
			t.Errorf("parseNodeCapSubject(%q): got %q %q %v, want %q %q %v", tt.subj, node, name, ok, tt.node, tt.name, tt.ok)
		}
	}
}

func TestRedactURL(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"amqp://guest:secret@host:5672/vh", "amqp://guest:xxxxx@host:5672/vh"},
		{"amqps://host/", "amqps://host/"},
	}
	for _, tt := range tests {
		if got := redactURL(tt.in); got != tt.want {
			t.Errorf("redactURL(%q): got %q, want %q", tt.in, got, tt.want)
		}
	}
}
