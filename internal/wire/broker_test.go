package wire

import (
	"regexp"
	"slices"
	"testing"
)

// TestNodePermissions checks, name by name, what node alpha's patterns
// allow: server-named queues to configure and nothing else (so no exchange
// name at all), its durable queues and allowed stages to bind and consume,
// never another node's names, a stage outside its list, an older mesh's
// exchange or the default exchange.
func TestNodePermissions(t *testing.T) {
	p, err := NodePermissions("alpha", []string{"resize", "image.thumb"})
	if err != nil {
		t.Fatal(err)
	}
	type check struct {
		pattern string
		name    string
		want    bool
	}
	var checks []check
	add := func(pattern string, want bool, names ...string) {
		for _, n := range names {
			checks = append(checks, check{pattern, n, want})
		}
	}
	serverNamed := []string{"amq.gen-JzTY20BRgKO-HjmUJj0wLg", "amq.gen-x"}
	durable := []string{"node.alpha.events"}
	named := []string{"node.alpha.requests", "node.alpha.replies", "node.alpha.system"} // an older mesh's
	otherQueues := []string{"node.beta.requests", "node.beta.replies", "node.beta.events", "node.beta.system",
		"node.alphax.requests", "node.alpha.requests.x", "xnode.alpha.requests", "node.alphax", "node.alpha.eventsx"}
	allowed := []string{"cmd.resize", "cmd.image.thumb", "retry.resize", "retry.image.thumb", "dead.resize", "dead.image.thumb"}
	notAllowed := []string{"cmd.other", "cmd.resize.x", "cmd.image", "cmd.imageXthumb", "cmd.", "cmd.#",
		"retry.other", "dead.other", "retry.resize.x", "dead.image", "retry.", "dead.#", "xretry.resize", "deadXresize"}
	exchanges := []string{"mesh", "mesh.dlx", "node.beta", "node.alpha", "amq.default", "", "amq.topic"}

	add("configure", true, serverNamed...)
	add("configure", true, "node.alpha.claim")
	add("configure", false, "node.beta.claim", "node.alpha.claimx")
	add("write", false, "node.alpha.claim")
	add("read", false, "node.alpha.claim")
	add("configure", false, durable...)
	add("configure", false, named...)
	add("configure", false, allowed...)
	add("configure", false, otherQueues...)
	add("configure", false, notAllowed...)
	add("configure", false, exchanges...)
	add("configure", false, "mesh.dead", "xamq.gen-a", "amq.genx")

	add("write", true, serverNamed...)
	add("write", true, durable...)
	add("write", true, allowed...)
	add("write", true, "mesh", "mesh.dlx")
	add("write", false, named...)
	add("write", false, otherQueues...)
	add("write", false, notAllowed...)
	add("write", false, "node.alpha", "node.beta", "amq.default", "", "amq.topic", "mesh.dead", "meshx", "xmesh")

	add("read", true, serverNamed...)
	add("read", true, durable...)
	add("read", true, allowed...)
	add("read", true, "mesh")
	add("read", false, named...)
	add("read", false, otherQueues...)
	add("read", false, notAllowed...)
	add("read", false, "node.alpha", "node.beta", "mesh.dlx", "mesh.dead", "amq.default", "amq.topic")

	add("topic write", true, "cmd.resize", "cmd.other.stage", "evt.door.open", "sys.hello",
		"to.beta.req.echo", "to.beta.req.image.resize", "to.beta.reply", "to.beta.sys.hello", "to.alpha.req.echo")
	add("topic write", true, "retry.resize", "dead.image.thumb", "evo.alpha.door.open")
	add("topic write", false, "evo.beta.door.open", "evo.alpha", "evo.alphax.door", "evo.*.door")
	add("topic write", false, "retry.other", "dead.other", "retry.resize.x", "dead.", "retry")
	add("topic write", false, "to.beta", "to.beta.replyx", "to.beta.other", "to.be.ta.reply", "node.beta.requests",
		"cmd", "evt.", "x.evt.a", "to..reply", "")

	add("topic read", true, "evt.#", "sys.#", "cmd.resize", "cmd.image.thumb", "retry.resize", "dead.image.thumb")
	// Event keys: a node may receive every event (sealed for its scopes).
	add("topic read", true, "evt.door.open", "evt.door.*", "evt.*.open", "evt.door.#", "evo.beta.door.open", "evo.beta.#", "evo.alpha.*.x")
	add("topic read", false, "evt", "evo.#", "evo.*.door", "evo.beta", "evt.do#or", "evo.beta.x y")
	add("topic read", false, "retry.other", "dead.other", "retry.#", "dead.#")
	// Its own name's keys: its queues bind to mesh themselves (and an
	// older meshbox binds node.alpha with to.alpha.#).
	add("topic read", true, "to.alpha.#", "to.alpha.req.#", "to.alpha.reply", "to.alpha.sys.#")
	add("topic read", false, "to.alpha", "to.alpha.req.echo", "to.alphax.#", "to.alpha.#.x", "to.alpha.*", "to.*.reply",
		"to.beta.req.#", "to.beta.reply", "to.beta.sys.#")
	add("topic read", false, "#", "to.beta.#", "cmd.#", "cmd.*", "cmd.other", "evt.*.x.#x", "to.*.req.#", "*.#")

	patterns := map[string]string{
		"configure": p.Configure, "write": p.Write, "read": p.Read,
		"topic write": p.TopicWrite, "topic read": p.TopicRead,
	}
	for _, c := range checks {
		re := regexp.MustCompile(patterns[c.pattern])
		if got := re.MatchString(c.name); got != c.want {
			t.Errorf("%s pattern %q on %q: got %v, want %v", c.pattern, patterns[c.pattern], c.name, got, c.want)
		}
	}
	if p.TopicExchange != "mesh" {
		t.Errorf("topic exchange: got %q, want mesh", p.TopicExchange)
	}
}

