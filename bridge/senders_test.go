package bridge

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

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
		f := codec.AsForged(err)
		switch {
		case c.cause == "" && err != nil:
			t.Errorf("%s: got %v, want accepted", BrokerUser(c.node, c.gen), err)
		case c.cause != "" && (f == nil || f.Cause != c.cause):
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
	for _, kind := range []string{codec.TypeRequest, codec.TypeReply, codec.TypeCommand, codec.TypeEvent, codec.TypeSystem} {
		d := goodDelivery(kind)
		ad := &amqp.Delivery{Type: d.Type, RoutingKey: d.RoutingKey, MessageId: d.MessageId, CorrelationId: d.CorrelationId,
			ReplyTo: d.ReplyTo, Headers: d.Headers, Body: d.Body}
		ad.UserId = BrokerUser("alpha", 1)
		if _, err := s.decode(kind, ad); err != nil {
			t.Errorf("%s from %s: got %v, want accepted", kind, ad.UserId, err)
		}
		ad.UserId = BrokerUser("alpha", 9)
		if _, err := s.decode(kind, ad); !codec.IsForged(err) || !strings.Contains(err.Error(), "generation 9") {
			t.Errorf("%s from %s: got %v, want forged (generation 9)", kind, ad.UserId, err)
		}
		bare := &amqp.Delivery{Type: kind, RoutingKey: ad.RoutingKey}
		if _, err := s.decode(kind, bare); codec.AsForged(err) == nil || codec.AsForged(err).Cause != causeNoNodeUser {
			t.Errorf("%s without user_id nor headers: got %v, want forged (%s)", kind, err, causeNoNodeUser)
		}
	}
}

// A system message or a request from a generation newer than the bindings
// list waits for them: the node asks for its bindings again (once a
// second however many wait), and the delivery goes on as soon as they
// list the generation. One of a generation the bindings never list is
// refused after bindingLag; past maxHeldForRotation, at once.
func TestHeldForRotation(t *testing.T) {
	var asked atomic.Int32
	b := &Bridge{cfg: Config{MaxPayload: 1 << 10}}
	b.cfg.OnNewerGeneration = func() {
		asked.Add(1)
		time.AfterFunc(100*time.Millisecond, func() { b.SetSenderGenerations(map[string][]int{"alpha": {1, 2}, "gamma": {1}}) })
	}
	b.SetSenderGenerations(map[string][]int{"alpha": {1}, "gamma": {1}})
	ctx, cancel := context.WithCancel(context.Background())
	s := &session{b: b, user: BrokerUser("gamma", 1), perNode: true, ctx: ctx}
	defer func() {
		cancel()
		s.workers.CloseAndWait()
	}()
	delivery := func(gen int) *amqp.Delivery {
		d := goodDelivery(codec.TypeSystem)
		return &amqp.Delivery{Type: d.Type, RoutingKey: d.RoutingKey, MessageId: d.MessageId, Headers: d.Headers, Body: d.Body,
			UserId: BrokerUser("alpha", gen)}
	}
	type outcome struct {
		err   error
		after time.Duration
	}
	hold := func(d *amqp.Delivery) (<-chan outcome, bool) {
		got := make(chan outcome, 1)
		start := time.Now()
		_, err := s.decode(codec.TypeSystem, d)
		took := s.holdForRotation(err, d, func(d *amqp.Delivery) {
			_, err := s.decode(codec.TypeSystem, d)
			got <- outcome{err, time.Since(start)}
		})
		return got, took
	}

	// The control: a generation the bindings list goes on at once.
	if _, err := s.decode(codec.TypeSystem, delivery(1)); err != nil {
		t.Fatalf("generation 1: %v, want accepted", err)
	}
	if s.holdForRotation(nil, delivery(1), nil) {
		t.Fatal("an accepted delivery was held")
	}
	first, took := hold(delivery(2))
	second, took2 := hold(delivery(2))
	if !took || !took2 {
		t.Fatal("a delivery of a newer generation was not held")
	}
	for _, c := range []<-chan outcome{first, second} {
		select {
		case o := <-c:
			if o.err != nil || o.after > time.Second {
				t.Fatalf("held delivery: %v after %v, want accepted once the bindings list generation 2 (100 ms)", o.err, o.after)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the held delivery was never given back")
		}
	}
	if n := asked.Load(); n != 1 {
		t.Fatalf("bindings asked for %d times for two deliveries within a second, want once", n)
	}

	// Generation 9 is never listed: refused after bindingLag.
	never, _ := hold(delivery(9))
	select {
	case o := <-never:
		if f := codec.AsForged(o.err); f == nil || f.Cause != causeNewerGeneration || o.after < bindingLag {
			t.Fatalf("generation 9: %v after %v, want refused as %s after %v", o.err, o.after, causeNewerGeneration, bindingLag)
		}
	case <-time.After(bindingLag + 5*time.Second):
		t.Fatal("the delivery of generation 9 was never given back")
	}

	// Bounded: past maxHeldForRotation, refused at once.
	s.con.heldForRotation.Store(maxHeldForRotation)
	if _, took := hold(delivery(9)); took {
		t.Fatalf("held a delivery with %d held already", maxHeldForRotation)
	}
	s.con.heldForRotation.Store(0)
}
