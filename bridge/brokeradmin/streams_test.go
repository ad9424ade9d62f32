package brokeradmin_test

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/bridge/brokeradmin"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// TestDeclareStream: the admin makes a table's log, a stream queue with
// the retention rows asks for, bound to mesh; a node's own user, which
// may not make it, publishes into it through mesh and reads it back from
// its first offset. Declaring it again changes nothing; a queue of that
// name that is not a stream is refused, saying so.
func TestDeclareStream(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	r := meshtest.RabbitMQ(t)
	guestURL := r.Vhost(t)
	vhost := vhostOf(t, guestURL)
	ctx := context.Background()
	a, err := brokeradmin.Connect(ctx, r.AdminURL(), vhost, brokeradmin.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.DeclareMesh(ctx); err != nil {
		t.Fatal(err)
	}
	q := rows.QueueOf("jobs")
	args := rows.StreamArgs(rows.DefaultMaxAge, rows.DefaultMaxBytes)
	for i := range 2 {
		if err := a.DeclareStream(ctx, q, q, args); err != nil {
			t.Fatalf("declare %s (time %d): %v", q, i+1, err)
		}
	}
	if _, ok := args["x-queue-type"]; !ok || len(args) != 4 {
		t.Errorf("DeclareStream changed the arguments it was given: %v", args)
	}
	out := r.Ctl(t, "list_queues", "-p", vhost, "--no-table-headers", "--quiet", "name", "type", "arguments")
	line := ""
	for l := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(l, q+"\t") {
			line = l
		}
	}
	if !strings.Contains(line, "stream") || !strings.Contains(line, "2592000s") || !strings.Contains(line, "1073741824") {
		t.Errorf("queue %s on the broker: %q, want a stream with 30 days and 1 GiB of retention (all queues:\n%s)", q, line, out)
	}

	cred, err := a.CreateGeneration(ctx, "alpha", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.DeleteGeneration(context.Background(), "alpha", 1) })
	conn := dialAs(t, r, vhost, cred)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "mesh", q, true, false, amqp.Publishing{Body: []byte("sealed change")})
	if err != nil {
		t.Fatalf("alpha publishes into %s: %v", q, err)
	}
	if ok, err := conf.WaitContext(ctx); !ok || err != nil {
		t.Fatalf("alpha's publish into %s not confirmed: %v %v", q, ok, err)
	}
	if err := ch.Qos(10, 0, false); err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume(q, "", false, false, false, false, amqp.Table{"x-stream-offset": "first"})
	if err != nil {
		t.Fatalf("alpha reads %s: %v", q, err)
	}
	select {
	case d := <-ds:
		if string(d.Body) != "sealed change" {
			t.Errorf("read %q from %s", d.Body, q)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("nothing read from %s", q)
	}

	// A classic queue in the way.
	guest, err := amqp.Dial(guestURL)
	if err != nil {
		t.Fatal(err)
	}
	defer guest.Close()
	gch, err := guest.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gch.QueueDeclare("rows.old", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	err = a.DeclareStream(ctx, "rows.old", "rows.old", args)
	if err == nil || !strings.Contains(err.Error(), "not a stream") {
		t.Errorf("declare over a classic queue: got %v, want it refused as not a stream", err)
	}
}