// TestNodePermissionsStageLists checks the allow-list forms: every stage,
// none, and bad names.
func TestNodePermissionsStageLists(t *testing.T) {
	tests := []struct {
		name      string
		stages    []string
		stage     string // a stage queue's name to try
		want      bool
		wantError bool
	}{
		{"all", []string{"*"}, "cmd.any.stage", true, false},
		{"all with others", []string{"a", "*"}, "cmd.b", true, false},
		{"none", nil, "cmd.a", false, false},
		{"one", []string{"a"}, "cmd.a", true, false},
		{"regexp metacharacters are names", []string{"a-b_c"}, "cmd.a-b_c", true, false},
		{"bad stage", []string{"a b"}, "", false, true},
		{"wildcard is not a stage", []string{"a.*"}, "", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := NodePermissions("n1", tt.stages)
			if (err != nil) != tt.wantError {
				t.Fatalf("error: got %v, want error %v", err, tt.wantError)
			}
			if err != nil {
				return
			}
			// Stage queues are the admin's to declare, but a node allowed
			// every stage declares them itself.
			if got, want := regexp.MustCompile(p.Configure).MatchString(tt.stage), tt.want && slices.Contains(tt.stages, AllStages); got != want {
				t.Errorf("configure %q on %q: got %v, want %v", p.Configure, tt.stage, got, want)
			}
			for what, pat := range map[string]string{"read": p.Read, "write": p.Write} {
				if got := regexp.MustCompile(pat).MatchString(tt.stage); got != tt.want {
					t.Errorf("%s %q on %q: got %v, want %v", what, pat, tt.stage, got, tt.want)
				}
			}
			if got := regexp.MustCompile(p.TopicRead).MatchString("cmd." + tt.stage[len("cmd."):]); got != tt.want {
				t.Errorf("topic read %q on %q: got %v, want %v", p.TopicRead, tt.stage, got, tt.want)
			}
		})
	}
	if _, err := NodePermissions("no.dots", nil); err == nil {
		t.Error("node name with a dot: got no error")
	}
}

func TestBrokerUser(t *testing.T) {
	if got := BrokerUser("cellar", 2); got != "node.cellar.g2" {
		t.Errorf("BrokerUser: got %q, want node.cellar.g2", got)
	}
	tests := []struct {
		user string
		node string
		gen  int
		ok   bool
	}{
		{"node.cellar.g1", "cellar", 1, true},
		{"node.a-b_c.g12", "a-b_c", 12, true},
		{"node.cellar.g0", "", 0, false},
		{"node.cellar.g01", "", 0, false},
		{"node.cellar.g", "", 0, false},
		{"node.cellar", "", 0, false},
		{"node.a.b.g1", "", 0, false},
		{"guest", "", 0, false},
		{"node..g1", "", 0, false},
		{"node.cellar.g-1", "", 0, false},
	}
	for _, tt := range tests {
		node, gen, ok := ParseBrokerUser(tt.user)
		if node != tt.node || gen != tt.gen || ok != tt.ok {
			t.Errorf("ParseBrokerUser(%q): got %q %d %v, want %q %d %v", tt.user, node, gen, ok, tt.node, tt.gen, tt.ok)
		}
	}
}
