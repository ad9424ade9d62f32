package bridge_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Commands submitted together travel in batches, and each is still a
// command of its own: handled once, its failed attempt tried again alone
// (published again, not its whole batch), nothing lost, nothing twice.
func TestCommandBatches(t *testing.T) {
	t.Parallel()
	vhost := testVhost(t)
	a := newNode(t, "alpha", vhost, nil)
	b := newNode(t, "beta", vhost, nil)
	a.waitConnected(t)
	b.waitConnected(t)

	type seen struct {
		attempt     int
		redelivered string
	}
	var mu sync.Mutex
	handled := map[string][]seen{}
	ok := map[string]bool{}
	const total = 400
	done := make(chan struct{})
	failFirst := func(id string) bool { n, _ := strconv.Atoi(id[2:]); return n%5 == 3 }
	sub, err := b.client.Subscribe("work.batch", func(m *nats.Msg) {
		id := m.Header.Get(codec.HeaderMsgID)
		attempt, _ := strconv.Atoi(m.Header.Get(codec.HeaderAttempt))
		mu.Lock()
		handled[id] = append(handled[id], seen{attempt, m.Header.Get(codec.HeaderRedelivered)})
		fail := attempt == 1 && failFirst(id)
		if !fail && !ok[id] {
			ok[id] = true
			if len(ok) == total {
				close(done)
			}
		}
		mu.Unlock()
		if fail {
			_ = m.RespondMsg(failure("500", "first attempt fails"))
			return
		}
		_ = m.Respond(nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := b.client.Flush(); err != nil {
		t.Fatal(err)
	}
	b.waitHosts(t, "batch")

	submitAll(t, a, "batch", total, 64, func(i int) string { return fmt.Sprintf("c-%d", i) })
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		mu.Lock()
		n := len(ok)
		mu.Unlock()
		t.Fatalf("after 30s, %d of %d commands handled", n, total)
	}
	batches, carried, _ := bridge.CommandBatches(a.b)
	if batches == 0 {
		t.Fatalf("no command batch sent for %d commands from 64 submitters", total)
	}
	meshtest.WaitFor(t, 10*time.Second, "the failed commands of batches published again alone", func() bool {
		_, _, splits := bridge.CommandBatches(b.b)
		return splits > 0
	})
	time.Sleep(300 * time.Millisecond) // room for a duplicate to show
	mu.Lock()
	defer mu.Unlock()
	dup, unexpected := 0, 0
	for id, s := range handled {
		n, err := strconv.Atoi(id[2:])
		if len(id) < 3 || err != nil || n < 0 || n >= total {
			unexpected++
			continue
		}
		want := []seen{{1, "false"}}
		if failFirst(id) {
			want = []seen{{1, "false"}, {2, "true"}}
		}
		if fmt.Sprint(s) != fmt.Sprint(want) {
			dup++
			t.Errorf("%s handled as %v, want %v", id, s, want)
		}
	}
	_, _, splits := bridge.CommandBatches(b.b)
	t.Logf("%d commands: %d in %d batches; %d failed first attempts, %d published again alone; lost %d, not as expected %d, unexpected %d",
		total, carried, batches, total/5, splits, total-len(ok), dup, unexpected)
	if len(ok) != total || unexpected != 0 {
		t.Fatalf("lost %d, unexpected %d", total-len(ok), unexpected)
	}
}

// A node told that some peer does not read batches sends every command
// alone.
func TestNoCommandBatchesForOlderPeers(t *testing.T) {
	vhost := testVhost(t)
	a := newNode(t, "alpha", vhost, nil)
	b := newNode(t, "beta", vhost, nil)
	a.b.SetCommandBatching(false)
	a.waitConnected(t)
	b.waitConnected(t)
	var h handler
	serveStage(t, b, "single", &h)
	submitAll(t, a, "single", 200, 200, nil)
	meshtest.WaitFor(t, 20*time.Second, "200 commands handled", func() bool { return len(h.msgs()) >= 200 })
	if batches, _, _ := bridge.CommandBatches(a.b); batches != 0 {
		t.Fatalf("%d batches sent with batching off", batches)
	}
}

// An older node that takes a batch (it started consuming before anyone
// heard from it) dead-letters it whole, as a message of a type it does not
// know. Once a current node hosts the stage, a replay brings every command
// of the batch back, each on its own.
func TestBatchDeadLetteredByAnOlderNodeReplayed(t *testing.T) {
	vhost := testVhost(t)
	a := newNode(t, "alpha", vhost, nil)
	b := newNode(t, "beta", vhost, nil)
	a.waitConnected(t)
	b.waitConnected(t)
	var h handler
	sub := serveStage(t, b, "legacy", &h)
	_ = sub.Unsubscribe()
	meshtest.WaitFor(t, 10*time.Second, "beta to stop consuming stage legacy", func() bool {
		open, _ := bridge.StageConsumers(b.b, "legacy")
		return open == 0
	})

	// The older node: it handles a command alone and dead-letters a batch
	// as its bridge did, keeping the message's type and body.
	ch := meshtest.Channel(t, vhost)
	ds, err := ch.Consume("cmd.legacy", "older", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	inBatches := map[string]bool{}
	batches := 0
	done := 0 // commands the older node is done with (acked)
	go func() {
		for d := range ds {
			ids := 1
			if d.Type == "commands" {
				entries, err := bridge.DecodeBatchIDs(d.Body)
				if err != nil {
					t.Errorf("a batch from alpha does not decode: %v", err)
				}
				hd := amqp.Table{}
				for k, v := range d.Headers {
					hd[k] = v
				}
				hd[codec.HeaderDeadReason] = `malformed message: type "commands", want "command"`
				hd[codec.HeaderDeadNode] = "older"
				hd[codec.HeaderDeadQueue] = "cmd.legacy"
				hd[codec.HeaderDeadAt] = time.Now().UTC().Format(time.RFC3339Nano)
				if err := ch.Publish("mesh", "dead.legacy", false, false, amqp.Publishing{Headers: hd, Type: d.Type,
					MessageId: d.MessageId, Timestamp: d.Timestamp, DeliveryMode: amqp.Persistent, Body: d.Body}); err != nil {
					t.Errorf("dead-letter the batch: %v", err)
				}
				mu.Lock()
				batches++
				for _, id := range entries {
					inBatches[id] = true
				}
				mu.Unlock()
				ids = len(entries)
			}
			_ = d.Ack(false)
			mu.Lock()
			done += ids
			mu.Unlock()
		}
	}()
	var accepted atomic.Int64 // commands the broker took
	for round := 0; ; round++ {
		var wg sync.WaitGroup
		for i := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				m, err := a.client.RequestMsg(&nats.Msg{Subject: "cmd.legacy", Data: []byte("x"),
					Header: nats.Header{codec.HeaderMsgID: {fmt.Sprintf("r%d-%d", round, i)}}}, 10*time.Second)
				if err == nil && m.Header.Get(codec.HeaderAccepted) != "" {
					accepted.Add(1)
				}
			}()
		}
		wg.Wait()
		mu.Lock()
		n := batches
		mu.Unlock()
		if n > 0 {
			break
		}
		if round == 20 {
			t.Fatal("no batch in 20 rounds of 16 concurrent commands")
		}
	}
	meshtest.WaitFor(t, 10*time.Second, "the older node done with every command it took", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return int64(done) >= accepted.Load()
	})
	_ = ch.Cancel("older", false)

	serveStage(t, b, "legacy", &h)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	mu.Lock()
	wantBatches, want := batches, len(inBatches)
	mu.Unlock()
	n, err := b.b.ReplayDeadLetters(ctx, "legacy", "")
	if err != nil || n != wantBatches {
		t.Fatalf("replay: got %d, %v; want the %d batches", n, err, wantBatches)
	}
	meshtest.WaitFor(t, 10*time.Second, "every command of the batches handled", func() bool { return len(h.msgs()) >= want })
	time.Sleep(200 * time.Millisecond) // real time: room for a command handled twice, whose absence cannot be signalled
	got := map[string]int{}
	for _, m := range h.msgs() {
		got[m.Header.Get(codec.HeaderMsgID)]++
	}
	for id := range inBatches {
		if got[id] != 1 {
			t.Errorf("%s of a dead-lettered batch handled %d times after the replay, want 1", id, got[id])
		}
	}
	if len(got) != want {
		t.Errorf("handled %d commands after the replay, want the %d of the batches", len(got), want)
	}
	t.Logf("%d batches of %d commands dead-lettered by the older node, replayed", wantBatches, want)
}

