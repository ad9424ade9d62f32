package meshtest

import (
	"net/url"
	"testing"

	"github.com/meshbox/meshbox/internal/wire"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Dial opens a plain AMQP connection to amqpURL, as a test's own client
// (an operator, an adversary, a tap); tb's Cleanup closes it.
func Dial(tb testing.TB, amqpURL string) *amqp.Connection {
	tb.Helper()
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		tb.Fatalf("meshtest: dial %s: %v", redactURL(amqpURL), err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Channel opens a channel on a new connection to amqpURL (Dial); tb's
// Cleanup closes both.
func Channel(tb testing.TB, amqpURL string) *amqp.Channel {
	tb.Helper()
	ch, err := Dial(tb, amqpURL).Channel()
	if err != nil {
		tb.Fatalf("meshtest: open a channel on %s: %v", redactURL(amqpURL), err)
	}
	return ch
}

// redactURL is u without its password, for a failure message.
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(an AMQP URL that does not parse)"
	}
	return p.Redacted()
}

// Tap reads, on ch, a copy of what is published to the mesh exchange under
// any of keys: a server-named queue of ch's own, bound for each key,
// consumed with automatic acks. It goes with ch.
func Tap(tb testing.TB, ch *amqp.Channel, keys ...string) <-chan amqp.Delivery {
	tb.Helper()
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		tb.Fatalf("meshtest: tap: declare a queue: %v", err)
	}
	for _, key := range keys {
		if err := ch.QueueBind(q.Name, key, wire.MeshExchange, false, nil); err != nil {
			tb.Fatalf("meshtest: tap: bind %s: %v", key, err)
		}
	}
	ds, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		tb.Fatalf("meshtest: tap: consume: %v", err)
	}
	return ds
}
