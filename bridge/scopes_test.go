package bridge

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/internal/seal"
)

// scopeRing is a keyring holding the mesh's key km and, when member, key
// kv of scope vault; stage ledger is bound to vault (when bound).
func scopeRing(t *testing.T, km, kv seal.ContentKey, member, bound bool) *seal.Keyring {
	t.Helper()
	sc := seal.Scopes{Bindings: map[string]string{}, Member: map[string]bool{}, Current: map[string]string{}}
	if bound {
		sc.Bindings[seal.BindingKey(seal.BindStage, "ledger")] = "vault"
	}
	keys := []seal.ContentKey{km}
	if member {
		sc.Member["vault"] = true
		sc.Current["vault"] = kv.ID
		keys = append(keys, kv)
	}
	ring := &seal.Keyring{}
	if err := ring.SetScoped(keys, km.ID, sc); err != nil {
		t.Fatal(err)
	}
	return ring
}

func scopeTestBridge(ring *seal.Keyring) *Bridge {
	b := &Bridge{cfg: Config{Node: "gamma", Keys: ring, MaxPayload: DefaultMaxPayload}, log: slog.New(slog.DiscardHandler)}
	b.m = newMetrics(b)
	return b
}

// TestScopedSealing: a command for a stage bound to a scope is sealed with
// the scope's key and opens only as such; sealed with the mesh's key (a
// downgrade), or with the scope's key for another name, or at a node
// outside the scope, it is refused as wrong_scope.
func TestScopedSealing(t *testing.T) {
	km, _ := seal.ContentKeyFrom("kmesh", seal.NewContentKey().Bytes())
	kv, _ := seal.ContentKeyFrom("kvault", seal.NewContentKey().Bytes())
	kv.Scope = "vault"
	member := scopeRing(t, km, kv, true, true)
	cmd := func(stage string) *codec.Outgoing {
		return &codec.Outgoing{Exchange: codec.ExchangeMesh, Key: codec.CommandKey(stage), Kind: codec.TypeCommand, MsgID: "m1", At: time.Now(), Body: []byte("secret")}
	}
	sealed := func(ring *seal.Keyring, o *codec.Outgoing) amqp.Delivery {
		t.Helper()
		p, err := o.Publishing("alpha", "guest", ring)
		if err != nil {
			t.Fatal(err)
		}
		return deliver(p, o.Key)
	}

	d := sealed(member, cmd("ledger"))
	if got := d.Headers[codec.HeaderKey]; got != kv.ID {
		t.Fatalf("a command for the scoped stage is sealed with %v, want the scope's key %s", got, kv.ID)
	}
	env, err := scopeTestBridge(member).open(codec.TypeCommand, d)
	if err != nil || string(env.Body) != "secret" || env.Scope != "vault" {
		t.Fatalf("opened at a member: %v %v", env, err)
	}
	if got := sealed(member, cmd("other")).Headers[codec.HeaderKey]; got != km.ID {
		t.Fatalf("a command for an unscoped stage is sealed with %v, want the mesh's key %s", got, km.ID)
	}

	wrong := func(name string, b *Bridge, d amqp.Delivery) {
		t.Helper()
		_, err := b.open(codec.TypeCommand, d)
		if ue := codec.AsUnseal(err); ue == nil || ue.Reason != codec.UnsealWrongScope {
			t.Errorf("%s: got %v, want refused as %s", name, err, codec.UnsealWrongScope)
		}
	}
	// A sender that does not know the binding seals with the mesh's key.
	wrong("downgrade to the mesh's key", scopeTestBridge(member), sealed(scopeRing(t, km, kv, true, false), cmd("ledger")))
	// The scope's key on a name not bound to it.
	other := cmd("other")
	senderRing := &seal.Keyring{}
	if err := senderRing.SetScoped([]seal.ContentKey{km, kv}, km.ID, seal.Scopes{
		Bindings: map[string]string{seal.BindingKey(seal.BindStage, "other"): "vault"},
		Member:   map[string]bool{"vault": true}, Current: map[string]string{"vault": kv.ID}}); err != nil {
		t.Fatal(err)
	}
	wrong("the scope's key on an unscoped name", scopeTestBridge(member), sealed(senderRing, other))
	// A node outside the scope cannot open it, and says why.
	outside := scopeTestBridge(scopeRing(t, km, kv, false, true))
	_, err = outside.open(codec.TypeCommand, d)
	if ue := codec.AsUnseal(err); ue == nil || ue.Reason != codec.UnsealWrongScope || !strings.Contains(ue.Detail, "scope vault") {
		t.Errorf("outside the scope: got %v, want refused as wrong_scope naming scope vault", err)
	}
	// Which refusals may be this node's bindings lagging behind the
	// sender's (waited for before the refusal): only the scope's key, at
	// a member, on a name its bindings do not bind to the scope yet.
	for _, c := range []struct {
		name    string
		b       *Bridge
		d       amqp.Delivery
		lagging bool
	}{
		{"the scope's key on a name this member does not know bound", scopeTestBridge(member), sealed(senderRing, other), true},
		{"the mesh's key on a scoped name", scopeTestBridge(member), sealed(scopeRing(t, km, kv, true, false), cmd("ledger")), false},
		{"the scope's key outside the scope", outside, d, false},
	} {
		_, err := c.b.open(codec.TypeCommand, c.d)
		if ue := codec.AsUnseal(err); ue == nil || ue.Lagging != c.lagging {
			t.Errorf("%s: got %v (lagging %v), want lagging %v", c.name, err, ue != nil && ue.Lagging, c.lagging)
		}
	}
	// Moved to an unscoped stage: the scope is in the associated
	// data, and so is the routing key.
	moved := d
	moved.RoutingKey = codec.CommandKey("other")
	wrong("moved to an unscoped stage", scopeTestBridge(member), moved)

	// A reply is sealed with its request's scope and opens as such.
	rep := &codec.Outgoing{Exchange: codec.ExchangeMesh, Key: codec.ReplyKey("alpha"), Kind: codec.TypeReply, CorrID: "c1", At: time.Now(),
		Body: []byte("answer"), Scope: "vault"}
	rd := sealed(member, rep)
	if got := rd.Headers[codec.HeaderKey]; got != kv.ID {
		t.Fatalf("a reply to a scoped request is sealed with %v, want the scope's key %s", got, kv.ID)
	}
	if env, err := scopeTestBridge(member).open(codec.TypeReply, rd); err != nil || string(env.Body) != "answer" || env.Scope != "vault" {
		t.Fatalf("a scoped reply at a member: %v %v", env, err)
	}

	// Outside the scope, the node refuses to send or host.
	if _, err := cmd("ledger").Publishing("gamma", "guest", outside.cfg.Keys); !errors.Is(err, seal.ErrNotMember) {
		t.Errorf("sealing outside the scope: got %v, want ErrNotMember", err)
	}
	err = outside.notInScope(seal.BindStage, "ledger", "submit to")
	var se *ServiceError
	if !errors.As(err, &se) || se.Code != CodeForbidden || !strings.Contains(se.Text, "not in scope vault") {
		t.Errorf("submit outside the scope: got %v, want 403 naming the scope", err)
	}
	if err := scopeTestBridge(member).notInScope(seal.BindStage, "ledger", "submit to"); err != nil {
		t.Errorf("submit inside the scope: %v", err)
	}
	if outside.mayHost("ledger") || !outside.mayHost("other") || !scopeTestBridge(member).mayHost("ledger") {
		t.Error("mayHost: a node outside the scope may host its stage, or a member may not")
	}
}