// A node that stops gracefully stops taking commands and lets its handler
// finish what it holds (up to a second): those commands are acked, not
// delivered again after the stop — with batches, neither are their
// batch's finished ones.
func TestGracefulStopFinishesHandledCommands(t *testing.T) {
	vhost := testVhost(t)
	a := newNode(t, "alpha", vhost, nil)
	b := buildNode(t, "beta", vhost, nil)
	if err := b.b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	a.waitConnected(t)
	b.waitConnected(t)
	const n = 8
	var mu sync.Mutex
	started, finished := 0, 0
	all := make(chan struct{})
	sub, err := b.client.Subscribe("work.finish", func(m *nats.Msg) {
		mu.Lock()
		started++
		if started == n {
			close(all)
		}
		mu.Unlock()
		go func() { // works on each for 300 ms, all at once
			time.Sleep(300 * time.Millisecond)
			_ = m.Respond(nil)
			mu.Lock()
			finished++
			mu.Unlock()
		}()
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = b.client.Flush()
	b.waitHosts(t, "finish")
	submitAll(t, a, "finish", n, n, func(i int) string { return fmt.Sprintf("f-%d", i) })
	select {
	case <-all:
	case <-time.After(10 * time.Second):
		t.Fatalf("%d of %d commands reached beta's handler", started, n)
	}
	start := time.Now()
	if err := b.b.Close(); err != nil {
		t.Fatal(err)
	}
	_ = sub.Unsubscribe()
	mu.Lock()
	f := finished
	mu.Unlock()
	t.Logf("beta stopped in %s with %d of %d commands finished by its handler", time.Since(start).Round(time.Millisecond), f, n)

	// Whatever is left on the broker is delivered to gamma.
	c := newNode(t, "gamma", vhost, nil)
	c.waitConnected(t)
	var h handler
	serveStage(t, c, "finish", &h)
	time.Sleep(time.Second) // real time: room for a command delivered again, whose absence cannot be signalled
	if got := len(h.msgs()); got != 0 {
		t.Fatalf("%d commands delivered again after beta stopped with its handler done with them", got)
	}
}

// submitAll submits count commands to stage from n's program, workers at
// a time, with message ids id(i) (nil: the node's own), and fails the test
// unless the broker accepted every one.
func submitAll(t *testing.T, n *node, stage string, count, workers int, id func(i int) string) {
	t.Helper()
	var wg sync.WaitGroup
	refused := make(chan error, count)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < count; i += workers {
				msg := &nats.Msg{Subject: "cmd." + stage, Data: []byte(strconv.Itoa(i)), Header: nats.Header{}}
				if id != nil {
					msg.Header.Set(codec.HeaderMsgID, id(i))
				}
				m, err := n.client.RequestMsg(msg, 10*time.Second)
				if err == nil && m.Header.Get(codec.HeaderAccepted) != "broker" {
					err = fmt.Errorf("command %d accepted as %q (%s)", i, m.Header.Get(codec.HeaderAccepted), m.Header.Get("Nats-Service-Error"))
				}
				if err != nil {
					refused <- err
				}
			}
		}()
	}
	wg.Wait()
	close(refused)
	for err := range refused {
		t.Fatal(err)
	}
}
