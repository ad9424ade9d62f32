package bridge_test

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
)

// handler serves work.<stage> on a node's local program and records what it
// saw. fail decides whether a delivery fails (nil: never).
type handler struct {
	mu   sync.Mutex
	seen []*nats.Msg
	fail func(m *nats.Msg) bool
}

func serveStage(t *testing.T, n *node, stage string, h *handler) *nats.Subscription {
	t.Helper()
	sub, err := n.client.QueueSubscribe("work."+stage, "meshbox", func(m *nats.Msg) {
		h.mu.Lock()
		h.seen = append(h.seen, m)
		h.mu.Unlock()
		if h.fail != nil && h.fail(m) {
			r := nats.NewMsg(m.Reply)
			r.Header.Set("Nats-Service-Error", "boom")
			r.Header.Set("Nats-Service-Error-Code", "500")
			_ = m.RespondMsg(r)
			return
		}
		_ = m.Respond(nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := n.client.Flush(); err != nil {
		t.Fatal(err)
	}
	n.waitHosts(t, stage)
	return sub
}

func (h *handler) msgs() []*nats.Msg {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*nats.Msg(nil), h.seen...)
}

func TestCommandsHandledOnceWithTwoHosts(t *testing.T) {
	vhost := testVhost(t)
	a := newNode(t, "alpha", vhost, nil)
	b := newNode(t, "beta", vhost, nil)
	c := newNode(t, "gamma", vhost, nil)
	for _, n := range []*node{a, b, c} {
		n.waitConnected(t)
	}
	var hb, hc handler
	serveStage(t, b, "resize", &hb)
	serveStage(t, c, "resize", &hc)

	const n = 300
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := a.client.RequestMsg(&nats.Msg{Subject: "cmd.resize", Data: []byte(strconv.Itoa(i)),
				Header: nats.Header{"X-Seq": {strconv.Itoa(i)}}}, 10*time.Second)
			if err != nil {
				errs <- err
				return
			}
			// Confirmed by the broker, or (when a loaded machine made the
			// broker's round trip look far, see overflowRTT) committed
			// to the outbox on the way there: durable either way.
			if got := m.Header.Get(codec.HeaderAccepted); got != "broker" && got != "outbox" {
				errs <- fmt.Errorf("command %d accepted as %q (%v), want broker or outbox", i, got, m.Header)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	meshtest.WaitFor(t, 20*time.Second, "every command handled", func() bool { return len(hb.msgs())+len(hc.msgs()) >= n })
	time.Sleep(500 * time.Millisecond) // duplicates would show up now
	count := map[string]int{}
	ids := map[string]bool{}
	for _, m := range append(hb.msgs(), hc.msgs()...) {
		count[m.Header.Get("X-Seq")]++
		id := m.Header.Get(codec.HeaderMsgID)
		if id == "" || ids[id] {
			t.Errorf("message id %q missing or repeated", id)
		}
		ids[id] = true
		if m.Header.Get(codec.HeaderAttempt) != "1" || m.Header.Get(codec.HeaderRedelivered) != "false" || m.Header.Get(codec.HeaderOrigin) != "alpha" {
			t.Errorf("headers of a first delivery: got %v", m.Header)
		}
	}
	for i := 0; i < n; i++ {
		if count[strconv.Itoa(i)] != 1 {
			t.Errorf("command %d handled %d times, want 1", i, count[strconv.Itoa(i)])
		}
	}
	if len(hb.msgs()) == 0 || len(hc.msgs()) == 0 {
		t.Errorf("split between hosts: beta %d, gamma %d; want both to work", len(hb.msgs()), len(hc.msgs()))
	}
}

func TestCommandRetriesThenDeadLetter(t *testing.T) {
	vhost := testVhost(t)
	a := newNode(t, "alpha", vhost, func(c *bridge.Config) { c.RetryBudget = 3 })
	a.waitConnected(t)
	h := handler{fail: func(m *nats.Msg) bool { return string(m.Data) == "poison" }}
	serveStage(t, a, "flaky", &h)

	a.submit(t, "flaky", []byte("poison"), nats.Header{codec.HeaderMsgID: {"my-id-1"}})
	a.submit(t, "flaky", []byte("fine"), nil)
	meshtest.WaitFor(t, 20*time.Second, "three attempts of the poison command", func() bool {
		n := 0
		for _, m := range h.msgs() {
			if string(m.Data) == "poison" {
				n++
			}
		}
		return n >= 3
	})
	ch := meshtest.Channel(t, vhost)
	var dead []amqp.Delivery
	meshtest.WaitFor(t, 10*time.Second, "the dead letter", func() bool {
		dead = append(dead, deadLetters(t, ch, "flaky")...)
		return len(dead) > 0
	})
	time.Sleep(time.Second) // real time: room for an attempt after the dead letter, whose absence cannot be signalled
	var attempts []string
	for _, m := range h.msgs() {
		if string(m.Data) != "poison" {
			continue
		}
		attempts = append(attempts, m.Header.Get(codec.HeaderAttempt))
		if id := m.Header.Get(codec.HeaderMsgID); id != "my-id-1" {
			t.Errorf("message id: got %q, want the submitter's my-id-1", id)
		}
	}
	if strings.Join(attempts, ",") != "1,2,3" {
		t.Errorf("attempts seen by the handler: got %v, want 1,2,3", attempts)
	}
	if len(dead) != 1 {
		t.Fatalf("dead letters: got %d, want 1", len(dead))
	}
	reason, _ := dead[0].Headers[codec.HeaderDeadReason].(string)
	if !strings.Contains(reason, "attempt 3 of 3") || !strings.Contains(reason, "boom") {
		t.Errorf("dead-letter reason: got %q", reason)
	}
	if q, _ := dead[0].Headers[codec.HeaderDeadQueue].(string); string(dead[0].Body) != "poison" || dead[0].MessageId != "my-id-1" ||
		dead[0].RoutingKey != "dead.flaky" || q != "cmd.flaky" {
		t.Errorf("dead letter: got body %q id %q key %q from %q", dead[0].Body, dead[0].MessageId, dead[0].RoutingKey, q)
	}
}

func TestCommandNoRoute(t *testing.T) {
	vhost := testVhost(t)
	a := newNode(t, "alpha", vhost, nil)
	a.waitConnected(t)
	start := time.Now()
	m, err := a.request(t, "cmd.nobody.hosts.this", []byte("x"), nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code, text := natstest.ServiceError(m); code != 503 || !strings.Contains(text, "no node hosts stage nobody.hosts.this") {
		t.Errorf("got %d %q, want 503 naming the stage", code, text)
	}
	if time.Since(start) > 2*time.Second {
		t.Errorf("took %v, want a prompt answer", time.Since(start))
	}
}

func TestMalformedCommandsDeadLettered(t *testing.T) {
	vhost := testVhost(t)
	a := newNode(t, "alpha", vhost, nil)
	a.waitConnected(t)
	var h handler
	serveStage(t, a, "work", &h)

	ch := meshtest.Channel(t, vhost)
	good := amqp.Table{codec.HeaderOrigin: "mallory"}
	bad := []struct {
		why string
		p   amqp.Publishing
	}{
		{"missing or invalid message id", amqp.Publishing{Type: "command", Headers: good, Body: []byte("1")}},
		{`type "event"`, amqp.Publishing{Type: "event", MessageId: "x", Headers: good, Body: []byte("2")}},
		{"header X-N has type int64", amqp.Publishing{Type: "command", MessageId: "x", Headers: amqp.Table{codec.HeaderOrigin: "mallory", "X-N": int64(5)}, Body: []byte("3")}},
		{"Meshbox-Origin", amqp.Publishing{Type: "command", MessageId: "x", Body: []byte("4")}},
		{"payload of", amqp.Publishing{Type: "command", MessageId: "x", Headers: good, Body: make([]byte, bridge.DefaultMaxPayload+1)}},
	}
	for _, b := range bad {
		if err := ch.Publish("mesh", "cmd.work", false, false, b.p); err != nil {
			t.Fatal(err)
		}
	}
	if err := ch.Publish("mesh", "cmd.work", false, false, amqp.Publishing{Type: "command", MessageId: "ok", Headers: good, Body: []byte("good")}); err != nil {
		t.Fatal(err)
	}
	meshtest.WaitFor(t, 10*time.Second, "the good command", func() bool { return len(h.msgs()) == 1 })
	if got := string(h.msgs()[0].Data); got != "good" {
		t.Errorf("handled: got %q, want only the good command", got)
	}
	var dead []amqp.Delivery
	meshtest.WaitFor(t, 10*time.Second, "dead letters", func() bool {
		dead = append(dead, deadLetters(t, ch, "work")...)
		return len(dead) >= len(bad)
	})
	if len(dead) != len(bad) {
		t.Errorf("dead letters: got %d, want %d", len(dead), len(bad))
	}
	for _, d := range dead { // workers run concurrently: match by body
		i := slices.IndexFunc(bad, func(b struct {
			why string
			p   amqp.Publishing
		}) bool {
			return string(b.p.Body) == string(d.Body)
		})
		if i < 0 {
			t.Errorf("unexpected dead letter with body %.20q", d.Body)
			continue
		}
		reason, _ := d.Headers[codec.HeaderDeadReason].(string)
		if !strings.Contains(reason, bad[i].why) {
			t.Errorf("dead letter %d: reason %q, want it to mention %q", i, reason, bad[i].why)
		}
		if q, _ := d.Headers[codec.HeaderDeadQueue].(string); q != "cmd.work" {
			t.Errorf("dead letter %d: queue %q, want cmd.work", i, q)
		}
	}
	// The consumer is not stuck: more work flows.
	a.submit(t, "work", []byte("after"), nil)
	meshtest.WaitFor(t, 10*time.Second, "a command after the bad ones", func() bool { return len(h.msgs()) == 2 })
}

// TestCommandSeenBeforeIsMarked delivers the same command twice as a broker
// that lost its record of the first delivery would (a SIGKILLed broker can:
// its redelivery then has no redelivered flag and no delivery count). The
// handler must see the second copy marked as a possible duplicate.
func TestCommandSeenBeforeIsMarked(t *testing.T) {
	vhost := testVhost(t)
	a := newNode(t, "alpha", vhost, nil)
	a.waitConnected(t)
	var h handler
	serveStage(t, a, "again", &h)

	ch := meshtest.Channel(t, vhost)
	p := amqp.Publishing{Type: "command", MessageId: "cmd-again-1", DeliveryMode: amqp.Persistent,
		Headers: amqp.Table{codec.HeaderOrigin: "beta"}, Body: []byte("x")}
	for i := range 2 {
		if err := ch.Publish("mesh", "cmd.again", false, false, p); err != nil {
			t.Fatal(err)
		}
		meshtest.WaitFor(t, 10*time.Second, "delivery", func() bool { return len(h.msgs()) == i+1 })
	}
	msgs := h.msgs()
	if got := msgs[0].Header.Get(codec.HeaderRedelivered); got != "false" {
		t.Errorf("first delivery: %s=%q, want false", codec.HeaderRedelivered, got)
	}
	if got := msgs[1].Header.Get(codec.HeaderRedelivered); got != "true" {
		t.Errorf("second delivery of the same id: %s=%q, want true (this node handed it out before)", codec.HeaderRedelivered, got)
	}
}
