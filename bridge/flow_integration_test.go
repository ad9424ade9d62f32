package bridge_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/nats-io/nats.go"
)

// Two nodes host the same stage, one with a quick handler, one with a slow
// one (50 ms a command, one at a time). The slow node never gains credit
// beyond one consumer's prefetch, so the quick node does most of the work:
// with a fixed prefetch of 256 the slow node would hoard up to 256 of the
// 1000 commands.
func TestStageCreditFavoursTheQuickNode(t *testing.T) {
	vhost := testVhost(t)
	a := newNode(t, "alpha", vhost, func(c *bridge.Config) { c.CommandTimeout = 20 * time.Second })
	quick := newNode(t, "quick", vhost, func(c *bridge.Config) { c.CommandTimeout = 20 * time.Second })
	slow := newNode(t, "slow", vhost, func(c *bridge.Config) { c.CommandTimeout = 20 * time.Second })
	for _, n := range []*node{a, quick, slow} {
		n.waitConnected(t)
	}
	const total = 1000
	var quickDone, slowDone atomic.Int64
	all := make(chan struct{})
	count := func(c *atomic.Int64) {
		c.Add(1)
		if quickDone.Load()+slowDone.Load() == total {
			close(all)
		}
	}
	for _, h := range []struct {
		n     *node
		done  *atomic.Int64
		pause time.Duration
	}{{quick, &quickDone, 0}, {slow, &slowDone, 50 * time.Millisecond}} {
		sub, err := h.n.client.Subscribe("work.share", func(m *nats.Msg) { // one at a time
			time.Sleep(h.pause) // the handler's own work
			_ = m.Respond(nil)
			count(h.done)
		})
		if err != nil {
			t.Fatal(err)
		}
		_ = sub.SetPendingLimits(-1, -1)
		t.Cleanup(func() { _ = sub.Unsubscribe() })
		if err := h.n.client.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []*node{quick, slow} {
		meshtest.WaitFor(t, 15*time.Second, n.name+" consuming stage share", func() bool {
			open, _ := bridge.StageConsumers(n.b, "share")
			return open > 0
		})
	}

	var wg sync.WaitGroup
	var next, refused atomic.Int64
	for range 64 {
		wg.Add(1)
		go func() { // submitter: exits when every command is submitted
			defer wg.Done()
			for next.Add(1) <= total {
				m, err := a.client.Request("cmd.share", []byte("x"), 20*time.Second)
				if err != nil || m.Header.Get(bridge.HeaderAccepted) != "broker" {
					refused.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n := refused.Load(); n != 0 {
		t.Fatalf("%d of %d commands not accepted by the broker", n, total)
	}
	select {
	case <-all:
	case <-time.After(60 * time.Second):
		t.Fatalf("after 60s: quick handled %d, slow %d of %d", quickDone.Load(), slowDone.Load(), total)
	}
	q, s := quickDone.Load(), slowDone.Load()
	_, quickMost := bridge.StageConsumers(quick.b, "share")
	_, slowMost := bridge.StageConsumers(slow.b, "share")
	t.Logf("quick node handled %d (most consumers %d), slow node %d (most consumers %d) of %d", q, quickMost, s, slowMost, total)
	if slowMost != 1 {
		t.Errorf("the slow node had up to %d consumers, want 1: its handler never answered quickly", slowMost)
	}
	if q < total*85/100 {
		t.Errorf("the quick node handled %d of %d commands, want at least 85%%", q, total)
	}
}
