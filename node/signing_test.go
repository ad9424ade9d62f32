package node

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// edSigner is a Signer of a fresh Ed25519 key.
type edSigner struct{ priv ed25519.PrivateKey }

func newSigner(t testing.TB) edSigner {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return edSigner{priv: priv}
}

func (s edSigner) Sign(m []byte) []byte      { return ed25519.Sign(s.priv, m) }
func (s edSigner) public() ed25519.PublicKey { return s.priv.Public().(ed25519.PublicKey) }

// signed encodes m signed by s, as a version 4 node sends it.
func signed(s Signer, m Message) []byte { return signBody(good(m), s) }

// The version rule: a sender whose record has a signing key must sign with
// it; a sender without one is taken on the broker's word.
func TestCheckSignature(t *testing.T) {
	alpha, other := newSigner(t), newSigner(t)
	at := time.Now().UTC()
	bye := Message{V: 1, Type: TypeBye, Node: "alpha", StartedAt: at, Seq: 7, Proto: ProtocolVersion}
	hello := Message{V: 1, Type: TypeHello, Node: "alpha", StartedAt: at, Seq: 1, Proto: ProtocolVersion, Capabilities: []string{"echo"}}
	withKey := map[string]ed25519.PublicKey{"alpha": alpha.public()}
	tamper := func(body []byte, from, to string) []byte { return []byte(strings.Replace(string(body), from, to, 1)) }
	tests := []struct {
		name     string
		keys     map[string]ed25519.PublicKey
		body     []byte
		reason   string
		verified bool
	}{
		{"no key, unsigned (an older node)", nil, good(bye), "", false},
		{"no key, signed (its key is not published yet)", nil, signed(alpha, bye), "", false},
		{"another node's key only", map[string]ed25519.PublicKey{"beta": other.public()}, good(bye), "", false},
		{"key, signed with it", withKey, signed(alpha, bye), "", true},
		{"key, unsigned", withKey, good(bye), reasonUnsigned, false},
		{"key, signed with another key", withKey, signed(other, bye), reasonForged, false},
		{"key, capabilities changed after signing", withKey, tamper(signed(alpha, hello), `"echo"`, `"evil"`), reasonForged, false},
		{"key, sequence changed after signing", withKey, tamper(signed(alpha, bye), `"seq":7`, `"seq":8`), reasonForged, false},
		{"key, signature not the last member", withKey, tamper(signed(alpha, bye), `{"v":1,`, `{"v":1,"sig":"x",`), reasonForged, false},
		{"key, signature not base64url", withKey, tamper(signed(alpha, bye), `,"sig":"`, `,"sig":"!`), reasonForged, false},
		{"key of the wrong size", map[string]ed25519.PublicKey{"alpha": alpha.public()[:16]}, signed(alpha, bye), reasonForged, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m Message
			if err := json.Unmarshal(tt.body, &m); err != nil {
				t.Fatalf("decode %s: %v", tt.body, err)
			}
			reason, verified := checkSignature(tt.keys, &m, tt.body)
			if reason != tt.reason || verified != tt.verified {
				t.Errorf("got reason %q verified %v, want %q %v", reason, verified, tt.reason, tt.verified)
			}
		})
	}
}

// A signed message is still one an older node reads: "sig" is one more
// member, which it ignores, and its "v" is unchanged.
func TestSignedMessageReadByOlderNodes(t *testing.T) {
	s := newSigner(t)
	m := Message{V: 2, Type: TypeGone, Node: "alpha", Peer: "beta", StartedAt: time.Now().UTC(), Seq: 3, Proto: ProtocolVersion}
	body := signed(s, m)
	got, err := DecodeMessage(TypeGone, body, "alpha")
	if err != nil {
		t.Fatalf("DecodeMessage of a signed gone: %v", err)
	}
	if got.V != 2 || got.Peer != "beta" || got.Sig == "" {
		t.Errorf("decoded %+v, want v 2, peer beta and a sig", got)
	}
	var old struct { // a version 3 node's view: no sig field
		V    int    `json:"v"`
		Type string `json:"type"`
		Node string `json:"node"`
		Peer string `json:"peer"`
	}
	if err := json.Unmarshal(body, &old); err != nil || old.V != 2 || old.Peer != "beta" {
		t.Errorf("read without sig: %+v, %v", old, err)
	}
	again, _ := EncodeMessage(got)
	if string(again) != string(body) {
		t.Errorf("EncodeMessage of the decoded message:\n got %s\nwant %s", again, body)
	}
}

