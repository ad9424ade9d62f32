package bridge_test

import (
	"bytes"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// countedNode starts a node whose broker traffic goes through a counting
// proxy.
func countedNode(t *testing.T, name, vhost string) (*node, *meshtest.CountingProxy) {
	t.Helper()
	u, err := url.Parse(vhost)
	if err != nil {
		t.Fatal(err)
	}
	px := meshtest.NewCountingProxy(t, u.Host)
	return newNode(t, name, px.Rewrite(vhost, u.Host), nil), px
}

// delivered is what px carried from the broker to its node as deliveries
// with routing key key since prev.
func delivered(px *meshtest.CountingProxy, prev meshtest.FrameStats, key string) meshtest.FrameStat {
	return px.Frames().Sub(prev)[meshtest.FrameKind{Dir: "down", Method: "basic.deliver", Key: key}]
}

// knowEachOther tells every node the others, all of the current
// protocol, as discovery does.
func knowEachOther(nodes ...*node) {
	var names []string
	for _, n := range nodes {
		names = append(names, n.name)
	}
	for _, n := range nodes {
		n.b.SetEventPeers(names, false)
	}
}

// A node receives from the broker only the events of topics its programs
// listen to, and never its own: alpha publishes 200 events of 1 KiB on
// room.temp and listens to them itself (a local subscriber), beta listens
// to room.*, gamma only to other. Beta receives each once; gamma and
// alpha receive none of them from the broker. Control: gamma receives
// the topic it listens to.
func TestEventsGoOnlyWhereListened(t *testing.T) {
	vhost := testVhost(t)
	a, pa := countedNode(t, "alpha", vhost)
	b, pb := countedNode(t, "beta", vhost)
	g, pg := countedNode(t, "gamma", vhost)
	knowEachOther(a, b, g)
	for _, n := range []*node{a, b, g} {
		n.waitConnected(t)
	}
	local := subscribeEvents(t, a, "evt.room.temp")
	atB := subscribeEvents(t, b, "evt.room.*")
	atG := subscribeEvents(t, g, "evt.other")
	for _, n := range []*node{a, b, g} {
		if eb := n.b.Status().Broker.EventBindings; eb.Legacy {
			t.Fatalf("%s binds the shared keys: %+v", n.name, eb)
		}
	}
	before := map[*meshtest.CountingProxy]meshtest.FrameStats{pa: pa.Frames(), pb: pb.Frames(), pg: pg.Frames()}

	const n = 200
	body := bytes.Repeat([]byte("t"), 1024)
	for i := range n {
		m := &nats.Msg{Subject: "evt.room.temp", Data: body}
		if i == n-1 { // the last one confirmed: all are on the broker then
			if _, err := a.client.RequestMsg(m, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := a.client.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.client.Publish("evt.other", []byte("for gamma")); err != nil {
		t.Fatal(err)
	}
	meshtest.WaitFor(t, 15*time.Second, "the events at beta and gamma", func() bool { return atB.len() >= n && atG.len() >= 1 })
	// Anything more for gamma or alpha came with them or before: the
	// broker delivers a queue's messages in order, and the control event
	// went after the last of alpha's.
	atBeta := delivered(pb, before[pb], "evt.room.temp")
	atGamma := delivered(pg, before[pg], "evt.room.temp")
	atAlpha := delivered(pa, before[pa], "evt.room.temp")
	t.Logf("deliveries of room.temp from the broker: beta %d (%d B), gamma %d (%d B), alpha %d (%d B)",
		atBeta.Count, atBeta.Bytes, atGamma.Count, atGamma.Bytes, atAlpha.Count, atAlpha.Bytes)
	if atBeta.Count != n || atB.len() != n {
		t.Errorf("beta: %d deliveries, %d events; want %d", atBeta.Count, atB.len(), n)
	}
	if atGamma.Bytes*20 > atBeta.Bytes {
		t.Errorf("gamma, which does not listen to room.temp, received %d B of it; beta %d B (want at most 5%%)", atGamma.Bytes, atBeta.Bytes)
	}
	if atAlpha.Count != 0 {
		t.Errorf("alpha received %d of its own events back (%d B), want none", atAlpha.Count, atAlpha.Bytes)
	}
	if local.len() != n {
		t.Errorf("alpha's local subscriber: %d events, want %d", local.len(), n)
	}
	if atG.len() != 1 {
		t.Errorf("gamma: %d events of other, want 1", atG.len())
	}
}

// A subscription on a node reaches the broker within the interest window:
// the time from a program's subscribing to its node's event queue bound
// for it, and the first event of a stream published every 10 ms reaching
// the subscriber.
func TestEventInterestReachesTheBrokerInTime(t *testing.T) {
	vhost := testVhost(t)
	a := newNode(t, "alpha", vhost, nil)
	b := newNode(t, "beta", vhost, nil)
	knowEachOther(a, b)
	a.waitConnected(t)
	b.waitConnected(t)

	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // the stream; exits when stop is closed
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			_ = a.client.Publish("evt.stream", []byte(strconv.Itoa(i)))
		}
	}()
	defer func() { close(stop); <-done }()
	time.Sleep(200 * time.Millisecond) // the stream flows, to nobody

	first := make(chan time.Time, 1)
	start := time.Now()
	sub, err := b.client.Subscribe("evt.stream", func(*nats.Msg) {
		select {
		case first <- time.Now():
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	b.waitEventsBound(t, "evt.stream")
	bound := time.Since(start)
	var got time.Duration
	select {
	case at := <-first:
		got = at.Sub(start)
	case <-time.After(5 * time.Second):
		t.Fatal("no event of the stream within 5s of subscribing")
	}
	t.Logf("subscribed to bound: %v; to the first event: %v", bound, got)
	const window, margin = time.Second, 500 * time.Millisecond
	if bound > window+margin || got > window+margin {
		t.Errorf("bound after %v, first event after %v; want within %v (+%v)", bound, got, window, margin)
	}

	// And away again: once unsubscribed, the queue is bound for nothing.
	_ = sub.Unsubscribe()
	meshtest.WaitFor(t, window+margin, "beta unbound", func() bool {
		eb := b.b.Status().Broker.EventBindings
		return !eb.Pending && eb.Bound == 0
	})
}

// The event queue's bindings come back with the next session: the link
// is cut, the queue is deleted meanwhile (as the broker does when a node
// stays away past its expiry), and once the link is back the node
// receives what a peer publishes.
func TestEventBindingsComeBackAfterACut(t *testing.T) {
	vhost := testVhost(t)
	px, proxied := brokerProxy(t, vhost)
	a := newNode(t, "alpha", vhost, nil)
	b := newNode(t, "beta", proxied, nil)
	knowEachOther(a, b)
	a.waitConnected(t)
	b.waitConnected(t)
	rec := subscribeEvents(t, b, "evt.door")
	bound := b.b.Status().Broker.EventBindings.Bound

	px.Cut(t)
	meshtest.WaitFor(t, 10*time.Second, "beta offline", func() bool { return b.b.Status().Broker.State == bridge.StateOffline })
	ch := meshtest.Channel(t, vhost)
	if _, err := ch.QueueDelete("node.beta.events", false, false, false); err != nil {
		t.Fatal(err)
	}
	px.Restore(t)
	b.waitConnected(t)
	b.waitEventsBound(t, "evt.door")
	if got := b.b.Status().Broker.EventBindings.Bound; got != bound {
		t.Errorf("bound after the cut: %d keys, want %d", got, bound)
	}
	if _, err := a.client.Request("evt.door", []byte("opened"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	meshtest.WaitFor(t, 10*time.Second, "the event at beta after the cut", func() bool { return rec.len() >= 1 })
}

// A node sends an event to the broker only when another node listens to
// its topic, as far as discovery's view says (SetEventListeners): alpha,
// told that the others listen to room.* alone, sends none of 100 events
// of hall.light and every one of 100 of room.temp, each counted on its
// broker connection. An event whose program asks for a confirmation goes
// and is confirmed. A view that says "all", and a view taken before the
// link last connected (an update may have been missed meanwhile), send
// everything.
func TestEventsSentOnlyWhereSomeoneListens(t *testing.T) {
	vhost := testVhost(t)
	a, pa := countedNode(t, "alpha", vhost)
	b := newNode(t, "beta", vhost, nil)
	knowEachOther(a, b)
	a.waitConnected(t)
	b.waitConnected(t)
	atB := subscribeEvents(t, b, "evt.room.*")
	roomOnly := func(topic string) bool { return strings.HasPrefix(topic, "room.") && strings.Count(topic, ".") == 1 }
	published := func(prev meshtest.FrameStats, topic string) int64 {
		return pa.Frames().Sub(prev)[meshtest.FrameKind{Dir: "up", Method: "basic.publish", Key: "evt." + topic}].Count
	}
	send := func(topic string, n int) {
		t.Helper()
		for range n {
			if err := a.client.Publish("evt."+topic, []byte("x")); err != nil {
				t.Fatal(err)
			}
		}
		// Confirmed after the others: they were handled before it.
		if _, err := a.client.Request("evt."+topic, []byte("last"), 5*time.Second); err != nil {
			t.Fatalf("an event of %s with a reply: %v, want it confirmed", topic, err)
		}
	}
	const n = 100

	a.b.SetEventListeners(false, "", []string{"room.*"}, roomOnly, time.Now())
	before := pa.Frames()
	send("hall.light", n)
	send("room.temp", n)
	meshtest.WaitFor(t, 10*time.Second, "beta has room.temp", func() bool { return atB.len() >= n+1 })
	if got := published(before, "hall.light"); got != 1 {
		t.Errorf("hall.light, which nobody else listens to: %d published to the broker, want 1 (the one with a reply)", got)
	}
	if got := published(before, "room.temp"); got != n+1 {
		t.Errorf("room.temp, which beta listens to: %d published, want %d", got, n+1)
	}
	if l := a.b.Status().Broker.EventBindings.Listeners; l == nil || l.KeptLocal != n || l.All || !slices.Equal(l.Topics, []string{"room.*"}) {
		t.Errorf("alpha's status of the listeners: %+v; want %d kept, and room.*", l, n)
	}

	// Control: "all" sends everything.
	a.b.SetEventListeners(true, "node gamma not heard yet", nil, nil, time.Now())
	before = pa.Frames()
	send("hall.light", n)
	if got := published(before, "hall.light"); got != n+1 {
		t.Errorf("with every node maybe listening: %d of hall.light published, want %d", got, n+1)
	}
	if l := a.b.Status().Broker.EventBindings.Listeners; l == nil || !l.All || l.Why != "node gamma not heard yet" || l.KeptLocal != n {
		t.Errorf("alpha's status of the listeners: %+v; want all, with why, and the %d kept before", l, n)
	}

	// A view older than the link's connection is not believed.
	at := time.Now()
	a.b.SetEventListeners(false, "", []string{"room.*"}, roomOnly, at)
	bridge.LinkConnectedAt(a.b, at.Add(time.Millisecond))
	before = pa.Frames()
	send("hall.light", n)
	if got := published(before, "hall.light"); got != n+1 {
		t.Errorf("with a view taken before the link connected: %d of hall.light published, want %d", got, n+1)
	}
}
