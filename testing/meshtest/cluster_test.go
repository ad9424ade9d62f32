package meshtest_test

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/testing/meshtest"
)

// TestRabbitCluster starts a three-node cluster, checks that a queue
// declared on one node is a quorum queue with a member on every node, and
// that the cluster goes on when a node is killed and takes it back when
// it restarts.
func TestRabbitCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a RabbitMQ cluster")
	}
	c := meshtest.NewRabbitCluster(t)
	vhost := c.Vhost(t)
	urls := c.URLs(vhost)
	conn, err := amqp.Dial(urls[1])
	if err != nil {
		t.Fatalf("dial node 1: %v", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("q", true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatalf("declare: %v", err)
	}
	conn.Close()
	q := c.Queue(t, vhost, "q")
	if q.Type != "quorum" || len(q.Members) != c.Size() {
		t.Fatalf("got queue type %q with members %v, want quorum on %d nodes", q.Type, q.Members, c.Size())
	}
	leader := c.Leader(t, vhost, "q")
	c.Kill(t, leader)
	// Another node answers for the queue and takes messages.
	other := (leader + 1) % c.Size()
	conn, err = amqp.Dial(urls[other])
	if err != nil {
		t.Fatalf("dial node %d: %v", other, err)
	}
	defer conn.Close()
	ch, err = conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclarePassive("q", true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatalf("queue after killing its leader: %v", err)
	}
	c.Start(t, leader)
	deadline := time.Now().Add(60 * time.Second)
	for {
		q = c.Queue(t, vhost, "q")
		if len(q.Online) == c.Size() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("got online members %v after restart, want %d", q.Online, c.Size())
		}
		time.Sleep(200 * time.Millisecond)
	}
}
