package bridge_test

import (
	"context"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
	"github.com/nats-io/nats.go"
)

// A stage declared for an assigned module has its queue on the broker
// before any handler serves it: a command submitted from another node is
// accepted and waits (the stall alarm says nobody consumes it) until a
// handler subscribes; a stage nobody declares or hosts stays refused.
func TestDeclaredStagesTakeCommandsBeforeTheirHandler(t *testing.T) {
	url := testVhost(t)
	host := buildNode(t, "host", url, nil)
	// Declared before the link is up: the session declares it when it
	// connects.
	if err := host.b.SetDeclaredStages(context.Background(), []string{"backup"}); err != nil {
		t.Fatal(err)
	}
	if err := host.b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	host.waitConnected(t)
	// Declared while the link is up: the queue exists when it returns.
	if err := host.b.SetDeclaredStages(context.Background(), []string{"backup", "later"}); err != nil {
		t.Fatal(err)
	}
	sender := newNode(t, "sender", url, nil)
	sender.waitConnected(t)

	ch := meshtest.Channel(t, url)
	for _, stage := range []string{"backup", "later"} {
		meshtest.WaitFor(t, 10*time.Second, "queue cmd."+stage+" declared", func() bool {
			_, err := meshtest.Channel(t, url).QueueDeclarePassive("cmd."+stage, true, false, false, false, nil)
			return err == nil
		})
		if got := sender.submit(t, stage, []byte("run"), nil).Header.Get(codec.HeaderAccepted); got != "broker" {
			t.Errorf("command for declared stage %s accepted by %q, want broker", stage, got)
		}
	}
	m, err := sender.request(t, "cmd.nobody", []byte("run"), nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := natstest.ServiceError(m); code != 503 {
		t.Errorf("command for a stage nobody declares: got code %d, want 503", code)
	}
	q, err := ch.QueueDeclarePassive("cmd.backup", true, false, false, false, nil)
	if err != nil || q.Messages != 1 || q.Consumers != 0 {
		t.Fatalf("cmd.backup: %+v %v; want 1 message waiting, no consumer", q, err)
	}
	meshtest.WaitFor(t, 10*time.Second, "a stall alarm for the declared stage nobody serves", func() bool {
		for _, s := range host.b.Status().Stalls {
			if s.Stage == "backup" {
				return true
			}
		}
		return false
	})

	// The handler arrives: it gets the waiting command.
	got := make(chan []byte, 1)
	sub, err := host.client.Subscribe("work.backup", func(m *nats.Msg) {
		got <- m.Data
		_ = m.Respond(nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	select {
	case d := <-got:
		if string(d) != "run" {
			t.Errorf("handler got %q, want run", d)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the handler did not get the command that waited for it")
	}
}
