package meshtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/testing/meshtest"
)

// TestRabbitStopKillStart stops a private broker gracefully, starts it again,
// kills it, and starts it again; a durable queue with a persistent message
// survives, ports stay the same, and a client reconnects each time.
func TestRabbitStopKillStart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and restarts a private broker")
	}
	t.Parallel() // its broker's boot overlaps the other tests' boots
	r := meshtest.NewRabbitMQ(t)
	url := r.Vhost(t)
	port := r.Port()

	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	if _, err := ch.QueueDeclare("kept", true, false, false, false, nil); err != nil {
		t.Fatalf("declare: %v", err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("confirm: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", "kept", true, false,
		amqp.Publishing{Body: []byte("persisted"), DeliveryMode: amqp.Persistent})
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	if ok, err := dc.WaitContext(ctx); err != nil || !ok {
		t.Fatalf("confirm: got ack=%v err=%v, want ack", ok, err)
	}

	r.Stop(t)
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatalf("connection not closed after broker stop")
	}
	if c, err := amqp.Dial(url); err == nil {
		c.Close()
		t.Fatalf("dial a stopped broker: got a connection, want an error")
	}
	r.Start(t)
	if r.Port() != port {
		t.Fatalf("got port %d after restart, want %d", r.Port(), port)
	}
	if n := queueDepth(t, url, "kept"); n != 1 {
		t.Fatalf("after stop/start: got %d messages in kept, want 1", n)
	}

	r.Kill(t)
	if c, err := amqp.Dial(url); err == nil {
		c.Close()
		t.Fatalf("dial a killed broker: got a connection, want an error")
	}
	r.Start(t)
	if n := queueDepth(t, url, "kept"); n != 1 {
		t.Fatalf("after kill/start: got %d messages in kept, want 1", n)
	}
}

// queueDepth connects to url and returns the number of ready messages in q.
func queueDepth(t *testing.T, url, q string) int {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("reconnect: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("passive declare %s: %v", q, err)
	}
	return info.Messages
}

// TestPostgresStopKillStart stops a private server, starts it again, kills
// it, and starts it again; committed rows survive and clients reconnect.
func TestPostgresStopKillStart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and restarts a private server")
	}
	p := meshtest.NewPostgres(t)
	url := p.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE TABLE t (v int); INSERT INTO t VALUES (1)"); err != nil {
		t.Fatalf("setup: %v", err)
	}

	p.Stop(t)
	if err := conn.Ping(ctx); err == nil {
		t.Fatalf("ping after stop: got nil, want an error")
	}
	p.Start(t)
	if n := countRows(ctx, t, url); n != 1 {
		t.Fatalf("after stop/start: got %d rows, want 1", n)
	}

	p.Kill(t)
	if c, err := pgx.Connect(ctx, url); err == nil {
		c.Close(ctx)
		t.Fatalf("connect to a killed server: got a connection, want an error")
	}
	p.Start(t)
	if n := countRows(ctx, t, url); n != 1 {
		t.Fatalf("after kill/start: got %d rows, want 1", n)
	}
}

func countRows(ctx context.Context, t *testing.T, url string) int {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("reconnect: %v", err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil {
		t.Fatalf("count: %v", err)
	}
	return n
}
