package bridge_test

import (
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/prometheus/client_golang/prometheus"
)

// TestReconnectSoonAfterRestore cuts a node's link to the broker for longer
// than its backoff (the default bounds, 250ms..10s) needs to grow past a
// second, then restores it: the session is up again within 0.5s of the
// restore. While the link is cut the node does not reconnect, and it dials
// no more often than one probe per 100ms.
func TestReconnectSoonAfterRestore(t *testing.T) {
	vhost := testVhost(t)
	px, proxied := brokerProxy(t, vhost)
	reg := prometheus.NewRegistry()
	up := make(chan time.Time, 1) // when the link entered the connected state
	a := newNode(t, "alpha", proxied, func(c *bridge.Config) {
		c.ReconnectMin, c.ReconnectMax = 0, 0 // the defaults
		c.Metrics = reg
		c.OnConnected = func() {
			select {
			case up <- time.Now():
			default:
			}
		}
	})
	select {
	case <-up:
	case <-time.After(15 * time.Second):
		t.Fatal("alpha did not connect")
	}
	dials := func(result string) int {
		return int(counterWith(t, reg, "meshbox_broker_dials_total", "result", result))
	}
	reconnects := func() int {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "meshbox_broker_reconnects_total" {
				return int(mf.GetMetric()[0].GetCounter().GetValue())
			}
		}
		return 0
	}

	px.Cut(t)
	meshtest.WaitFor(t, 10*time.Second, "alpha offline", func() bool { return a.b.Status().Broker.State == bridge.StateOffline })
	cut := time.Now()
	failed, connected, reconnected := dials("failed"), dials("connected"), reconnects()
	// Real time is what is under test: long enough for the old schedule's
	// waits to pass a second.
	time.Sleep(4 * time.Second)
	elapsed := time.Since(cut)
	failed = dials("failed") - failed

	// The control: cut, the node stays offline and only probes.
	if st := a.b.Status().Broker; st.State != bridge.StateOffline {
		t.Fatalf("while cut: got state %s (%s), want offline", st.State, st.Reason)
	}
	select {
	case <-up:
		t.Fatal("alpha connected while the link was cut")
	default:
	}
	if n := dials("connected") - connected; n != 0 {
		t.Errorf("while cut: got %d TCP connects, want 0", n)
	}
	if most := int(elapsed/(100*time.Millisecond)) + 2; failed > most || failed < 2 {
		t.Errorf("while cut for %v: got %d failed dials, want 2..%d (a probe every 100-200ms)", elapsed.Round(time.Millisecond), failed, most)
	}

	px.Restore(t)
	restored := time.Now()
	select {
	case at := <-up:
		took := at.Sub(restored)
		t.Logf("cut for %v with %d probes; connected %v after the restore", elapsed.Round(time.Millisecond), failed, took.Round(time.Millisecond))
		if took > 500*time.Millisecond {
			t.Errorf("connected %v after the restore, want within 500ms", took.Round(time.Millisecond))
		}
	case <-time.After(15 * time.Second):
		t.Fatal("alpha did not reconnect within 15s of the restore")
	}
	if n := reconnects() - reconnected; n != 1 {
		t.Errorf("got %d reconnects, want 1", n)
	}
}

// TestRefusedSessionBacksOff is the other side: a broker that answers TCP
// but refuses the session (here: no such vhost, refused at once; a refused
// password gets the same treatment but RabbitMQ holds each refusal 3s) is
// not probed but retried with the growing backoff, so the node does not
// spin on it.
func TestRefusedSessionBacksOff(t *testing.T) {
	missing := testVhost(t) + "-missing"
	reg := prometheus.NewRegistry()
	start := time.Now()
	a := newNode(t, "alpha", missing, func(c *bridge.Config) {
		c.ReconnectMin, c.ReconnectMax = 0, 0 // the defaults
		c.Metrics = reg
	})
	// A session dials its two connections at once: two TCP connects per
	// attempt.
	attempts := func() int {
		return (int(counterWith(t, reg, "meshbox_broker_dials_total", "result", "connected")) + 1) / 2
	}
	meshtest.WaitFor(t, 10*time.Second, "a second refused session", func() bool { return attempts() >= 2 })
	// Real time is what is under test: the waits of the backoff.
	time.Sleep(3*time.Second - time.Since(start))
	elapsed := time.Since(start)
	// Start's attempt and the link's first, then waits of at least 125ms,
	// 250ms, 500ms, 1s, 2s (each is drawn from the upper half of its base).
	most := 2
	for wait, sum := 125*time.Millisecond, 125*time.Millisecond; sum <= elapsed; wait, sum = 2*wait, sum+2*wait {
		most++
	}
	n := attempts()
	t.Logf("%d sessions refused in %v", n, elapsed.Round(time.Millisecond))
	if n > most {
		t.Errorf("got %d attempts in %v, want at most %d (the backoff)", n, elapsed.Round(time.Millisecond), most)
	}
	if f := counterWith(t, reg, "meshbox_broker_dials_total", "result", "failed"); f != 0 {
		t.Errorf("got %v failed dials, want 0: the broker answers", f)
	}
	if st := a.b.Status().Broker; st.State != bridge.StateOffline || !strings.Contains(st.Reason, "530") {
		t.Errorf("got %s %q, want offline with the broker's 530", st.State, st.Reason)
	}
}