// Two signing nodes see each other; a bye, hello or gone forged for alpha
// (unsigned, or signed with another key) changes nothing at beta and is
// counted, and so is a copy of a message alpha really sent. alpha's own
// bye still marks it gone.
func TestForgedDiscoveryRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		sa, sb, mallory := newSigner(t), newSigner(t), newSigner(t)
		keys := map[string]ed25519.PublicKey{"alpha": sa.public(), "beta": sb.public()}
		a := h.node("alpha", func(c *Config) { c.Signer = sa }, "cap.echo")
		b := h.node("beta", func(c *Config) { c.Signer = sb })
		a.SetSigningKeys(keys)
		b.SetSigningKeys(keys)
		h.start(a, b)
		h.advance(6 * time.Second)
		if p := b.peer(t, "alpha"); p.State != StateUp || !p.Signs || len(p.Capabilities) != 1 {
			t.Fatalf("beta's view of alpha: %+v, want up, signing, hosting echo", p)
		}
		rejected := func(reason string) float64 {
			return value(t, b.m.rejected.WithLabelValues(reason))
		}
		started := b.peer(t, "alpha").StartedAt
		forged := []struct {
			name, key string
			body      []byte
			reason    string
		}{
			{"unsigned bye", TypeBye, good(Message{V: 1, Type: TypeBye, Node: "alpha", StartedAt: started, Seq: 1 << 40}), reasonUnsigned},
			{"bye signed by another key", TypeBye, signed(mallory, Message{V: 1, Type: TypeBye, Node: "alpha", StartedAt: started, Seq: 1 << 40}), reasonForged},
			{"hello with no capabilities", TypeHello, good(Message{V: 1, Type: TypeHello, Node: "alpha", StartedAt: started, Seq: 1 << 40, Proto: 3}), reasonUnsigned},
			{"bye of a later run", TypeBye, signed(mallory, Message{V: 1, Type: TypeBye, Node: "alpha", StartedAt: started.Add(time.Hour), Seq: 1}), reasonForged},
		}
		for _, f := range forged {
			before := rejected(f.reason)
			b.HandleSystem(f.key, f.body, "alpha")
			h.settle()
			if got := rejected(f.reason); got != before+1 {
				t.Errorf("%s: rejected{reason=%s} %v, want %v", f.name, f.reason, got, before+1)
			}
			if p := b.peer(t, "alpha"); p.State != StateUp || len(p.Capabilities) != 1 || !p.StartedAt.Equal(started) {
				t.Fatalf("after a forged %s: beta's view of alpha %+v, want up with echo, same run", f.name, p)
			}
		}
		if _, gone := b.link.Gone()["alpha"]; gone {
			t.Error("beta marked alpha gone after forged messages")
		}

		// A copy of a message alpha really signed: refused as replayed.
		a.link.mu.Lock()
		var hb []byte
		for i, k := range a.link.sent {
			if k == "sys."+TypeHeartbeat {
				hb = a.link.bodies[i]
			}
		}
		a.link.mu.Unlock()
		if hb == nil {
			t.Fatal("alpha sent no heartbeat")
		}
		before := rejected(reasonReplayed)
		b.HandleSystem(TypeHeartbeat, hb, "alpha")
		if got := rejected(reasonReplayed); got != before+1 {
			t.Errorf("a replayed heartbeat: rejected{reason=replayed} %v, want %v", got, before+1)
		}

		// A gone about alpha, said by beta's peer gamma (an older node,
		// without a key): beta probes alpha itself and keeps it up.
		h.node("gamma", nil)
		b.HandleSystem(TypeGone, good(Message{V: 2, Type: TypeGone, Node: "gamma", Peer: "alpha", StartedAt: time.Now().UTC(), Seq: 1, Proto: 3}), "gamma")
		h.settle()
		if p := b.peer(t, "alpha"); p.State != StateUp {
			t.Errorf("after gamma's gone about alpha: beta's view %q, want up (the broker routes to alpha)", p.State)
		}

		// The control: alpha's own bye marks it gone.
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		h.settle()
		if p := b.peer(t, "alpha"); p.State != StateGone || p.Reason != reasonLeft {
			t.Errorf("after alpha's own bye: beta's view %+v, want gone (left)", p)
		}
	})
}

// A node whose record has no signing key yet (an older version) keeps
// working with signing peers; once its key is in the bindings, its
// unsigned messages are refused.
func TestUnsignedAcceptedUntilKeyPublished(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		sb := newSigner(t)
		old := h.node("old", nil, "cap.legacy") // signs nothing
		b := h.node("beta", func(c *Config) { c.Signer = sb })
		b.SetSigningKeys(map[string]ed25519.PublicKey{"beta": sb.public()})
		h.start(old, b)
		h.advance(6 * time.Second)
		if p := b.peer(t, "old"); p.State != StateUp || p.Signs {
			t.Fatalf("beta's view of the older node: %+v, want up, not signing", p)
		}
		if p := old.peer(t, "beta"); p.State != StateUp {
			t.Fatalf("the older node's view of beta: %+v, want up", p)
		}
		// The older node is upgraded in place: its record now has a key
		// but it does not sign yet (say, an impostor with its name).
		other := newSigner(t)
		b.SetSigningKeys(map[string]ed25519.PublicKey{"beta": sb.public(), "old": other.public()})
		before := value(t, b.m.rejected.WithLabelValues(reasonUnsigned))
		h.advance(6 * time.Second)
		if got := value(t, b.m.rejected.WithLabelValues(reasonUnsigned)); got <= before {
			t.Errorf("unsigned messages from a node with a key: rejected{reason=unsigned} %v, want more than %v", got, before)
		}
	})
}
