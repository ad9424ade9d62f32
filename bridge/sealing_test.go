package bridge

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/internal/wire"
)

func sealTestBridge(t testing.TB) (*Bridge, *seal.Keyring) {
	t.Helper()
	k := seal.NewContentKey()
	ring, err := seal.NewKeyring([]seal.ContentKey{k}, k.ID)
	if err != nil {
		t.Fatal(err)
	}
	return &Bridge{cfg: Config{Node: "beta", Keys: ring, MaxPayload: DefaultMaxPayload}}, ring
}

// deliver turns a publishing into the delivery a consumer would get.
func deliver(p amqp.Publishing, key string) amqp.Delivery {
	return amqp.Delivery{Headers: p.Headers, ContentType: p.ContentType, ContentEncoding: p.ContentEncoding,
		MessageId: p.MessageId, CorrelationId: p.CorrelationId, ReplyTo: p.ReplyTo, Type: p.Type,
		Timestamp: p.Timestamp, Expiration: p.Expiration, RoutingKey: key, Body: p.Body}
}

// open decodes and unseals d as kind, as session.decode does in a mesh on
// one credential.
func (b *Bridge) open(kind string, d amqp.Delivery) (*codec.Envelope, error) {
	env, err := codec.Decode(kind, codec.FromAMQP(&d), b.maxPayload())
	if err != nil {
		return nil, err
	}
	return env, b.unseal(env, &d)
}

func TestSealRoundTripAndRefusals(t *testing.T) {
	b, ring := sealTestBridge(t)
	secret := "front-door-code-1234"
	out := &codec.Outgoing{Exchange: codec.ExchangeMesh, Key: codec.RequestKey("beta", "vault"), Kind: codec.TypeRequest, MsgID: "c1", CorrID: "c1",
		ReplyTo: codec.ReplyQueue("alpha"), Expire: 3 * time.Second, At: time.Now(),
		Header: nats.Header{"X-Secret": {secret}, "Content-Type": {"text/" + secret}, "X-Two": {"a", "b"}},
		Meta:   map[string]string{codec.HeaderTimeout: "3s", codec.HeaderCapability: "vault"}, Body: []byte(secret)}
	p, err := out.Publishing("alpha", "guest", ring)
	if err != nil {
		t.Fatal(err)
	}
	d := deliver(p, out.Key)
	if bytes.Contains(d.Body, []byte(secret)) || strings.Contains(d.ContentType, secret) || d.Headers["X-Secret"] != nil || d.Headers[codec.HeaderTimeout] != nil {
		t.Fatalf("readable: %v %q %q", d.Headers, d.ContentType, d.Body)
	}
	env, err := b.open(codec.TypeRequest, d)
	if err != nil {
		t.Fatal(err)
	}
	if string(env.Body) != secret || env.Header.Get("X-Secret") != secret || env.Header.Get("Content-Type") != "text/"+secret ||
		len(env.Header["X-Two"]) != 2 || env.Timeout != 3*time.Second || env.Origin != "alpha" || env.Name != "vault" {
		t.Fatalf("opened: body %q header %v timeout %v origin %q name %q", env.Body, env.Header, env.Timeout, env.Origin, env.Name)
	}

	refused := func(name, reason string, edit func(*amqp.Delivery)) {
		t.Helper()
		c := deliver(p, out.Key)
		c.Body = bytes.Clone(p.Body)
		c.Headers = amqp.Table{}
		for k, v := range p.Headers {
			c.Headers[k] = v
		}
		edit(&c)
		_, err := b.open(codec.TypeRequest, c)
		ue := codec.AsUnseal(err)
		if ue == nil || ue.Reason != reason {
			t.Errorf("%s: got %v, want refused as %s", name, err, reason)
		}
	}
	refused("flipped byte", codec.UnsealTampered, func(c *amqp.Delivery) { c.Body[20] ^= 1 })
	refused("other capability", codec.UnsealTampered, func(c *amqp.Delivery) { c.RoutingKey = codec.RequestKey("beta", "other") })
	refused("other node", codec.UnsealTampered, func(c *amqp.Delivery) { c.RoutingKey = codec.RequestKey("gamma", "vault") })
	refused("other origin", codec.UnsealTampered, func(c *amqp.Delivery) { c.Headers[codec.HeaderOrigin] = "mallory" })
	refused("other correlation id", codec.UnsealTampered, func(c *amqp.Delivery) { c.CorrelationId = "c2" })
	refused("unknown key", codec.UnsealUnknownKey, func(c *amqp.Delivery) { c.Headers[codec.HeaderKey] = "k-other" })
	refused("not sealed", codec.UnsealNotSealed, func(c *amqp.Delivery) { delete(c.Headers, codec.HeaderKey) })

	// Headers added outside the seal never reach the program.
	c := deliver(p, out.Key)
	c.Headers = amqp.Table{"X-Injected": "yes"}
	for k, v := range p.Headers {
		c.Headers[k] = v
	}
	env, err = b.open(codec.TypeRequest, c)
	if err != nil || env.Header.Get("X-Injected") != "" {
		t.Fatalf("injected header: %v %v", env, err)
	}

	// Past its deadline: refused as expired.
	late := *out
	late.At = time.Now().Add(-time.Minute)
	p2, err := late.Publishing("alpha", "guest", ring)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.open(codec.TypeRequest, deliver(p2, out.Key)); codec.AsUnseal(err) == nil || codec.AsUnseal(err).Reason != codec.UnsealExpired {
		t.Fatalf("late request: got %v, want expired", err)
	}

	// No key to seal with: publishing says so.
	if _, err := out.Publishing("alpha", "guest", &seal.Keyring{}); err == nil {
		t.Fatal("sealed without a key")
	}
}

