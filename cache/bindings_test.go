package cache

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

// TestBrokerCredentialRedacted: the broker password never shows in a log
// line or a %v of the bindings.
func TestBrokerCredentialRedacted(t *testing.T) {
	b := Bindings{Node: "alpha", Broker: &BrokerCredential{Generation: 2, User: "node.alpha.g2", Password: "s3cret-pw"}}
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("x", "bindings", b, "cred", *b.Broker)
	out := buf.String() + fmt.Sprintf("%v %+v %#v", b, *b.Broker, *b.Broker)
	if strings.Contains(out, "s3cret-pw") {
		t.Errorf("password leaked: %s", out)
	}
}

// A new broker credential shows in the divergence by user and generation,
// never by password.
func TestDiffBrokerCredential(t *testing.T) {
	old := Bindings{Node: "alpha", Broker: &BrokerCredential{Generation: 1, User: "node.alpha.g1", Password: "pw-one"}}
	cur := Bindings{Node: "alpha", Broker: &BrokerCredential{Generation: 2, User: "node.alpha.g2", Password: "pw-two"}}
	d := Diff(old, cur)
	if len(d) != 1 || d[0].Kind != KindBroker || d[0].Op != OpChanged ||
		d[0].String() != "broker_credential alpha changed: user=node.alpha.g1 generation=1 -> user=node.alpha.g2 generation=2" {
		t.Fatalf("diff: got %v", d.Strings())
	}
	if got := Diff(Bindings{Node: "alpha"}, cur); len(got) != 1 || got[0].Op != OpAdded || strings.Contains(got[0].String(), "pw-") {
		t.Errorf("added: got %v", got.Strings())
	}
}

// TestStagesInBindings: the node's stage allow-list is part of its
// bindings' content (a grant changes the hash, so a running node applies
// it), nil (not known: a cache file older than it) hashes as before it
// existed, and none (an empty list) survives the cache file's JSON.
func TestStagesInBindings(t *testing.T) {
	base := Bindings{Node: "ant", Settings: map[string]string{"broker.url": "amqp://b"}}
	none, some := base, base
	none.Stages, some.Stages = []string{}, []string{"thumbs", "resize"}
	if base.Hash() == none.Hash() || none.Hash() == some.Hash() {
		t.Errorf("hashes: unknown %s, none %s, [thumbs resize] %s; want three different ones", base.Hash(), none.Hash(), some.Hash())
	}
	sorted := base
	sorted.Stages = []string{"resize", "thumbs"}
	if sorted.Hash() != some.Hash() {
		t.Error("the order of the stages changes the hash")
	}
	for _, b := range []Bindings{base, none, some} {
		data, err := json.Marshal(b.Normalize())
		if err != nil {
			t.Fatal(err)
		}
		var back Bindings
		if err := json.Unmarshal(data, &back); err != nil {
			t.Fatal(err)
		}
		if (back.Stages == nil) != (b.Stages == nil) || back.Hash() != b.Hash() {
			t.Errorf("stages %#v through JSON (%s): got %#v, hash equal %v", b.Stages, data, back.Stages, back.Hash() == b.Hash())
		}
	}
}
