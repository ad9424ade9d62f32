package bridge_test

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/nats-io/nats.go"
)

// Two nodes host the same stage, one with a quick handler, one with a slow
// one (50 ms a command, one at a time). The slow node never keeps credit
// beyond Prefetch, so the quick node does most of the work:
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
				if err != nil || m.Header.Get(codec.HeaderAccepted) != "broker" {
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
	qc, sc := bridge.StageCreditOf(quick.b, "share"), bridge.StageCreditOf(slow.b, "share")
	t.Logf("quick node handled %d (credit up to %d messages), slow node %d (credit up to %d messages, %d changes) of %d", q, qc.MostMessages, s, sc.MostMessages, sc.Changes, total)
	// Prefetch (32) commands: in batches of 4, 8 messages; in batches
	// less full, up to 32.
	if sc.MostMessages > 32 {
		t.Errorf("the slow node's credit reached %d messages, want at most 32 (Prefetch commands): more only waits at its serial handler", sc.MostMessages)
	}
	if q < total*85/100 {
		t.Errorf("the quick node handled %d of %d commands, want at least 85%%", q, total)
	}
}

// TestCreditChangesNeverHoldUpAcks: on a link with 50 ms each way, every
// change of a stage's credit costs the consuming node broker round trips
// (basic.qos, basic.consume, basic.cancel). They run beside the acks, not
// before them: while the credit swings twenty times under a steady flow
// of commands, no ack waits for the acker longer than a fraction of one
// round trip but for a scheduler's stall now and then (a machine busy
// with other tests), and every command is handled and acked once.
func TestCreditChangesNeverHoldUpAcks(t *testing.T) {
	vhost := testVhost(t)
	px, slowURL := brokerProxy(t, vhost)
	px.Delay(t, 50*time.Millisecond)
	a := newNode(t, "alpha", vhost, nil)
	b := newNode(t, "beta", slowURL, nil)
	a.waitConnected(t)
	b.waitConnected(t)
	var h handler
	serveStage(t, b, "swing", &h)

	const total = 2000
	var wg sync.WaitGroup
	var next, refused atomic.Int64
	for range 32 {
		wg.Add(1)
		go func() { // submitter: exits when every command is submitted
			defer wg.Done()
			for i := next.Add(1); i <= total; i = next.Add(1) {
				m, err := a.client.Request("cmd.swing", []byte(strconv.FormatInt(i, 10)), 20*time.Second)
				if err != nil || m.Header.Get(codec.HeaderAccepted) != "broker" {
					refused.Add(1)
				}
				time.Sleep(2 * time.Millisecond) // a steady flow across the swings
			}
		}()
	}
	before := bridge.StageCreditOf(b.b, "swing").Changes
	swung := 0
	for i := range 20 {
		if !bridge.SetStageCredit(b.b, "swing", []int{64, 8}[i%2]) {
			t.Fatal("beta's session does not consume stage swing")
		}
		swung++
		time.Sleep(150 * time.Millisecond)
	}
	wg.Wait()
	if n := refused.Load(); n != 0 {
		t.Fatalf("%d of %d commands not accepted by the broker", n, total)
	}
	meshtest.WaitFor(t, 30*time.Second, "every command handled", func() bool { return len(h.msgs()) >= total })
	c := bridge.StageCreditOf(b.b, "swing")
	most, slow := bridge.AckDelays(b.b)
	t.Logf("%d credit swings asked (%d changes by the stage's rules besides), consumers up to %d, credit up to %d messages; the longest ack wait %v, %d runs of acks waited over 100 ms", swung, c.Changes-before, c.MostConsumers, c.MostMessages, most, slow)
	if c.MostMessages < 64 {
		t.Fatalf("the credit never reached the 64 messages asked: up to %d", c.MostMessages)
	}
	// A credit change costs at least one round trip (100 ms); before the
	// acker had a goroutine of its own, the acks behind each of the 20
	// changes waited that long or more. A machine busy with other tests
	// stalls a goroutine for tens of milliseconds now and then.
	if slow > 2 {
		t.Fatalf("%d runs of acks waited over 100 ms for the acker while the credit changed 20 times (the longest %v), want none but a rare stall", slow, most)
	}
	seen := map[string]int{}
	marked := 0
	for _, m := range h.msgs() {
		seen[string(m.Data)]++
		if m.Header.Get(codec.HeaderAttempt) != "1" {
			marked++
		}
	}
	// A quorum queue gives back what it had assigned to a cancelled
	// consumer and not sent yet, counting a delivery (the reason the
	// stage's own rules cancel rarely): here that is the broker's doing.
	t.Logf("%d of %d commands came as a second attempt after the forced cancels", marked, total)
	dup := 0
	for _, n := range seen {
		dup += n - 1
	}
	if len(seen) != total || dup != 0 {
		t.Fatalf("handled %d distinct commands of %d, %d duplicates; want each once", len(seen), total, dup)
	}
}
