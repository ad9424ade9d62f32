package bridge

import (
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A node's broker user speaks for it only in a generation the bindings
// list; until they list any, every generation does.
func TestSenderGenerations(t *testing.T) {
	b := &Bridge{}
	if err := b.peers.senders.check("alpha", 9); err != nil {
		t.Fatalf("no generations loaded: got %v, want any generation accepted", err)
	}
	b.SetSenderGenerations(map[string][]int{"alpha": {3, 2}, "beta": {1}, "hub": nil})
	for _, c := range []struct {
		node  string
		gen   int
		cause string // "": accepted
	}{
		{"alpha", 2, ""},
		{"alpha", 3, ""}, // a rotation: both
		{"alpha", 1, causeStaleGeneration},
		{"alpha", 4, causeNewerGeneration},
		{"alpha", 9, causeNewerGeneration},
		{"beta", 1, ""},
		{"beta", 2, causeNewerGeneration},
		{"hub", 1, causeStaleGeneration}, // a record without broker users
		{"gamma", 1, causeUnknownNode},
	} {
		err := b.peers.senders.check(c.node, c.gen)
		f := asForged(err)
		switch {
		case c.cause == "" && err != nil:
			t.Errorf("%s: got %v, want accepted", BrokerUser(c.node, c.gen), err)
		case c.cause != "" && (f == nil || f.cause != c.cause):
			t.Errorf("%s: got %v, want forged (%s)", BrokerUser(c.node, c.gen), err, c.cause)
		}
	}
	b.SetSenderGenerations(nil)
	if err := b.peers.senders.check("gamma", 1); err != nil {
		t.Errorf("generations unloaded again: got %v, want any accepted", err)
	}
}

// Every shape is checked for its generation, and a delivery without a
// node's user_id is forged in a per-node mesh even when it is malformed
// too (no origin header, no correlation id): counted under its real cause.
func TestSessionDecodeGenerations(t *testing.T) {
	b := &Bridge{cfg: Config{MaxPayload: 1 << 10}}
	b.SetSenderGenerations(map[string][]int{"alpha": {1}, "gamma": {1}})
	s := &session{b: b, user: BrokerUser("gamma", 1), perNode: true}
	for _, kind := range []string{typeRequest, typeReply, typeCommand, typeEvent, typeSystem} {
		d := goodDelivery(kind)
		ad := &amqp.Delivery{Type: d.Type, RoutingKey: d.RoutingKey, MessageId: d.MessageId, CorrelationId: d.CorrelationId,
			ReplyTo: d.ReplyTo, Headers: d.Headers, Body: d.Body}
		ad.UserId = BrokerUser("alpha", 1)
		if _, err := s.decode(kind, ad); err != nil {
			t.Errorf("%s from %s: got %v, want accepted", kind, ad.UserId, err)
		}
		ad.UserId = BrokerUser("alpha", 9)
		if _, err := s.decode(kind, ad); !isForged(err) || !strings.Contains(err.Error(), "generation 9") {
			t.Errorf("%s from %s: got %v, want forged (generation 9)", kind, ad.UserId, err)
		}
		bare := &amqp.Delivery{Type: kind, RoutingKey: ad.RoutingKey}
		if _, err := s.decode(kind, bare); asForged(err) == nil || asForged(err).cause != causeNoNodeUser {
			t.Errorf("%s without user_id nor headers: got %v, want forged (%s)", kind, err, causeNoNodeUser)
		}
	}
}

// A forged delivery is logged once per cause and sender, and the senders
// remembered are bounded.
func TestForgedLogOncePerCauseAndSender(t *testing.T) {
	var l causeLog
	if !l.first("a/node.a.g9") || l.first("a/node.a.g9") {
		t.Fatal("the same cause and sender: want logged once")
	}
	if !l.first("b/node.a.g9") || !l.first("a/node.a.g8") {
		t.Fatal("another cause or sender: want logged")
	}
	for i := range 2 * maxLoggedCauses {
		l.first(BrokerUser("x", i+1))
	}
	if n := len(l.seen); n != maxLoggedCauses {
		t.Errorf("remembered %d, want at most %d", n, maxLoggedCauses)
	}
}
