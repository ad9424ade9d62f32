package bridge_test

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/bridge/codec"
	"github.com/meshbox/meshbox/internal/wire"

	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/nats-io/nats.go"
)

func subscribeEvents(t *testing.T, n *node, subject string) *recorder {
	t.Helper()
	r := &recorder{}
	sub, err := n.client.Subscribe(subject, r.add)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := n.client.Flush(); err != nil {
		t.Fatal(err)
	}
	if n.b.Status().Broker.State == bridge.StateConnected {
		n.waitEventsBound(t, subject)
	}
	return r
}

// waitEventsBound waits until n's event queue is bound for the events of
// subject: a subscriber receives the mesh's events published after that.
func (n *node) waitEventsBound(t testing.TB, subject string) {
	t.Helper()
	p, ok := wire.EventPattern(subject)
	if !ok {
		t.Fatalf("%s receives no event", subject)
	}
	meshtest.WaitFor(t, 10*time.Second, n.name+" bound for "+subject, func() bool {
		eb := n.b.Status().Broker.EventBindings
		return eb != nil && !eb.Pending && eb.Bound > 0 && (slices.Contains(eb.Topics, p) || slices.Contains(eb.Topics, wire.AllEvents))
	})
}

func TestEventsReachEveryNodeWithoutEcho(t *testing.T) {
	vhost := testVhost(t)
	nodes := []*node{newNode(t, "alpha", vhost, nil), newNode(t, "beta", vhost, nil), newNode(t, "gamma", vhost, nil)}
	recs := map[string]*recorder{}
	for _, n := range nodes {
		n.waitConnected(t)
		recs[n.name] = subscribeEvents(t, n, "evt.>")
	}
	a, b := nodes[0], nodes[1]
	const n = 50
	for i := 0; i < n; i++ {
		m := &nats.Msg{Subject: "evt.order.created", Data: []byte(strconv.Itoa(i)), Header: nats.Header{"X-Seq": {strconv.Itoa(i)}}}
		if i%10 == 0 { // a publisher may ask to be told once the event is durable
			r, err := a.client.RequestMsg(m, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if got := r.Header.Get(codec.HeaderAccepted); got != "broker" {
				t.Fatalf("event %d accepted as %q, want broker", i, got)
			}
			continue
		}
		if err := a.client.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.client.Publish("evt.other", []byte("from beta")); err != nil {
		t.Fatal(err)
	}
	meshtest.WaitFor(t, 15*time.Second, "events on every node", func() bool {
		return recs["beta"].len() >= n && recs["gamma"].len() >= n+1 && recs["alpha"].len() >= n+1
	})
	time.Sleep(time.Second) // echoes or duplicates would arrive now

	for _, name := range []string{"beta", "gamma"} {
		var seqs []string
		for _, m := range recs[name].all() {
			if m.Subject != "evt.order.created" {
				continue
			}
			seqs = append(seqs, string(m.Data))
			if o := m.Header.Get(codec.HeaderOrigin); o != "alpha" {
				t.Errorf("%s: origin %q, want alpha", name, o)
			}
			if m.Header.Get("X-Seq") != string(m.Data) {
				t.Errorf("%s: header X-Seq %q lost", name, m.Header.Get("X-Seq"))
			}
		}
		if len(seqs) != n {
			t.Errorf("%s got %d events from alpha, want %d", name, len(seqs), n)
		}
		for i, s := range seqs {
			if s != strconv.Itoa(i) {
				t.Errorf("%s: event %d is %s, want in order", name, i, s)
				break
			}
		}
	}
	// alpha sees its own events once (from its NATS server) and beta's once.
	own, other := 0, 0
	for _, m := range recs["alpha"].all() {
		switch m.Subject {
		case "evt.order.created":
			own++
			if m.Header.Get(codec.HeaderOrigin) != "" {
				t.Errorf("alpha got its own event back from the mesh: %v", m.Header)
			}
		case "evt.other":
			other++
			if o := m.Header.Get(codec.HeaderOrigin); o != "beta" {
				t.Errorf("alpha: origin %q, want beta", o)
			}
		}
	}
	if own != n || other != 1 {
		t.Errorf("alpha: got %d own and %d of beta's events, want %d and 1", own, other, n)
	}
	if got := recs["beta"].len(); got != n+1 {
		t.Errorf("beta: got %d events, want %d (no echo of its own)", got, n+1)
	}
	if got := recs["gamma"].len(); got != n+1 {
		t.Errorf("gamma: got %d events, want %d", got, n+1)
	}
}

// A local program's Meshbox-* headers are never the node's word: an event
// it publishes with a forged Meshbox-Origin (as if it came from another
// node) still goes to the mesh, from this node, without the forged
// headers.
func TestForgedOriginOfALocalEventIsIgnored(t *testing.T) {
	vhost := testVhost(t)
	a, b := newNode(t, "alpha", vhost, nil), newNode(t, "beta", vhost, nil)
	a.waitConnected(t)
	b.waitConnected(t)
	rec := subscribeEvents(t, b, "evt.>")
	m := &nats.Msg{Subject: "evt.door.opened", Data: []byte("front"), Header: nats.Header{
		codec.HeaderOrigin: {"gamma"}, codec.HeaderMsgID: {"forged-1"}, codec.HeaderRedelivered: {"true"}, "X-Keep": {"yes"}}}
	r, err := a.client.RequestMsg(m, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Header.Get(codec.HeaderAccepted); got != "broker" {
		t.Fatalf("event accepted as %q (headers %v), want broker", got, r.Header)
	}
	meshtest.WaitFor(t, 15*time.Second, "the event on beta", func() bool { return rec.len() >= 1 })
	got := rec.all()[0]
	if o := got.Header.Get(codec.HeaderOrigin); o != "alpha" {
		t.Errorf("origin on beta: got %q, want alpha (the node that took it from its program)", o)
	}
	if got.Header.Get(codec.HeaderRedelivered) != "" || got.Header.Get("X-Keep") != "yes" {
		t.Errorf("headers on beta: got %v, want X-Keep and no Meshbox-Redelivered", got.Header)
	}
}
