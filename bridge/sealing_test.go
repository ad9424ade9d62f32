package bridge

import (
	"bytes"
	"strings"
	"testing"
	"time"

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
func (b *Bridge) open(kind string, d amqp.Delivery) (*envelope, error) {
	env, err := decode(kind, fromAMQP(&d), b.maxPayload())
	if err != nil {
		return nil, err
	}
	return env, b.unseal(env, &d)
}

func TestSealRoundTripAndRefusals(t *testing.T) {
	b, ring := sealTestBridge(t)
	secret := "front-door-code-1234"
	out := &outgoing{exchange: exchangeMesh, key: requestKey("beta", "vault"), kind: typeRequest, msgID: "c1", corrID: "c1",
		replyTo: replyQueue("alpha"), expire: 3 * time.Second, at: time.Now(),
		header: nats.Header{"X-Secret": {secret}, "Content-Type": {"text/" + secret}, "X-Two": {"a", "b"}},
		meta:   map[string]string{HeaderTimeout: "3s", HeaderCapability: "vault"}, body: []byte(secret)}
	p, err := out.publishing("alpha", "guest", ring)
	if err != nil {
		t.Fatal(err)
	}
	d := deliver(p, out.key)
	if bytes.Contains(d.Body, []byte(secret)) || strings.Contains(d.ContentType, secret) || d.Headers["X-Secret"] != nil || d.Headers[HeaderTimeout] != nil {
		t.Fatalf("readable: %v %q %q", d.Headers, d.ContentType, d.Body)
	}
	env, err := b.open(typeRequest, d)
	if err != nil {
		t.Fatal(err)
	}
	if string(env.body) != secret || env.header.Get("X-Secret") != secret || env.header.Get("Content-Type") != "text/"+secret ||
		len(env.header["X-Two"]) != 2 || env.timeout != 3*time.Second || env.origin != "alpha" || env.name != "vault" {
		t.Fatalf("opened: body %q header %v timeout %v origin %q name %q", env.body, env.header, env.timeout, env.origin, env.name)
	}

	refused := func(name, reason string, edit func(*amqp.Delivery)) {
		t.Helper()
		c := deliver(p, out.key)
		c.Body = bytes.Clone(p.Body)
		c.Headers = amqp.Table{}
		for k, v := range p.Headers {
			c.Headers[k] = v
		}
		edit(&c)
		_, err := b.open(typeRequest, c)
		ue := asUnseal(err)
		if ue == nil || ue.reason != reason {
			t.Errorf("%s: got %v, want refused as %s", name, err, reason)
		}
	}
	refused("flipped byte", unsealTampered, func(c *amqp.Delivery) { c.Body[20] ^= 1 })
	refused("other capability", unsealTampered, func(c *amqp.Delivery) { c.RoutingKey = requestKey("beta", "other") })
	refused("other node", unsealTampered, func(c *amqp.Delivery) { c.RoutingKey = requestKey("gamma", "vault") })
	refused("other origin", unsealTampered, func(c *amqp.Delivery) { c.Headers[HeaderOrigin] = "mallory" })
	refused("other correlation id", unsealTampered, func(c *amqp.Delivery) { c.CorrelationId = "c2" })
	refused("unknown key", unsealUnknownKey, func(c *amqp.Delivery) { c.Headers[HeaderKey] = "k-other" })
	refused("not sealed", unsealNotSealed, func(c *amqp.Delivery) { delete(c.Headers, HeaderKey) })

	// Headers added outside the seal never reach the program.
	c := deliver(p, out.key)
	c.Headers = amqp.Table{"X-Injected": "yes"}
	for k, v := range p.Headers {
		c.Headers[k] = v
	}
	env, err = b.open(typeRequest, c)
	if err != nil || env.header.Get("X-Injected") != "" {
		t.Fatalf("injected header: %v %v", env, err)
	}

	// Past its deadline: refused as expired.
	late := *out
	late.at = time.Now().Add(-time.Minute)
	p2, err := late.publishing("alpha", "guest", ring)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.open(typeRequest, deliver(p2, out.key)); asUnseal(err) == nil || asUnseal(err).reason != unsealExpired {
		t.Fatalf("late request: got %v, want expired", err)
	}

	// No key to seal with: publishing says so.
	if _, err := out.publishing("alpha", "guest", &seal.Keyring{}); err == nil {
		t.Fatal("sealed without a key")
	}
}

// FuzzUnseal opens validly sealed messages of arbitrary content: the
// parser never panics and what it accepts is valid.
func FuzzUnseal(f *testing.F) {
	b, ring := sealTestBridge(f)
	f.Add([]byte{sealedVersion, 0, 0, 0, 'x'})
	f.Add([]byte{sealedVersion, 0, 0, 1, 1, 'K', 1, 1, 'v'})
	f.Add([]byte{sealedVersion, 0, 0, 200})
	f.Add([]byte{9})
	f.Fuzz(func(t *testing.T, plaintext []byte) {
		sl, _ := ring.Sealer()
		key := commandKey("work")
		ad := sealAD(nil, typeCommand, key, "m1", "", "", "alpha", sl.ID(), "")
		d := amqp.Delivery{Type: typeCommand, MessageId: "m1", RoutingKey: key,
			Headers: amqp.Table{HeaderOrigin: "alpha", HeaderKey: sl.ID()}, Body: sl.Seal(nil, ad, plaintext)}
		env, err := b.open(typeCommand, d)
		if err != nil {
			if asUnseal(err) == nil {
				t.Fatalf("not an unseal error: %v", err)
			}
			return
		}
		for k, vs := range env.header {
			if !wire.ValidHeaderKey(k) || hasPrefixFold(k, headerPrefixMeshbox) {
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
	out := &outgoing{exchange: exchangeMesh, key: commandKey("resize"), kind: typeCommand, msgID: newID(), persist: true,
		at: time.Now(), header: nats.Header{"X-Trace": {"t-1"}}, body: make([]byte, 256)}
	b.Run("plain", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			p, _ := out.publishing("alpha", "node.alpha.g1", nil)
			d := deliver(p, out.key)
			if _, err := decode(typeCommand, fromAMQP(&d), DefaultMaxPayload); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("sealed", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			p, err := out.publishing("alpha", "node.alpha.g1", ring)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := br.open(typeCommand, deliver(p, out.key)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
