package e2e

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
	"github.com/nats-io/nats.go"
)

// A program on node A that hosts capability X (cap.X) and stage X
// (work.X) is reachable from node B with both at once: from the moment
// cap.X answers on B, a command to X submitted on B is accepted, never
// refused with 503 "no node hosts stage". The node advertises a program's
// capabilities only after the bridge declared its stages' queues.
func TestCapabilityAndStageReachableTogether(t *testing.T) {
	amqpURL := meshtest.RabbitMQ(t).Vhost(t)
	a := discoveryNode(t, "host-a", amqpURL)
	b := discoveryNode(t, "caller-b", amqpURL)
	meshtest.WaitStatus(t, b.HTTPURL(), 10*time.Second, "B sees A up", func(v appliance.Status) bool { return peer(v, "host-a").State == "up" })
	caller := dialNode(t, b)

	for round := range 3 {
		name := fmt.Sprintf("together%d", round)
		handled := make(chan string, 1)
		prog := dialNode(t, a)
		if _, err := prog.QueueSubscribe("cap."+name, "q", func(m *nats.Msg) { _ = m.Respond([]byte("from A")) }); err != nil {
			t.Fatal(err)
		}
		if _, err := prog.QueueSubscribe("work."+name, "meshbox", func(m *nats.Msg) {
			_ = m.Respond(nil)
			select {
			case handled <- string(m.Data):
			default:
			}
		}); err != nil {
			t.Fatal(err)
		}
		if err := prog.Flush(); err != nil {
			t.Fatal(err)
		}

		// Wait for the first moment cap.<name> answers on B. Until B routes
		// it, B has no stand-in and the server says "no responders" at once.
		deadline := time.Now().Add(15 * time.Second)
		for {
			m, err := caller.Request("cap."+name, nil, 5*time.Second)
			if err == nil && string(m.Data) == "from A" {
				break
			}
			if err != nil && !errors.Is(err, nats.ErrNoResponders) {
				t.Fatalf("round %d: cap.%s on B: %v", round, name, err)
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: cap.%s never became callable on B (last: %v %v)", round, name, err, m)
			}
			time.Sleep(5 * time.Millisecond)
		}

		// At that moment the stage is routable too.
		m, err := caller.Request("cmd."+name, []byte(name), 10*time.Second)
		if err != nil {
			t.Fatalf("round %d: submit cmd.%s on B: %v", round, name, err)
		}
		if code, text := natstest.ServiceError(m); code != 0 {
			t.Fatalf("round %d: submit cmd.%s on B as soon as cap.%s answers: got %d %q, want it accepted", round, name, name, code, text)
		}
		select {
		case got := <-handled:
			if got != name {
				t.Fatalf("round %d: handler got %q, want %q", round, got, name)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("round %d: the command accepted on B never reached A's handler", round)
		}
	}
}
