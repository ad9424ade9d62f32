package bridge

import (
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The origin is the node of the delivery's user_id whenever it is a node's
// broker user; the header counts only without one.
func TestDecodeOriginFromUserID(t *testing.T) {
	for _, kind := range []string{codec.TypeRequest, codec.TypeReply, codec.TypeCommand, codec.TypeEvent, codec.TypeSystem} {
		d := goodDelivery(kind) // Meshbox-Origin: alpha
		d.UserId = BrokerUser("beta", 3)
		e, err := codec.Decode(kind, d, 100)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		if e.Origin != "beta" || !e.Verified {
			t.Errorf("%s with user_id %s and header alpha: origin %q verified %v, want beta true", kind, d.UserId, e.Origin, e.Verified)
		}
		d.UserId = "guest"
		e, err = codec.Decode(kind, d, 100)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		if e.Origin != "alpha" || e.Verified {
			t.Errorf("%s with user_id guest: origin %q verified %v, want alpha (header) false", kind, e.Origin, e.Verified)
		}
	}
}

// A session on a node's own broker user drops every delivery that does not
// carry a node's user_id; one on a shared credential takes the header.
func TestSessionDecodeForged(t *testing.T) {
	b := &Bridge{cfg: Config{MaxPayload: 1 << 10}}
	d := &amqp.Delivery{Type: codec.TypeEvent, RoutingKey: "evt.t", MessageId: "m1", Headers: amqp.Table{codec.HeaderOrigin: "alpha"}}
	perNode := &session{b: b, user: BrokerUser("gamma", 1), perNode: true}
	for _, user := range []string{"", "guest", "admin", "node.alpha"} {
		d.UserId = user
		if _, err := perNode.decode(codec.TypeEvent, d); !codec.IsForged(err) {
			t.Errorf("per-node session, user_id %q: got %v, want forged", user, err)
		}
	}
	d.UserId = BrokerUser("alpha", 2)
	if e, err := perNode.decode(codec.TypeEvent, d); err != nil || e.Origin != "alpha" {
		t.Errorf("per-node session, node user: got %+v, %v", e, err)
	}
	shared := &session{b: b, user: "guest"}
	d.UserId = ""
	if e, err := shared.decode(codec.TypeEvent, d); err != nil || e.Origin != "alpha" {
		t.Errorf("shared credential, no user_id: got %+v, %v, want the header's origin", e, err)
	}
}

// A publisher cannot make a command look like a retry: x-delivery-count
// counts only on a delivery the broker marked redelivered.
func TestAttemptOnlyFromRedelivery(t *testing.T) {
	d := goodDelivery(codec.TypeCommand)
	d.Headers[codec.HeaderDeliveryCount] = int64(999)
	e, err := codec.Decode(codec.TypeCommand, d, 100)
	if err != nil {
		t.Fatal(err)
	}
	if e.Attempt != 1 {
		t.Errorf("first delivery with a forged x-delivery-count: attempt %d, want 1", e.Attempt)
	}
	d.Redelivered = true
	d.Headers[codec.HeaderDeliveryCount] = int64(4)
	if e, _ := codec.Decode(codec.TypeCommand, d, 100); e.Attempt != 5 {
		t.Errorf("redelivery counted 4: attempt %d, want 5", e.Attempt)
	}
}

// Every publish carries the connection's user as user_id, dead letters
// published as they are included.
func TestPublishingCarriesUserID(t *testing.T) {
	out := &codec.Outgoing{Exchange: codec.ExchangeMesh, Key: "evt.t", Kind: codec.TypeEvent, MsgID: "m1"}
	if p, _ := out.Publishing("alpha", "node.alpha.g1", nil); p.UserId != "node.alpha.g1" {
		t.Errorf("user_id %q, want node.alpha.g1", p.UserId)
	}
	raw := &codec.Outgoing{Raw: &amqp.Publishing{UserId: "node.beta.g1"}}
	if p, _ := raw.Publishing("alpha", "node.alpha.g1", nil); p.UserId != "node.alpha.g1" {
		t.Errorf("raw: user_id %q, want node.alpha.g1", p.UserId)
	}
}

// A reply is taken only by the node the request was sent to; a reply from
// another leaves the request open.
func TestPendingTakeFrom(t *testing.T) {
	r := &pendingRequests{m: map[string]*pendingRequest{}}
	r.add("c1", &pendingRequest{node: "beta"}, func() *time.Timer { return time.NewTimer(time.Hour) })
	if p, to := r.takeFrom("c1", "gamma"); p != nil || to != "beta" {
		t.Fatalf("reply from gamma: got %v, %q, want nil, beta", p, to)
	}
	if p, _ := r.takeFrom("c1", "beta"); p == nil {
		t.Fatal("reply from beta: request gone")
	}
	if p, to := r.takeFrom("c1", "beta"); p != nil || to != "" {
		t.Fatalf("second reply: got %v, %q, want nil, empty", p, to)
	}
}
