package bridge_test

import (
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/nats-io/nats.go"
)

// A broker resource alarm blocks the connections that publish. The node's
// acks must not be blocked with them: commands already queued are still
// consumed and acked, so the queues that would clear the alarm drain, and
// the status says the link is blocked and why.
func TestAlarmBlocksPublishingButNotAcks(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: needs RabbitMQ")
	}
	t.Parallel()
	r := meshtest.NewRabbitMQ(t) // private: the alarm holds for the whole broker
	const stage, total = "alarmed", 6
	n := newNode(t, "alarmnode", r.URL(), func(c *bridge.Config) {
		c.Stages = []string{stage}
		c.Prefetch = 2 // the broker delivers the rest only once these are acked
		c.CommandTimeout = time.Minute
	})
	n.waitConnected(t)
	ch := meshtest.Channel(t, r.URL())
	meshtest.WaitFor(t, 15*time.Second, "a consumer on cmd."+stage, func() bool {
		q, err := ch.QueueDeclarePassive("cmd."+stage, true, false, false, false, nil)
		return err == nil && q.Consumers == 1
	})
	for i := range total {
		m := n.submit(t, stage, []byte{byte(i)}, nil)
		if got := m.Header.Get(codec.HeaderAccepted); got != "broker" {
			t.Fatalf("command %d accepted by %q, want broker", i, got)
		}
	}

	r.RaiseMemoryAlarm(t)
	// Anything the node publishes now blocks its publishing connection.
	if err := n.client.Publish("evt.alarm", []byte("x")); err != nil {
		t.Fatal(err)
	}
	meshtest.WaitFor(t, 30*time.Second, "link blocked", func() bool { return n.b.Status().Broker.State == bridge.StateBlocked })

	seen := map[string]bool{}
	seenCh := make(chan string, 64)
	sub, err := n.client.Subscribe("work."+stage, func(m *nats.Msg) {
		seenCh <- m.Header.Get(codec.HeaderMsgID)
		_ = m.Respond(nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	timeout := time.After(30 * time.Second)
	for len(seen) < total {
		select {
		case id := <-seenCh:
			seen[id] = true
		case <-timeout:
			t.Fatalf("handler saw %d of %d commands while publishing was blocked, want all: acks stall with publishing", len(seen), total)
		}
	}
	st := n.b.Status().Broker
	if st.State != bridge.StateBlocked {
		t.Fatalf("got state %q, want %q while the alarm holds", st.State, bridge.StateBlocked)
	}
	if !strings.Contains(st.Reason, "memory") || !strings.Contains(st.Blocked, "memory") {
		t.Fatalf("got reason %q, blocked %q: want the broker's reason (memory)", st.Reason, st.Blocked)
	}
	r.ClearMemoryAlarm(t)
	n.waitConnected(t)
	if st := n.b.Status().Broker; st.Blocked != "" {
		t.Fatalf("got blocked %q after the alarm cleared, want empty", st.Blocked)
	}
}