// FuzzUnseal opens validly sealed messages of arbitrary content: the
// parser never panics and what it accepts is valid.
func FuzzUnseal(f *testing.F) {
	b, ring := sealTestBridge(f)
	f.Add([]byte{codec.SealedVersion, 0, 0, 0, 'x'})
	f.Add([]byte{codec.SealedVersion, 0, 0, 1, 1, 'K', 1, 1, 'v'})
	f.Add([]byte{codec.SealedVersion, 0, 0, 200})
	f.Add([]byte{9})
	f.Fuzz(func(t *testing.T, plaintext []byte) {
		sl, _ := ring.Sealer()
		key := codec.CommandKey("work")
		ad := codec.SealAD(nil, codec.TypeCommand, key, "m1", "", "", "alpha", sl.ID(), "")
		d := amqp.Delivery{Type: codec.TypeCommand, MessageId: "m1", RoutingKey: key,
			Headers: amqp.Table{codec.HeaderOrigin: "alpha", codec.HeaderKey: sl.ID()}, Body: sl.Seal(nil, ad, plaintext)}
		env, err := b.open(codec.TypeCommand, d)
		if err != nil {
			if codec.AsUnseal(err) == nil {
				t.Fatalf("not an unseal error: %v", err)
			}
			return
		}
		for k, vs := range env.Header {
			if !wire.ValidHeaderKey(k) || codec.HasPrefixFold(k, codec.HeaderPrefixMeshbox) {
				t.Fatalf("accepted header key %q", k)
			}
			for _, v := range vs {
				if !wire.ValidHeaderValue(v) {
					t.Fatalf("accepted header value %q", v)
				}
			}
		}
	})
}

// BenchmarkPublishing compares building a command's AMQP message plain and
// sealed, and opening it again (allocations included).
func BenchmarkPublishing(b *testing.B) {
	br, ring := sealTestBridge(b)
	out := &codec.Outgoing{Exchange: codec.ExchangeMesh, Key: codec.CommandKey("resize"), Kind: codec.TypeCommand, MsgID: newID(), Persist: true,
		At: time.Now(), Header: nats.Header{"X-Trace": {"t-1"}}, Body: make([]byte, 256)}
	b.Run("plain", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			p, _ := out.Publishing("alpha", "node.alpha.g1", nil)
			d := deliver(p, out.Key)
			if _, err := codec.Decode(codec.TypeCommand, codec.FromAMQP(&d), DefaultMaxPayload); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("sealed", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			p, err := out.Publishing("alpha", "node.alpha.g1", ring)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := br.open(codec.TypeCommand, deliver(p, out.Key)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