// TestScopedCapabilityHosts: a capability bound to a scope is called only
// on the scope's nodes, though a node outside it serves it too.
func TestScopedCapabilityHosts(t *testing.T) {
	km, _ := seal.ContentKeyFrom("kmesh", seal.NewContentKey().Bytes())
	ring := &seal.Keyring{}
	if err := ring.SetScoped([]seal.ContentKey{km}, km.ID, seal.Scopes{
		Bindings: map[string]string{seal.BindingKey(seal.BindCap, "safe"): "vault"},
		Members:  map[string][]string{"vault": {"alpha", "beta"}}}); err != nil {
		t.Fatal(err)
	}
	b := scopeTestBridge(ring)
	b.cfg.Node = "alpha"
	b.route.routes = map[string][]string{"safe": {"beta", "gamma"}, "open": {"beta", "gamma"}}
	seen := map[string]bool{}
	for range 10 {
		n, err := b.pickHost("safe")
		if err != nil {
			t.Fatal(err)
		}
		seen[n] = true
	}
	if !seen["beta"] || seen["gamma"] {
		t.Errorf("hosts picked for the scoped capability: %v, want beta only", seen)
	}
	seen = map[string]bool{}
	for range 10 {
		n, _ := b.pickHost("open")
		seen[n] = true
	}
	if !seen["beta"] || !seen["gamma"] {
		t.Errorf("hosts picked for an unscoped capability: %v, want beta and gamma", seen)
	}
	b.route.routes = map[string][]string{"safe": {"gamma"}}
	if _, err := b.pickHost("safe"); err == nil {
		t.Error("the scoped capability was routed to gamma, outside its scope")
	}
}

// A command's result goes to a topic bound to a scope only when the
// command's submitter is in that scope: a peer outside vault cannot make
// a handler inside it publish on vault's topics (sealed with vault's key,
// as the handler's own event).
func TestResultOriginInTopicScope(t *testing.T) {
	km, kv := seal.NewContentKey(), seal.NewContentKey()
	kv.Scope = "vault"
	sc := seal.Scopes{
		Bindings: map[string]string{seal.BindingKey(seal.BindTopic, "ledger.done"): "vault"},
		Member:   map[string]bool{"vault": true}, Current: map[string]string{"vault": kv.ID},
		Members: map[string][]string{"vault": {"alpha", "beta"}},
	}
	ring := &seal.Keyring{}
	if err := ring.SetScoped([]seal.ContentKey{km, kv}, km.ID, sc); err != nil {
		t.Fatal(err)
	}
	b := scopeTestBridge(ring)
	for _, tt := range []struct {
		topic, origin string
		ok            bool
	}{
		{"ledger.done", "alpha", true},     // a member submitted it
		{"ledger.done", "mallory", false},  // a peer outside vault
		{"plain.done", "mallory", true},    // the mesh's topic: anyone in the mesh
		{"ledger.done.x", "mallory", true}, // another topic, unbound
	} {
		err := b.resultOrigin(tt.topic, tt.origin)
		var se *ServiceError
		if (err == nil) != tt.ok || (err != nil && (!errors.As(err, &se) || se.Code != CodeForbidden)) {
			t.Errorf("result on %s submitted by %s: got %v, want allowed %v", tt.topic, tt.origin, err, tt.ok)
		}
	}
}
