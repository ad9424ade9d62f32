package bridge_test

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/nats-io/nats.go"
)

// ledger records deliveries by payload, for a Jepsen-style check: every
// accepted message delivered (0 lost), extra deliveries only when marked
// as possible duplicates, nothing unexpected.
type ledger struct {
	mu         sync.Mutex
	accepted   map[string]bool
	deliveries map[string][]bool // payload -> redelivered flag of each delivery
}

func newLedger() *ledger {
	return &ledger{accepted: map[string]bool{}, deliveries: map[string][]bool{}}
}

func (l *ledger) accept(p string) {
	l.mu.Lock()
	l.accepted[p] = true
	l.mu.Unlock()
}

func (l *ledger) deliver(m *nats.Msg) {
	l.mu.Lock()
	l.deliveries[string(m.Data)] = append(l.deliveries[string(m.Data)], m.Header.Get(bridge.HeaderRedelivered) == "true")
	l.mu.Unlock()
}

func (l *ledger) delivered() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for p := range l.accepted {
		if len(l.deliveries[p]) > 0 {
			n++
		}
	}
	return n
}

// check returns lost, unmarked duplicates, marked duplicates, unexpected.
func (l *ledger) check() (lost, unmarked, marked, unexpected []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for p := range l.accepted {
		ds := l.deliveries[p]
		if len(ds) == 0 {
			lost = append(lost, p)
			continue
		}
		for _, redelivered := range ds[1:] {
			if redelivered {
				marked = append(marked, p)
			} else {
				unmarked = append(unmarked, p)
			}
		}
	}
	for p := range l.deliveries {
		if !l.accepted[p] {
			unexpected = append(unexpected, p)
		}
	}
	return
}

// TestBrokerRestartLosesNothing runs commands and events from alpha to beta
// through a graceful broker restart and a SIGKILL of the broker.
func TestBrokerRestartLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a private broker")
	}
	rabbit := meshtest.NewRabbitMQ(t)
	url := rabbit.URL()
	a := newNode(t, "alpha", url, nil)
	b := newNode(t, "beta", url, nil)
	a.waitConnected(t)
	b.waitConnected(t)
	cmds, evts := newLedger(), newLedger()
	if _, err := b.client.QueueSubscribe("work.soak", "meshbox", func(m *nats.Msg) {
		cmds.deliver(m)
		_ = m.Respond(nil)
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.Subscribe("evt.soak", evts.deliver); err != nil {
		t.Fatal(err)
	}
	_ = b.client.Flush()
	b.waitHosts(t, "soak")

	var seq atomic.Int64
	var failures atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := seq.Add(1)
				for kind, l := range map[string]*ledger{"cmd": cmds, "evt": evts} {
					p := fmt.Sprintf("%s-%d", kind, i)
					for {
						m, err := a.client.RequestMsg(&nats.Msg{Subject: kind + ".soak", Data: []byte(p),
							Header: nats.Header{bridge.HeaderMsgID: {p}}}, 15*time.Second)
						if err == nil && m.Header.Get("Nats-Service-Error") == "" {
							l.accept(p)
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
	rabbit.Start(t)
	a.waitConnected(t)
	b.waitConnected(t)
	more(500)
	rabbit.Kill(t)
	offline()
	more(200)
	rabbit.Start(t)
	a.waitConnected(t)
	b.waitConnected(t)
	more(500)
	halt()
	meshtest.WaitFor(t, 120*time.Second, "every command and event delivered", func() bool {
		return cmds.delivered() == len(cmds.accepted) && evts.delivered() == len(evts.accepted)
	})
	time.Sleep(time.Second) // late duplicates would arrive now
	for name, l := range map[string]*ledger{"commands": cmds, "events": evts} {
		lost, unmarked, marked, unexpected := l.check()
		t.Logf("%s: %d accepted, %d lost, %d duplicates marked as redeliveries, %d unmarked duplicates, %d unexpected",
			name, len(l.accepted), len(lost), len(marked), len(unmarked), len(unexpected))
		if len(l.accepted) < 1500 {
			t.Errorf("%s: %d accepted, want a real run (1500 at least)", name, len(l.accepted))
		}
		if len(lost) > 0 || len(unmarked) > 0 || len(unexpected) > 0 {
			t.Errorf("%s: lost %v, unmarked duplicates %v, unexpected %v", name, head(lost), head(unmarked), head(unexpected))
		}
	}
	t.Logf("submissions retried: %d; alpha history: %v", failures.Load(), states(a.b.Status().Broker.History))
}

func head(s []string) string {
	if len(s) > 10 {
		return strings.Join(s[:10], ",") + ",... (" + strconv.Itoa(len(s)) + ")"
	}
	return strings.Join(s, ",")
}

func states(h []bridge.StateChange) string {
	var s []string
	for _, c := range h {
		s = append(s, c.State)
	}
	return strings.Join(s, ",")
}
