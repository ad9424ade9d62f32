package bridge_test

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/meshbox/meshbox/internal/wire"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/nats-io/nats.go"
)

// orderedHandler serves work.<stage> with workers in a queue group, so
// that commands run side by side, and records per order key what ran
// when.
type orderedHandler struct {
	mu      sync.Mutex
	started map[string][]string // order key ("" for none) -> bodies in the order they started
	running map[string]int      // order key -> commands running now
	overlap map[string]int      // order key -> most running at once
	now     atomic.Int64        // commands running now, all keys
	most    atomic.Int64        // most running at once, all keys
}

func serveOrdered(t *testing.T, n *node, stage string, workers int) *orderedHandler {
	t.Helper()
	h := &orderedHandler{started: map[string][]string{}, running: map[string]int{}, overlap: map[string]int{}}
	for range workers {
		sub, err := n.client.QueueSubscribe("work."+stage, "workers", func(m *nats.Msg) {
			key := m.Header.Get(codec.HeaderOrderKey)
			h.mu.Lock()
			h.started[key] = append(h.started[key], string(m.Data))
			h.running[key]++
			h.overlap[key] = max(h.overlap[key], h.running[key])
			h.mu.Unlock()
			if cur := h.now.Add(1); cur > h.most.Load() {
				h.most.Store(cur)
			}
			time.Sleep(3 * time.Millisecond) // the work
			h.now.Add(-1)
			h.mu.Lock()
			h.running[key]--
			h.mu.Unlock()
			_ = m.Respond(nil)
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	if err := n.client.Flush(); err != nil {
		t.Fatal(err)
	}
	n.waitHosts(t, stage)
	return h
}

func (h *orderedHandler) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, b := range h.started {
		n += len(b)
	}
	return n
}

// TestCommandsInOrderPerKey: commands with the same Meshbox-Order-Key
// reach the handler one at a time, in the order they were submitted, while
// commands of other keys (and without one) run beside them, on the one
// stage queue.
func TestCommandsInOrderPerKey(t *testing.T) {
	vhost := testVhost(t)
	a := newNode(t, "alpha", vhost, nil)
	b := newNode(t, "beta", vhost, nil)
	a.waitConnected(t)
	b.waitConnected(t)
	h := serveOrdered(t, b, "ledger", 8)

	const keys, each = 6, 30
	var wg sync.WaitGroup
	var refused atomic.Int64
	submit := func(key string, i int) {
		m := nats.NewMsg("cmd.ledger")
		m.Data = []byte(fmt.Sprintf("%s/%03d", key, i))
		if key != "" {
			m.Header.Set(codec.HeaderOrderKey, key)
		}
		r, err := a.client.RequestMsg(m, 10*time.Second)
		if err != nil || r.Header.Get(codec.HeaderAccepted) != "broker" {
			refused.Add(1)
		}
	}
	for k := range keys {
		wg.Add(1)
		go func() { // one submitter per key, in order: exits when its commands are accepted
			defer wg.Done()
			for i := range each {
				submit(fmt.Sprintf("account-%d", k), i)
			}
		}()
	}
	for range 4 {
		wg.Add(1)
		go func() { // commands without a key, beside them
			defer wg.Done()
			for i := range each {
				submit("", i)
			}
		}()
	}
	wg.Wait()
	if n := refused.Load(); n != 0 {
		t.Fatalf("%d commands not accepted by the broker", n)
	}
	total := keys*each + 4*each
	meshtest.WaitFor(t, 30*time.Second, "every command handled", func() bool { return h.count() >= total })
	time.Sleep(100 * time.Millisecond) // a redelivery would show up now
	h.mu.Lock()
	defer h.mu.Unlock()
	for k := range keys {
		key := fmt.Sprintf("account-%d", k)
		got := h.started[key]
		if len(got) != each {
			t.Errorf("key %s: %d commands handled, want %d", key, len(got), each)
			continue
		}
		for i, body := range got {
			if want := fmt.Sprintf("%s/%03d", key, i); body != want {
				t.Errorf("key %s: command %d started was %s, want %s (submission order)", key, i, body, want)
				break
			}
		}
		if h.overlap[key] != 1 {
			t.Errorf("key %s: %d commands ran at once, want one at a time", key, h.overlap[key])
		}
	}
	// The control: the handler does run commands side by side, so the
	// order above is the node's doing, not a serial handler's.
	if h.overlap[""] < 2 || h.most.Load() < 3 {
		t.Errorf("commands without a key ran at most %d at once, all keys %d: the handler never ran them side by side", h.overlap[""], h.most.Load())
	}
	t.Logf("%d commands; without a key up to %d at once, all keys up to %d", total, h.overlap[""], h.most.Load())
}

// TestOrderKeyRefusals: an order key that is not an id is refused with a
// 400 and never accepted, and so is any order key while a node of the mesh
// is too old to keep it; the same command without the key goes through.
func TestOrderKeyRefusals(t *testing.T) {
	vhost := testVhost(t)
	a := newNode(t, "alpha", vhost, nil)
	b := newNode(t, "beta", vhost, nil)
	a.waitConnected(t)
	b.waitConnected(t)
	h := serveOrdered(t, b, "ledger", 1)

	send := func(key string) (*nats.Msg, error) {
		m := nats.NewMsg("cmd.ledger")
		m.Data = []byte("x")
		if key != "" {
			m.Header.Set(codec.HeaderOrderKey, key)
		}
		return a.client.RequestMsg(m, 10*time.Second)
	}
	refusedWith := func(what, key, text string) {
		t.Helper()
		r, err := send(key)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		se := wire.ErrorOf(r.Header)
		if se == nil || se.Code != 400 || !strings.Contains(se.Text, text) {
			t.Fatalf("%s: reply %v (accepted %q), want a 400 saying %q", what, se, r.Header.Get(codec.HeaderAccepted), text)
		}
	}
	refusedWith("an order key with a space", "a b", "not a valid order key")
	refusedWith("an order key past 128 bytes", strings.Repeat("k", 129), "not a valid order key")
	a.b.SetOrderKeys(false)
	refusedWith("an order key in a mesh with an older node", "account-1", "upgrade every node")
	if r, err := send(""); err != nil || r.Header.Get(codec.HeaderAccepted) != "broker" {
		t.Fatalf("the control without a key: %v %v, want accepted", r, err)
	}
	a.b.SetOrderKeys(true)
	if r, err := send("account-1"); err != nil || r.Header.Get(codec.HeaderAccepted) != "broker" {
		t.Fatalf("the control with a good key: %v %v, want accepted", r, err)
	}
	meshtest.WaitFor(t, 10*time.Second, "both accepted commands handled", func() bool { return h.count() >= 2 })
	time.Sleep(200 * time.Millisecond)
	if n := h.count(); n != 2 {
		t.Fatalf("the handler saw %d commands, want the 2 accepted ones", n)
	}
}
