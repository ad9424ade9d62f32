package bridge_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/testing/meshtest"
	amqp "github.com/rabbitmq/amqp091-go"
)

// TestClassicEventQueueMoved: a node of an older meshbox left a classic
// event queue holding events (a classic queue lives on one broker node,
// unreachable while that node is down). The node's next connection hands
// those events to its local subscribers in order and replaces the queue
// with a quorum queue, which then carries the events published after.
func TestClassicEventQueueMoved(t *testing.T) {
	vhost := testVhost(t)
	beta := newNode(t, "beta", vhost, nil)
	beta.waitConnected(t)

	// What an older meshbox declared for alpha.
	ch := meshtest.Channel(t, vhost)
	const week = int64(7 * 24 * time.Hour / time.Millisecond)
	if _, err := ch.QueueDeclare("node.alpha.events", true, false, false, false, amqp.Table{"x-expires": week}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("node.alpha.events", "evt.#", "mesh", false, nil); err != nil {
		t.Fatal(err)
	}
	const waiting = 20
	for i := range waiting {
		if _, err := beta.client.Request("evt.moved", []byte(strconv.Itoa(i)), 5*time.Second); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	meshtest.WaitFor(t, 10*time.Second, "the events in the classic queue", func() bool {
		q, err := ch.QueueDeclarePassive("node.alpha.events", true, false, false, false, nil)
		return err == nil && q.Messages == waiting
	})

	alpha := buildNode(t, "alpha", vhost, nil)
	rec := subscribeEvents(t, alpha, "evt.moved")
	if err := alpha.b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	alpha.waitConnected(t)
	alpha.waitEventsBound(t, "evt.moved")
	meshtest.WaitFor(t, 10*time.Second, "the waiting events at alpha", func() bool { return rec.len() >= waiting })

	// The queue is a quorum queue now: declaring it as one succeeds.
	if _, err := ch.QueueDeclare("node.alpha.events", true, false, false, false,
		amqp.Table{"x-queue-type": "quorum", "x-expires": week}); err != nil {
		t.Fatalf("node.alpha.events is not the quorum queue: %v", err)
	}
	const after = 5
	for i := range after {
		if _, err := beta.client.Request("evt.moved", []byte(strconv.Itoa(waiting+i)), 5*time.Second); err != nil {
			t.Fatalf("event %d: %v", waiting+i, err)
		}
	}
	meshtest.WaitFor(t, 10*time.Second, "the later events at alpha", func() bool { return rec.len() >= waiting+after })
	time.Sleep(500 * time.Millisecond) // duplicates would arrive now
	got := rec.all()
	if len(got) != waiting+after {
		t.Fatalf("alpha got %d events, want %d", len(got), waiting+after)
	}
	for i, m := range got {
		if string(m.Data) != strconv.Itoa(i) {
			t.Fatalf("event %d at alpha is %q, want %d: in the order they were published", i, m.Data, i)
		}
	}
}

// TestQuorumGroupSizeFollowsBrokerList: with three broker URLs a node
// declares its quorum queues with three replicas
// (x-quorum-initial-group-size), with one URL without; a node whose
// broker setting changed finds its event queue declared the other way
// and uses it as it is, and the queues declared with three URLs carry
// the size.
func TestQuorumGroupSizeFollowsBrokerList(t *testing.T) {
	vhost := testVhost(t)
	alpha := newNode(t, "alpha", vhost, nil) // one URL: no group size
	alpha.waitConnected(t)
	if err := alpha.b.Close(); err != nil {
		t.Fatal(err)
	}
	list := strings.Join([]string{closedBrokerURL(t, vhost), closedBrokerURL(t, vhost), vhost}, ",")
	again := newNode(t, "alpha", list, nil)
	again.waitConnected(t)
	beta := newNode(t, "beta", list, nil)
	beta.waitConnected(t)

	conn, err := amqp.Dial(vhost)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const week = int64(7 * 24 * time.Hour / time.Millisecond)
	for _, c := range []struct {
		queue string
		sized bool
	}{{"node.alpha.events", false}, {"node.beta.events", true}} {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		args := amqp.Table{"x-queue-type": "quorum", "x-expires": week}
		if c.sized {
			args["x-quorum-initial-group-size"] = int64(3)
		}
		if _, err := ch.QueueDeclare(c.queue, true, false, false, false, args); err != nil {
			t.Errorf("%s: declared with group size %v: %v", c.queue, c.sized, err)
			continue
		}
		ch.Close()
	}
}
