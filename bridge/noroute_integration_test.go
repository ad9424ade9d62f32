package bridge_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
	"github.com/nats-io/nats.go"
)

// A request or a reply the broker returns as unroutable — its node's
// queues are briefly unbound, as while the node reconnects to another
// broker node or switches to a new credential — is sent again and
// answered, not failed with 503 (a request) or lost until the caller's
// deadline (a reply). The test unbinds a node's queue from mesh for a
// moment, first beta's while alpha calls it, then alpha's while beta's
// answer is on its way.
func TestUnroutableRequestAndReplySentAgain(t *testing.T) {
	vhost := testVhost(t)
	a := newNode(t, "alpha", vhost, func(c *bridge.Config) { c.Routes = map[string]string{"slow": "beta"} })
	b := newNode(t, "beta", vhost, nil)
	a.waitConnected(t)
	b.waitConnected(t)
	sub, err := b.client.Subscribe("cap.slow", func(m *nats.Msg) {
		time.Sleep(100 * time.Millisecond) // alpha's queues are unbound meanwhile, in the reply case
		_ = m.Respond(append([]byte("slow:"), m.Data...))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := b.client.Flush(); err != nil {
		t.Fatal(err)
	}
	waitStandIn(t, a, "slow")

	for _, c := range []struct {
		what  string
		node  *node         // whose queues are unbound
		after time.Duration // after the call starts
	}{
		{"request to beta", b, 0},
		{"reply to alpha", a, 20 * time.Millisecond},
	} {
		const away = 300 * time.Millisecond
		type result struct {
			m   *nats.Msg
			err error
		}
		res := make(chan result, 1)
		unbind := func() {
			if err := bridge.SetOwnQueuesBound(c.node.b, false); err != nil {
				t.Fatalf("%s: unbind: %v", c.what, err)
			}
		}
		if c.after == 0 {
			unbind()
		}
		start := time.Now()
		go func() { // the call: exits when answered
			m, err := a.request(t, "cap.slow", []byte(c.what), nats.Header{codec.HeaderTimeout: {"5s"}}, 6*time.Second)
			res <- result{m, err}
		}()
		if c.after > 0 {
			time.Sleep(c.after)
			unbind()
		}
		time.Sleep(away - c.after)
		if err := bridge.SetOwnQueuesBound(c.node.b, true); err != nil {
			t.Fatalf("%s: bind again: %v", c.what, err)
		}
		r := <-res
		took := time.Since(start)
		if r.err != nil {
			t.Fatalf("%s: %v after %v", c.what, r.err, took)
		}
		if code, text := natstest.ServiceError(r.m); code != 0 || string(r.m.Data) != "slow:"+c.what {
			t.Fatalf("%s: got %q (error %d %q) after %v, want the answer", c.what, r.m.Data, code, text, took)
		}
		if took < away || took > 2*time.Second {
			t.Errorf("%s: answered after %v, want after the %v the queue was unbound and soon after", c.what, took, away)
		}
		t.Logf("%s: answered %v after the call, the node's queue unbound for %v", c.what, took.Round(time.Millisecond), away)
	}
}

// A node's request and reply queues made by an older meshbox (shared,
// expiring 15 s after their last consumer, still bound to the node's
// keys) are left to expire: the node's own are server-named and exclusive
// to its connection, and calls reach it meanwhile.
func TestOlderSharedQueuesLeftToExpire(t *testing.T) {
	vhost := testVhost(t)
	conn, err := amqp.Dial(vhost)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(bridge.MeshExchange, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for _, q := range []struct{ name, key string }{{"node.beta.requests", "to.beta.req.#"}, {"node.beta.replies", "to.beta.reply"}} {
		if _, err := ch.QueueDeclare(q.name, false, false, false, false, amqp.Table{"x-expires": int64(15000)}); err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(q.name, q.key, bridge.MeshExchange, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	a := newNode(t, "alpha", vhost, func(c *bridge.Config) { c.Routes = map[string]string{"echo": "beta"} })
	b := newNode(t, "beta", vhost, nil)
	a.waitConnected(t)
	b.waitConnected(t)
	hostEcho(t, b, "echo")
	waitStandIn(t, a, "echo")
	m, err := a.request(t, "cap.echo", []byte("x"), nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code, text := natstest.ServiceError(m); code != 0 || string(m.Data) != "echo:x" {
		t.Fatalf("got %q (error %d %q), want echo:x", m.Data, code, text)
	}
	reqQ, repQ, _ := bridge.OwnQueues(b.b)
	for _, q := range []string{reqQ, repQ} {
		if !strings.HasPrefix(q, "amq.gen-") {
			t.Errorf("beta's own queue %q: want a server-named one", q)
		}
		c2, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		_, err = c2.QueueDeclarePassive(q, false, false, false, false, nil)
		var ae *amqp.Error
		if !errors.As(err, &ae) || ae.Code != amqp.ResourceLocked {
			t.Errorf("%s: passive declare from another connection: %v, want 405 (exclusive to beta's connection)", q, err)
		}
	}
	for _, q := range []string{"node.beta.requests", "node.beta.replies"} {
		st, err := ch.QueueDeclarePassive(q, false, false, false, false, nil)
		if err != nil || st.Consumers != 0 {
			t.Errorf("the older meshbox's %s: %+v %v, want it there without a consumer (it expires)", q, st, err)
		}
	}
}

// A request a node's host is handling when the node's broker connection
// is lost cannot be answered on that connection: the node tells the
// caller once it is connected again (503, the outcome unknown), so the
// caller does not wait for its deadline.
func TestCallOpenAtLostConnectionAnswered(t *testing.T) {
	vhost := testVhost(t)
	px, proxied := brokerProxy(t, vhost)
	a := newNode(t, "alpha", vhost, func(c *bridge.Config) {
		c.Routes = map[string]string{"stuck": "beta"}
		c.RequestTimeout = 30 * time.Second
	})
	b := newNode(t, "beta", proxied, func(c *bridge.Config) { c.RequestTimeout = 30 * time.Second })
	a.waitConnected(t)
	b.waitConnected(t)
	arrived := make(chan struct{}, 1)
	sub, err := b.client.Subscribe("cap.stuck", func(*nats.Msg) { // never answers
		select {
		case arrived <- struct{}{}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := b.client.Flush(); err != nil {
		t.Fatal(err)
	}
	waitStandIn(t, a, "stuck")
	for len(arrived) > 0 { // the stand-in probes reached the host too
		<-arrived
	}
	type result struct {
		m   *nats.Msg
		err error
	}
	res := make(chan result, 1)
	start := time.Now()
	go func() { // the call: exits when answered
		m, err := a.request(t, "cap.stuck", []byte("x"), nil, 40*time.Second)
		res <- result{m, err}
	}()
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the request did not reach beta's host")
	}
	px.Cut(t)
	meshtest.WaitFor(t, 15*time.Second, "beta offline", func() bool { return b.b.Status().Broker.State != bridge.StateConnected })
	px.Restore(t)
	var r result
	select {
	case r = <-res:
	case <-time.After(20 * time.Second):
		t.Fatal("no answer 20 s after beta lost its connection (the caller's deadline is 30 s)")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	code, text := natstest.ServiceError(r.m)
	if code != 503 || !strings.Contains(text, "lost its broker connection") || !strings.Contains(text, "stuck") {
		t.Fatalf("got %d %q after %v, want 503 saying beta lost its broker connection while handling stuck", code, text, time.Since(start))
	}
	t.Logf("answered %d %q %v after the call", code, text, time.Since(start).Round(time.Millisecond))
}
