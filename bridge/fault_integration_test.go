package bridge_test

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/testing/ledger"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/nats-io/nats.go"
)

// TestBrokerRestartLosesNothing runs commands and events from alpha to beta
// through a graceful broker restart and a SIGKILL of the broker.
func TestBrokerRestartLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a private broker")
	}
	t.Parallel()
	rabbit := meshtest.NewRabbitMQ(t)
	url := rabbit.URL()
	a := newNode(t, "alpha", url, nil)
	b := newNode(t, "beta", url, nil)
	a.waitConnected(t)
	b.waitConnected(t)
	cmds, evts := ledger.NewHistory(), ledger.NewHistory()
	if _, err := b.client.QueueSubscribe("work.soak", "meshbox", func(m *nats.Msg) {
		cmds.Delivered(ledger.DeliveryOf("beta", m))
		_ = m.Respond(nil)
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.Subscribe("evt.soak", func(m *nats.Msg) { evts.Delivered(ledger.DeliveryOf("beta", m)) }); err != nil {
		t.Fatal(err)
	}
	_ = b.client.Flush()
	b.waitHosts(t, "soak")
	b.waitEventsBound(t, "evt.soak")

	var seq atomic.Int64
	var failures atomic.Int64
	stop := make(chan struct{})
	// The submitters wait while the broker boots (gate): what goes into
	// the outbox is the test's choice, not the machine's boot time (a
	// minute of boot on a busy machine was 18,000 more of each).
	var gate ledger.Gate
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				gate.Wait(stop)
				select {
				case <-stop:
					return
				default:
				}
				i := int(seq.Add(1))
				for kind, h := range map[string]*ledger.History{"cmd": cmds, "evt": evts} {
					p := ledger.Payload(kind, i)
					for {
						m, err := a.client.RequestMsg(&nats.Msg{Subject: kind + ".soak", Data: p,
							Header: nats.Header{codec.HeaderMsgID: {string(p)}}}, 15*time.Second)
						if err == nil && m.Header.Get("Nats-Service-Error") == "" {
							h.Submitted(ledger.Op{Origin: kind, Seq: i}, ledger.Acked)
							break
						}
						failures.Add(1)
						select {
						case <-stop:
							return
						case <-time.After(100 * time.Millisecond):
						}
					}
				}
				time.Sleep(5 * time.Millisecond) // a steady stream, spread over the faults
			}
		}()
	}
	stopped := false
	halt := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer halt()

	more := func(n int64) {
		t.Helper()
		target := seq.Load() + n
		meshtest.WaitFor(t, 60*time.Second, fmt.Sprintf("%d more accepted", n), func() bool { return seq.Load() > target })
	}
	offline := func() {
		t.Helper()
		meshtest.WaitFor(t, 20*time.Second, "alpha and beta offline", func() bool {
			return a.b.Status().Broker.State == bridge.StateOffline && b.b.Status().Broker.State == bridge.StateOffline
		})
	}
	more(500)
	rabbit.Stop(t)
	offline()
	more(200) // into the outbox
	gate.Hold()
	rabbit.Start(t)
	gate.Release()
	a.waitConnected(t)
	b.waitConnected(t)
	more(500)
	rabbit.Kill(t)
	offline()
	more(200)
	gate.Hold()
	rabbit.Start(t)
	gate.Release()
	a.waitConnected(t)
	b.waitConnected(t)
	more(500)
	halt()
	meshtest.WaitFor(t, 120*time.Second, "every command and event delivered", func() bool {
		return len(cmds.Check().Lost) == 0 && len(evts.Check().Lost) == 0
	})
	time.Sleep(time.Second) // real time: late duplicates would arrive now
	for name, h := range map[string]*ledger.History{"commands": cmds, "events": evts} {
		r := h.Check()
		t.Logf("%s:\n%s", name, r)
		if r.Acked < 1500 {
			t.Errorf("%s: %d accepted, want a real run (1500 at least)", name, r.Acked)
		}
		if len(r.Lost) > 0 || len(r.DupUnmarked) > 0 || len(r.Unexpected) > 0 {
			t.Errorf("%s: lost %d, unmarked duplicates %d, unexpected %d; want none:\n%s", name, len(r.Lost), len(r.DupUnmarked), len(r.Unexpected), r)
		}
	}
	t.Logf("submissions retried: %d; alpha history: %v", failures.Load(), states(a.b.Status().Broker.History))
}

func states(h []bridge.StateChange) string {
	var s []string
	for _, c := range h {
		s = append(s, c.State)
	}
	return strings.Join(s, ",")
}
