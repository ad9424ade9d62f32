package meshtest

import (
	"net/url"
	"testing"

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
