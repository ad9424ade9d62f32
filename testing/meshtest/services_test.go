package meshtest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/testing/meshtest"
)

// roundTrip declares a queue on url, publishes one message with a confirm
// and consumes it back.
func roundTrip(t *testing.T, url, body string) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("confirm mode: %v", err)
	}
	q, err := ch.QueueDeclare("roundtrip", true, false, false, false, nil)
	if err != nil {
		t.Fatalf("declare queue: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q.Name, true, false,
		amqp.Publishing{Body: []byte(body), DeliveryMode: amqp.Persistent})
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	if ok, err := dc.WaitContext(ctx); err != nil || !ok {
		t.Fatalf("publish confirm: got ack=%v err=%v, want ack", ok, err)
	}
	deliveries, err := ch.ConsumeWithContext(ctx, q.Name, "", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	select {
	case d := <-deliveries:
		if string(d.Body) != body {
			t.Fatalf("got body %q, want %q", d.Body, body)
		}
		if err := d.Ack(false); err != nil {
			t.Fatalf("ack: %v", err)
		}
	case <-ctx.Done():
		t.Fatalf("no delivery within the deadline")
	}
}

func TestRabbitVhostRoundTrip(t *testing.T) {
	t.Parallel() // its broker's boot overlaps the other tests' boots
	r := meshtest.RabbitMQ(t)
	a, b := r.Vhost(t), r.Vhost(t)
	if a == b {
		t.Fatalf("got the same vhost URL twice: %s", a)
	}
	roundTrip(t, a, "hello a")
	roundTrip(t, b, "hello b")

	// Vhosts are isolated: the queue declared on a holds nothing for b.
	conn, err := amqp.Dial(b)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	q, err := ch.QueueDeclarePassive("roundtrip", true, false, false, false, nil)
	if err != nil {
		t.Fatalf("passive declare: %v", err)
	}
	if q.Messages != 0 {
		t.Fatalf("got %d messages in vhost b, want 0", q.Messages)
	}
}

func TestPostgresDatabase(t *testing.T) {
	p := meshtest.Postgres(t)
	url := p.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE TABLE kv (k text PRIMARY KEY, v int)"); err != nil {
		t.Fatalf("create table: %v", err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO kv VALUES ('a', 42)"); err != nil {
		t.Fatalf("insert: %v", err)
	}
	var v int
	if err := conn.QueryRow(ctx, "SELECT v FROM kv WHERE k = 'a'").Scan(&v); err != nil {
		t.Fatalf("select: %v", err)
	}
	if v != 42 {
		t.Fatalf("got %d, want 42", v)
	}
	var db string
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		t.Fatalf("current_database: %v", err)
	}
	if want := fmt.Sprintf("/%s?", db); !strings.Contains(url, want) {
		t.Fatalf("got database %q, want the one in %s", db, url)
	}
}
