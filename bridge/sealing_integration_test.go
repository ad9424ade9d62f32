package bridge_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
)

const sealMarker = "front-door-code-1234"

// sealedPair starts alpha (routes echo to beta) and beta, both sealing
// with the same content key, and a raw AMQP channel bound to every key of
// mesh (what the broker's operator can read).
func sealedPair(t *testing.T) (a, b *node, regA, regB *prometheus.Registry, tap <-chan amqp.Delivery, ch *amqp.Channel) {
	t.Helper()
	vhost := testVhost(t)
	ck := seal.NewContentKey()
	ring := func() *seal.Keyring {
		r, err := seal.NewKeyring([]seal.ContentKey{ck}, ck.ID)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	regA, regB = prometheus.NewRegistry(), prometheus.NewRegistry()
	a = newNode(t, "alpha", vhost, func(c *bridge.Config) {
		c.Routes = map[string]string{"echo": "beta"}
		c.Keys, c.Metrics = ring(), regA
	})
	b = newNode(t, "beta", vhost, func(c *bridge.Config) { c.Keys, c.Metrics = ring(), regB })
	a.waitConnected(t)
	b.waitConnected(t)
	ch = meshtest.Channel(t, vhost)
	return a, b, regA, regB, meshtest.Tap(t, ch, "#"), ch
}

// counter reads meshbox_unseal_failures_total{shape,reason} from reg.
func unsealFailures(t *testing.T, reg *prometheus.Registry, shape, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "meshbox_unseal_failures_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["shape"] == shape && l["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// readable is everything of a delivery the broker can read but its body
// (checked raw).
func readable(d amqp.Delivery) string {
	return fmt.Sprintf("%v %s %s %s %s %s %s %s", d.Headers, d.ContentType, d.ContentEncoding, d.MessageId, d.CorrelationId, d.ReplyTo, d.RoutingKey, d.Type)
}

// TestSealedTrafficIsOpaqueToTheBroker sends a request (and its reply), a
// command and an event with a marker in body and headers between two
// sealing nodes: the programs see the marker, a queue bound to # on mesh
// never does.
func TestSealedTrafficIsOpaqueToTheBroker(t *testing.T) {
	a, b, _, _, tap, _ := sealedPair(t)
	hostEcho(t, b, "echo")
	waitStandIn(t, a, "echo")
	var h handler
	serveStage(t, b, "work", &h)
	b.waitHosts(t, "work")
	events := subscribeEvents(t, b, "evt.door")

	hdr := nats.Header{"X-Trace": {sealMarker}, "Content-Type": {"text/" + sealMarker}}
	m, err := a.request(t, "cap.echo", []byte(sealMarker), hdr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code, text := natstest.ServiceError(m); code != 0 {
		t.Fatalf("request: error %d %s", code, text)
	}
	if got := string(m.Data); got != "echo:"+sealMarker || m.Header.Get("X-Trace") != sealMarker || m.Header.Get("Content-Type") != "text/"+sealMarker {
		t.Fatalf("reply: got %q %v, want the marker back in body and headers", got, m.Header)
	}
	a.submit(t, "work", []byte(sealMarker), nats.Header{"X-Secret": {sealMarker}})
	meshtest.WaitFor(t, 10*time.Second, "the command at beta's handler", func() bool { return len(h.msgs()) == 1 })
	if got := h.msgs()[0]; string(got.Data) != sealMarker || got.Header.Get("X-Secret") != sealMarker {
		t.Fatalf("command: got %q %v, want the marker", got.Data, got.Header)
	}
	if err := a.client.PublishMsg(&nats.Msg{Subject: "evt.door", Data: []byte(sealMarker), Header: nats.Header{"X-Secret": {sealMarker}}}); err != nil {
		t.Fatal(err)
	}
	meshtest.WaitFor(t, 10*time.Second, "the event at beta", func() bool { return events.len() == 1 })
	if got := events.all()[0]; string(got.Data) != sealMarker || got.Header.Get("X-Secret") != sealMarker {
		t.Fatalf("event: got %q %v, want the marker", got.Data, got.Header)
	}

	seen := map[string]int{}
	deadline := time.After(3 * time.Second)
	for seen["request"] < 1 || seen["reply"] < 1 || seen["command"] < 1 || seen["event"] < 1 {
		select {
		case d := <-tap:
			seen[d.Type]++
			if bytes.Contains(d.Body, []byte(sealMarker)) || strings.Contains(readable(d), sealMarker) {
				t.Errorf("the broker can read the marker in a %s: %s %q", d.Type, readable(d), d.Body)
			}
			if d.Type != "system" && d.Headers[codec.HeaderKey] == nil {
				t.Errorf("a %s without %s", d.Type, codec.HeaderKey)
			}
		case <-deadline:
			t.Fatalf("the tap saw %v, want a request, reply, command and event", seen)
		}
	}
}

// TestTamperedSealedMessagesRefused flips one byte of sealed messages and
// republishes them, moves one to another stage, and sends one sealed
// with a key beta does not hold: each is refused with its reason and
// counted.
func TestTamperedSealedMessagesRefused(t *testing.T) {
	a, b, _, regB, tap, ch := sealedPair(t)
	var h handler
	serveStage(t, b, "work", &h)
	serveStage(t, b, "other", &h)
	b.waitHosts(t, "work")
	b.waitHosts(t, "other")
	events := subscribeEvents(t, b, "evt.door")

	a.submit(t, "work", []byte("first"), nil)
	meshtest.WaitFor(t, 10*time.Second, "the first command", func() bool { return len(h.msgs()) == 1 })
	if err := a.client.Publish("evt.door", []byte("ev")); err != nil {
		t.Fatal(err)
	}
	meshtest.WaitFor(t, 10*time.Second, "the first event", func() bool { return events.len() == 1 })
	var cmd, evt amqp.Delivery
	for cmd.Type == "" || evt.Type == "" {
		select {
		case d := <-tap:
			switch d.Type {
			case "command":
				cmd = d
			case "event":
				evt = d
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the tap saw no command and event")
		}
	}
	republish := func(key string, d amqp.Delivery, edit func(*amqp.Publishing)) {
		t.Helper()
		p := amqp.Publishing{Headers: d.Headers, MessageId: d.MessageId, Type: d.Type, Timestamp: d.Timestamp,
			Body: bytes.Clone(d.Body)}
		edit(&p)
		if err := ch.Publish("mesh", key, false, false, p); err != nil {
			t.Fatal(err)
		}
	}
	republish("cmd.work", cmd, func(p *amqp.Publishing) { p.Body[len(p.Body)/2] ^= 1; p.MessageId = "flipped" })
	republish("cmd.other", cmd, func(p *amqp.Publishing) {}) // moved to another stage
	republish("evt.door", evt, func(p *amqp.Publishing) { p.Body[len(p.Body)-1] ^= 1 })
	republish("cmd.work", cmd, func(p *amqp.Publishing) {
		p.Headers = amqp.Table{codec.HeaderOrigin: "alpha", codec.HeaderKey: "k-nobody-holds"}
		p.MessageId = "unknown-key"
	})

	meshtest.WaitFor(t, 10*time.Second, "the refusals counted", func() bool {
		return unsealFailures(t, regB, "command", "tampered") == 2 &&
			unsealFailures(t, regB, "event", "tampered") == 1 &&
			unsealFailures(t, regB, "command", "unknown_key") >= 1 // tried again: beta may not have the key yet
	})
	var dead []amqp.Delivery
	meshtest.WaitFor(t, 10*time.Second, "three dead letters", func() bool {
		dead = append(dead, deadLetters(t, ch, "work", "other")...)
		return len(dead) >= 3
	})
	reasons := map[string]string{}
	for _, d := range dead {
		r, _ := d.Headers[codec.HeaderDeadReason].(string)
		q, _ := d.Headers[codec.HeaderDeadQueue].(string) // the stage queue it came from
		reasons[d.MessageId+"@"+q] = r
	}
	for id, want := range map[string]string{
		"flipped@cmd.work":           "(tampered)",
		cmd.MessageId + "@cmd.other": "(tampered)",
		"unknown-key@cmd.work":       "(unknown_key): sealed with key k-nobody-holds",
	} {
		if !strings.Contains(reasons[id], want) {
			t.Errorf("dead letter %s: reason %q, want it to say %q", id, reasons[id], want)
		}
	}
	if n := len(h.msgs()); n != 1 {
		t.Errorf("handlers got %d commands, want only the first", n)
	}
	if n := events.len(); n != 1 {
		t.Errorf("beta's subscribers got %d events, want only the first", n)
	}
}

// TestSealedRequestRefusals: a request whose seal does not open gets an
// error reply with the reason; one replayed past its deadline is refused
// as expired.
func TestSealedRequestRefusals(t *testing.T) {
	a, b, _, regB, tap, ch := sealedPair(t)
	hostEcho(t, b, "echo")
	waitStandIn(t, a, "echo")
	if _, err := a.request(t, "cap.echo", []byte("x"), nats.Header{codec.HeaderTimeout: {"300ms"}}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	var req amqp.Delivery
	for req.Type != "request" || req.Expiration != "300" { // not one of waitStandIn's
		select {
		case req = <-tap:
		case <-time.After(5 * time.Second):
			t.Fatal("the tap saw no request")
		}
	}
	// Replies of the refusals go to alpha's reply queue; a raw client
	// cannot read them there, so it watches them on its tap.
	send := func(id string, edit func(*amqp.Publishing)) {
		p := amqp.Publishing{Headers: req.Headers, MessageId: id, CorrelationId: id, ReplyTo: req.ReplyTo,
			Type: req.Type, Body: bytes.Clone(req.Body)}
		edit(&p)
		if err := ch.Publish("mesh", req.RoutingKey, false, false, p); err != nil {
			t.Fatal(err)
		}
	}
	// The same ids, one byte flipped.
	send(req.CorrelationId, func(p *amqp.Publishing) { p.Body[len(p.Body)-1] ^= 1 })
	meshtest.WaitFor(t, 10*time.Second, "the tampered request counted", func() bool {
		return unsealFailures(t, regB, "request", "tampered") == 1
	})
	time.Sleep(maxSkewForTest) // real time is the thing under test: the deadline must pass
	send(req.CorrelationId, func(p *amqp.Publishing) {})
	meshtest.WaitFor(t, 10*time.Second, "the replayed request refused as expired", func() bool {
		return unsealFailures(t, regB, "request", "expired") == 1
	})
	var replies []amqp.Delivery
	meshtest.WaitFor(t, 10*time.Second, "two error replies", func() bool {
		select {
		case d := <-tap:
			if d.Type == "reply" && d.CorrelationId == req.CorrelationId {
				replies = append(replies, d)
			}
		default:
		}
		return len(replies) >= 3 // the original reply, and the two refusals
	})
}

// maxSkewForTest is longer than the clock skew a sealed deadline allows
// plus the request's 300ms.
const maxSkewForTest = 2500 * time.Millisecond

// TestTamperedRequestAnsweredWithReason: while alpha's call waits on
// beta's host, a copy of its request with one byte flipped (same ids,
// same reply route) reaches beta. beta refuses it, and the refusal is
// what alpha's caller gets: an error reply that says the seal did not
// open, and why.
func TestTamperedRequestAnsweredWithReason(t *testing.T) {
	a, b, _, regB, tap, ch := sealedPair(t)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	sub, err := b.client.QueueSubscribe("cap.echo", "svc", func(m *nats.Msg) {
		if string(m.Data) == "hold" {
			<-release // the call waits until the test ends
		}
		_ = m.Respond([]byte("echo:" + string(m.Data)))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := b.client.Flush(); err != nil {
		t.Fatal(err)
	}
	waitStandIn(t, a, "echo")

	type result struct {
		m   *nats.Msg
		err error
	}
	got := make(chan result, 1)
	go func() { // exits when the call is answered or times out
		m, err := a.client.RequestMsg(&nats.Msg{Subject: "cap.echo", Data: []byte("hold"),
			Header: nats.Header{codec.HeaderTimeout: {"2500ms"}}}, 10*time.Second)
		got <- result{m, err}
	}()
	var req amqp.Delivery
	var saw []string
	for req.Type != "request" || req.Expiration != "2500" { // not one of waitStandIn's
		select {
		case req = <-tap:
			saw = append(saw, req.Type+"/"+req.Expiration)
		case <-time.After(5 * time.Second):
			t.Fatalf("the tap saw no request of 2.5s (saw %v)", saw)
		}
	}
	body := bytes.Clone(req.Body)
	body[len(body)/2] ^= 1
	if err := ch.Publish("mesh", req.RoutingKey, false, false, amqp.Publishing{Headers: req.Headers,
		MessageId: req.MessageId, CorrelationId: req.CorrelationId, ReplyTo: req.ReplyTo, Type: req.Type,
		Expiration: req.Expiration, Timestamp: req.Timestamp, Body: body}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("the call: %v, want beta's refusal of the tampered copy", r.err)
		}
		code, text := natstest.ServiceError(r.m)
		if code == 0 || !strings.Contains(text, "node beta refused the sealed request (tampered)") {
			t.Fatalf("the call got %q (code %d, error %q), want beta's refusal saying the seal did not open", r.m.Data, code, text)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call was not answered")
	}
	if n := unsealFailures(t, regB, "request", "tampered"); n != 1 {
		t.Errorf("beta's meshbox_unseal_failures_total{request,tampered}: %v, want 1", n)
	}
}
