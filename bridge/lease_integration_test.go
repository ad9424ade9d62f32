package bridge_test

import (
	"sync"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/nats-io/nats.go"
)

// progress replies to a command's handler message with a progress
// message: not the result.
func progress(t *testing.T, m *nats.Msg) {
	p := nats.NewMsg(m.Reply)
	p.Header.Set(codec.HeaderProgress, "1")
	if err := m.RespondMsg(p); err != nil {
		t.Errorf("send progress: %v", err)
	}
}

// A handler that takes 3x CommandTimeout while sending progress keeps its
// command: it completes once, with no retry, and the status shows it in
// flight with its lease meanwhile.
func TestLeaseExtendedByProgress(t *testing.T) {
	vhost := testVhost(t)
	const timeout = time.Second
	a := newNode(t, "alpha", vhost, func(c *bridge.Config) { c.CommandTimeout = timeout; c.MaxLease = 10 * timeout })
	a.waitConnected(t)

	var mu sync.Mutex
	var got []*nats.Msg
	done := make(chan struct{})
	sub, err := a.client.QueueSubscribe("work.long", "meshbox", func(m *nats.Msg) {
		mu.Lock()
		got = append(got, m)
		mu.Unlock()
		go func() { // exits after its reply
			end := time.Now().Add(3 * timeout)
			for time.Now().Before(end) {
				time.Sleep(timeout / 4)
				progress(t, m)
			}
			_ = m.Respond([]byte("done"))
			close(done)
		}()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	a.waitHosts(t, "long")

	a.submit(t, "long", []byte("work"), nats.Header{codec.HeaderMsgID: {"long-1"}})
	var seen bridge.CommandStatus
	meshtest.WaitFor(t, 5*time.Second, "the command in flight past its first deadline", func() bool {
		for _, c := range a.b.Status().Commands {
			if c.MsgID == "long-1" && c.AgeSeconds > 1.5*timeout.Seconds() {
				seen = c
				return true
			}
		}
		return false
	})
	if seen.Stage != "long" || seen.Attempt != 1 || seen.State != "handler" || seen.LeaseRemainingSeconds <= 0 || seen.Extended == 0 {
		t.Errorf("command in flight: got %+v", seen)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not finish")
	}
	meshtest.WaitFor(t, 5*time.Second, "the command acked", func() bool { return len(a.b.Status().Commands) == 0 })
	// A lost lease would have brought a second call while the first ran
	// (after 1s and the retry pause); nothing is left open or queued.
	mu.Lock()
	n := len(got)
	mu.Unlock()
	if n != 1 {
		t.Errorf("handler calls: got %d, want 1 (no retry)", n)
	}
	ch := meshtest.Channel(t, vhost)
	q, err := ch.QueueDeclarePassive("cmd.long", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if q.Messages != 0 {
		t.Errorf("cmd.long holds %d messages after the command completed", q.Messages)
	}
}

// A handler that stops sending progress (it is killed mid-lease) loses its
// command at the deadline its last progress set, not before, and the
// command is retried on another node hosting the stage, marked as a
// possible duplicate with the attempt counted.
func TestLeaseLostWithoutProgress(t *testing.T) {
	vhost := testVhost(t)
	const timeout = time.Second
	edit := func(c *bridge.Config) { c.CommandTimeout = timeout; c.MaxLease = 10 * timeout }
	a := newNode(t, "alpha", vhost, edit)
	b := newNode(t, "beta", vhost, edit)
	a.waitConnected(t)
	b.waitConnected(t)

	// alpha's worker has a connection of its own, closed to kill it.
	worker := connect(t, a.srv, "worker")
	first := make(chan time.Time, 1)
	lastProgress := make(chan time.Time, 1)
	sub, err := worker.QueueSubscribe("work.long", "meshbox", func(m *nats.Msg) {
		first <- time.Now()
		go func() { // exits after killing the worker
			var at time.Time
			for range 4 {
				time.Sleep(timeout * 2 / 5)
				progress(t, m)
				at = time.Now()
			}
			_ = worker.Flush()
			lastProgress <- at
			worker.Close() // killed mid-lease: no result, no more progress
		}()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := worker.Flush(); err != nil {
		t.Fatal(err)
	}
	a.waitHosts(t, "long")

	b.submit(t, "long", []byte("work"), nats.Header{codec.HeaderMsgID: {"long-2"}})
	var t0 time.Time
	select {
	case t0 = <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("alpha's worker got nothing")
	}
	var hb handler
	serveStage(t, b, "long", &hb)
	last := <-lastProgress

	var retry *nats.Msg
	meshtest.WaitFor(t, 15*time.Second, "the retry on beta", func() bool {
		if ms := hb.msgs(); len(ms) > 0 {
			retry = ms[0]
			return true
		}
		return false
	})
	at := time.Now()
	if at.Sub(t0) < last.Sub(t0)+timeout-100*time.Millisecond {
		t.Errorf("retried %s after the first delivery; the last progress (at %s) held it until %s",
			at.Sub(t0), last.Sub(t0), last.Sub(t0)+timeout)
	}
	if id := retry.Header.Get(codec.HeaderMsgID); id != "long-2" {
		t.Errorf("message id of the retry: got %q, want long-2", id)
	}
	if got := retry.Header.Get(codec.HeaderAttempt); got != "2" {
		t.Errorf("attempt of the retry: got %q, want 2", got)
	}
	if got := retry.Header.Get(codec.HeaderRedelivered); got != "true" {
		t.Errorf("retry marked redelivered: got %q, want true", got)
	}
	meshtest.WaitFor(t, 5*time.Second, "alpha forgets the lost command", func() bool { return len(a.b.Status().Commands) == 0 })
}

// While the link is down a local command's handler holds its lease the
// same way: progress is not the result, so the command stays in the
// outbox until the handler's result, and runs once.
func TestLeaseOfALocalCommand(t *testing.T) {
	vhost := testVhost(t)
	const timeout = time.Second
	px, proxied := brokerProxy(t, vhost)
	a := newNode(t, "alpha", proxied, func(c *bridge.Config) { c.CommandTimeout = timeout; c.MaxLease = 10 * timeout })
	a.waitConnected(t)
	var mu sync.Mutex
	calls := 0
	done := make(chan struct{})
	sub, err := a.client.QueueSubscribe("work.local", "meshbox", func(m *nats.Msg) {
		mu.Lock()
		calls++
		mu.Unlock()
		go func() { // exits after its reply
			end := time.Now().Add(3 * timeout)
			for time.Now().Before(end) {
				time.Sleep(timeout / 4)
				progress(t, m)
			}
			_ = m.Respond(nil)
			close(done)
		}()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	a.waitHosts(t, "local")
	px.Cut(t)
	meshtest.WaitFor(t, 10*time.Second, "alpha offline", func() bool { return a.b.Status().Broker.State == bridge.StateOffline })

	if m := a.submit(t, "local", []byte("x"), nil); m.Header.Get(codec.HeaderAccepted) != "local" {
		t.Fatalf("accepted as %q, want local", m.Header.Get(codec.HeaderAccepted))
	}
	deadline := time.Now().Add(2 * timeout)
	for time.Now().Before(deadline) {
		if d := a.b.Status().Outbox.Depth; d != 1 {
			t.Fatalf("outbox depth %d while the handler still works, want 1 (progress is not the result)", d)
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not finish")
	}
	meshtest.WaitFor(t, 5*time.Second, "outbox empty", func() bool { return a.b.Status().Outbox.Depth == 0 })
	mu.Lock()
	defer mu.Unlock()
	if calls != 1 {
		t.Errorf("handler calls: got %d, want 1", calls)
	}
}

// Progress extends a lease only up to MaxLease after the command was
// handed out: a handler that sends progress forever loses the command
// there, and it is retried, marked.
func TestLeaseEndsAtMaxLease(t *testing.T) {
	vhost := testVhost(t)
	const timeout, maxLease = time.Second, 2 * time.Second
	a := newNode(t, "alpha", vhost, func(c *bridge.Config) { c.CommandTimeout = timeout; c.MaxLease = maxLease })
	a.waitConnected(t)

	stop := make(chan struct{})
	defer close(stop)
	type call struct {
		at time.Time
		m  *nats.Msg
	}
	calls := make(chan call, 4)
	sub, err := a.client.QueueSubscribe("work.endless", "meshbox", func(m *nats.Msg) {
		calls <- call{time.Now(), m}
		if m.Header.Get(codec.HeaderAttempt) != "1" {
			_ = m.Respond(nil)
			return
		}
		go func() { // progress forever; exits when the test ends
			for {
				select {
				case <-stop:
					return
				case <-time.After(timeout / 4):
					p := nats.NewMsg(m.Reply) // errors ignored: it may outlive the test's connection
					p.Header.Set(codec.HeaderProgress, "1")
					_ = m.RespondMsg(p)
				}
			}
		}()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	a.waitHosts(t, "endless")

	a.submit(t, "endless", []byte("x"), nil)
	var first, second call
	for i, c := range []*call{&first, &second} {
		select {
		case *c = <-calls:
		case <-time.After(15 * time.Second):
			t.Fatalf("delivery %d did not come", i+1)
		}
	}
	// Retried after MaxLease and the retry pause (at most 250ms at the
	// first attempt), not at CommandTimeout, nor held for ever.
	if gap := second.at.Sub(first.at); gap < maxLease-50*time.Millisecond || gap > maxLease+2*time.Second {
		t.Errorf("retry %s after the first delivery, want about MaxLease (%s)", gap, maxLease)
	}
	if got := second.m.Header.Get(codec.HeaderAttempt); got != "2" {
		t.Errorf("attempt of the retry: got %q, want 2", got)
	}
	if got := second.m.Header.Get(codec.HeaderRedelivered); got != "true" {
		t.Errorf("retry marked redelivered: got %q, want true", got)
	}
}
