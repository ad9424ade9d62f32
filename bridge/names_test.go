package bridge

import "testing"

func TestValidName(t *testing.T) {
	tests := []struct {
		in   string
		want bool
	}{
		{"echo", true},
		{"billing.charge", true},
		{"a-b_c.d9", true},
		{"ünïcode.ok", true},
		{"", false},
		{".a", false},
		{"a.", false},
		{"a..b", false},
		{"a.*", false},
		{"a.>", false},
		{"a#b", false},
		{"a b", false},
		{"a\tb", false},
		{"a\x00b", false},
		{"a\x7fb", false},
		{string(make([]byte, maxNameLen+1)), false},
		{"\xff", false},
	}
	for _, tt := range tests {
		if got := validName(tt.in); got != tt.want {
			t.Errorf("validName(%q): got %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestValidNodeName(t *testing.T) {
	tests := []struct {
		in   string
		want bool
	}{
		{"alpha", true},
		{"node-1_B", true},
		{"", false},
		{"a.b", false},
		{"a b", false},
		{string(make([]byte, 65)), false},
	}
	for _, tt := range tests {
		if got := validNodeName(tt.in); got != tt.want {
			t.Errorf("validNodeName(%q): got %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestRoutingKeys(t *testing.T) {
	if k := requestKey("beta", "billing.charge"); k != "to.beta.req.billing.charge" {
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
		node, name, ok := parseRequestKey(tt.key)
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
		got, ok := parseSystemKey(tt.key)
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
		node, ok := parseReplyQueue(tt.q)
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
		node, name, ok := parseNodeCapSubject(tt.subj)
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
