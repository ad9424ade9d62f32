package bridge_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// TestHalfOpenLinkDetected stalls the TCP link (nothing flows, nothing is
// closed): heartbeats notice, a request waiting on the link fails with 503
// before its deadline, and the node reconnects once the link carries again.
func TestHalfOpenLinkDetected(t *testing.T) {
	vhost := testVhost(t)
	px, proxied := brokerProxy(t, vhost)
	a := newNode(t, "alpha", proxied, func(c *bridge.Config) {
		c.Routes = map[string]string{"slow": "beta"}
		c.RequestTimeout = 30 * time.Second
		c.Heartbeat = time.Second
	})
	b := newNode(t, "beta", vhost, nil)
	a.waitConnected(t)
	b.waitConnected(t)
	arrived := make(chan struct{}, 1)
	sub, err := b.client.Subscribe("cap.slow", func(*nats.Msg) { // never answers
		select {
		case arrived <- struct{}{}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	waitStandIn(t, a, "slow")

	type result struct {
		m   *nats.Msg
		err error
		at  time.Duration
	}
	res := make(chan result, 1)
	start := time.Now()
	go func() {
		m, err := a.client.Request("cap.slow", nil, 40*time.Second)
		res <- result{m, err, time.Since(start)}
	}()
	select { // the request is in flight: it reached beta's program
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the request did not reach beta")
	}
	px.Stall(t)
	meshtest.WaitFor(t, 15*time.Second, "alpha offline", func() bool { return a.b.Status().Broker.State == bridge.StateOffline })
	r := <-res
	if r.err != nil {
		t.Fatalf("got %v, want an error reply", r.err)
	}
	if code, text := natstest.ServiceError(r.m); code != 503 || !strings.Contains(text, "link lost") {
		t.Errorf("got %d %q, want 503 link lost", code, text)
	}
	if r.at > 10*time.Second {
		t.Errorf("answered after %v, want within a few heartbeats", r.at)
	}
	px.Restore(t)
	a.waitConnected(t)
}

// TestHandlerKilledDuringCommand: the handler's process dies while it works
// on a command (it never replies); after the attempt's timeout the command
// is delivered again, marked, and a new handler completes it.
func TestHandlerKilledDuringCommand(t *testing.T) {
	vhost := testVhost(t)
	a := newNode(t, "alpha", vhost, func(c *bridge.Config) { c.CommandTimeout = time.Second })
	a.waitConnected(t)
	doomed, err := nats.Connect(a.srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan struct{})
	if _, err := doomed.QueueSubscribe("work.job", "meshbox", func(*nats.Msg) { close(got) }); err != nil {
		t.Fatal(err)
	}
	_ = doomed.Flush()
	a.waitHosts(t, "job")
	a.submit(t, "job", []byte("payload"), nil)
	<-got
	doomed.Close() // killed mid-command, no reply

	var h handler
	serveStage(t, a, "job", &h)
	meshtest.WaitFor(t, 15*time.Second, "the command handled by the new handler", func() bool { return len(h.msgs()) > 0 })
	m := h.msgs()[0]
	if string(m.Data) != "payload" || m.Header.Get(codec.HeaderAttempt) != "2" || m.Header.Get(codec.HeaderRedelivered) != "true" {
		t.Errorf("redelivery: got %q attempt %s redelivered %s, want payload, 2, true",
			m.Data, m.Header.Get(codec.HeaderAttempt), m.Header.Get(codec.HeaderRedelivered))
	}
}

func TestMetricsRegistered(t *testing.T) {
	reg := prometheus.NewRegistry()
	n := newNode(t, "alpha", "", func(c *bridge.Config) { c.Metrics = reg })
	_ = n
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, mf := range mfs {
		have[mf.GetName()] = true
	}
	for _, name := range []string{"meshbox_broker_state", "meshbox_broker_dials_total", "meshbox_messages_total", "meshbox_outbox_depth",
		"meshbox_outbox_bytes", "meshbox_outbox_oldest_age_seconds", "meshbox_stalls"} {
		if !have[name] {
			t.Errorf("metric %s not registered", name)
		}
	}
	// A second bridge on the same registry is refused, not a panic.
	other := buildNode(t, "beta", "", func(c *bridge.Config) { c.Metrics = reg })
	if err := other.b.Start(t.Context()); err == nil || !strings.Contains(err.Error(), "already registered") {
		t.Errorf("second registration: got %v, want an error", err)
	}
}

// TestNameTakenWhileOffline: a node that starts offline and later finds
// its name held by another process reports it on Fatal (after the grace a
// stale connection of its own could need), and keeps the first working.
func TestNameTakenWhileOffline(t *testing.T) {
	t.Parallel()
	vhost := testVhost(t)
	px, proxied := brokerProxy(t, vhost)
	px.Cut(t)
	second := newNode(t, "alpha", proxied, func(c *bridge.Config) { c.Heartbeat = time.Second })
	first := newNode(t, "alpha", vhost, nil)
	first.waitConnected(t)
	px.Restore(t)
	select {
	case err := <-second.b.Fatal():
		var inUse *bridge.NodeNameInUseError
		if !errors.As(err, &inUse) {
			t.Fatalf("fatal: got %v, want a NodeNameInUseError", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no fatal error within 30s")
	}
	if st := second.b.Status().Broker; st.State != bridge.StateOffline || !strings.Contains(st.Reason, "in use") {
		t.Errorf("second: got %s %q, want offline, name in use", st.State, st.Reason)
	}
	if st := first.b.Status().Broker.State; st != bridge.StateConnected {
		t.Errorf("first: got %s, want connected", st)
	}
}
