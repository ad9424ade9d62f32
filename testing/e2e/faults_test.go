package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/testing/ledger"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
	"github.com/nats-io/nats.go"
)

// TestBrokerFaultsLoseNothing runs at least 2,500 commands and 2,500
// events from node alpha to node beta while the broker is stopped and
// started once and killed once: each kind of fault once, with submissions
// going to the outbox during it and draining after it. Every submission alpha
// acknowledged must reach beta's handler or subscriber; duplicates only
// as marked redeliveries.
func TestBrokerFaultsLoseNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	const (
		minEach = 2500
		maxEach = 40000
		rate    = 250 // per second, commands and events each
		// outboxed: submissions in alpha's outbox before the broker starts
		// again (a second of the load).
		outboxed = 2 * rate
	)
	t.Parallel() // a broker of its own: runs beside the other tests that have one
	rmq := meshtest.NewRabbitMQ(t)
	amqpURL := rmq.URL()
	beta := startMeshNode(t, "beta", amqpURL, bridgeConfig{})
	alpha := startMeshNode(t, "alpha", amqpURL, bridgeConfig{})

	cmds, evts := ledger.NewHistory(), ledger.NewHistory()
	hnc := natsConn(t, beta)
	csub, err := hnc.QueueSubscribe("work.load", "handlers", func(m *nats.Msg) {
		cmds.Delivered(ledger.DeliveryOf("beta", m))
		_ = m.Respond(nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	esub, err := hnc.Subscribe("evt.load", func(m *nats.Msg) { evts.Delivered(ledger.DeliveryOf("beta", m)) })
	if err != nil {
		t.Fatal(err)
	}
	flush(t, hnc)
	waitListening(t, beta, "evt.load", alpha)
	for _, s := range []*nats.Subscription{csub, esub} {
		if err := s.SetPendingLimits(-1, -1); err != nil {
			t.Fatal(err)
		}
	}
	flush(t, hnc)
	waitConsumers(t, rmq, amqpURL, "cmd.load", 1)

	gate := &ledger.Gate{}
	cl := &ledger.Load{NC: natsConn(t, alpha), Subject: "cmd.load", Origin: "alpha", History: cmds, Gate: gate}
	el := &ledger.Load{NC: natsConn(t, alpha), Subject: "evt.load", Origin: "alpha", History: evts, Gate: gate}
	stop := make(chan struct{})
	stopLoad := sync.OnceFunc(func() { close(stop) })
	var wg sync.WaitGroup
	// A test that ends early (a broker that does not start) leaves no
	// load held or running.
	t.Cleanup(func() {
		stopLoad()
		gate.Release()
		wg.Wait()
	})
	for _, l := range []*ledger.Load{cl, el} {
		wg.Add(1)
		go func() { // load generator: exits when stop is closed and the minimum is submitted
			defer wg.Done()
			l.Run(8, rate, minEach, maxEach, stop)
		}()
	}

	// The faults, on the test goroutine (the harness requires it).
	start := time.Now()
	if !meshtest.Poll(time.Minute, func() bool { return cl.Started() >= 500 && el.Started() >= 500 }) {
		t.Fatal("the load did not start")
	}
	for i, fault := range []string{"stop", "kill"} {
		if fault == "kill" {
			rmq.Kill(t)
		} else {
			rmq.Stop(t)
		}
		meshtest.WaitStatus(t, alpha.HTTPURL(), time.Minute, "submissions in alpha's outbox", func(s appliance.Status) bool {
			return s.Broker.State != "connected" && s.Outbox.Depth >= outboxed
		})
		// The load waits while the broker boots: what a fault puts in
		// the outbox is the test's choice, not the machine's boot time
		// (a minute of boot on a busy machine was 15,000 more each).
		gate.Hold()
		rmq.Start(t)
		gate.Release()
		t.Logf("fault %d (%s) done at %s: %d commands, %d events submitted so far",
			i+1, fault, time.Since(start).Round(time.Second), cl.Started(), el.Started())
		meshtest.WaitStatus(t, alpha.HTTPURL(), time.Minute, "alpha's link back and its outbox drained", func(s appliance.Status) bool {
			return s.Broker.State == "connected" && s.Outbox.Depth == 0
		})
	}
	stopLoad()
	wg.Wait()
	t.Logf("load done after %s: %s; %s", time.Since(start).Round(time.Second), cl.Summary(), el.Summary())

	// Everything acknowledged must arrive once the link is back.
	meshtest.WaitStatus(t, alpha.HTTPURL(), 2*time.Minute, "alpha's outbox drained", func(s appliance.Status) bool {
		return s.Broker.State == "connected" && s.Outbox.Depth == 0
	})
	meshtest.Poll(2*time.Minute, func() bool {
		return len(cmds.Check().Lost) == 0 && len(evts.CheckAt("beta").Lost) == 0
	})
	time.Sleep(2 * time.Second) // room for late duplicates
	for _, c := range []struct {
		what string
		r    ledger.Result
	}{
		{"commands", cmds.Check()},
		{"events", evts.CheckAt("beta")},
	} {
		t.Logf("checker, %s (submitted concurrently: order inversions are not judged here):\n%s", c.what, c.r)
		if c.r.Acked < minEach {
			t.Errorf("%s: %d acknowledged, want at least %d for the run to mean something", c.what, c.r.Acked, minEach)
		}
		if !c.r.Valid() {
			t.Errorf("%s: lost %d, unmarked duplicates %d, changed ids %d, unexpected %d; want 0 each:\n%s",
				c.what, len(c.r.Lost), len(c.r.DupUnmarked), len(c.r.IDChanged), len(c.r.Unexpected), c.r)
		}
	}
}

// TestOutboxWhileBrokerDown submits 10,000 commands on alpha while the
// broker is down for it (its connections refused): all are accepted into
// the outbox, a full outbox refuses with 507, alpha is killed (SIGKILL)
// and started again, and once the broker returns every accepted command
// reaches beta's handler in the order alpha accepted them.
func TestOutboxWhileBrokerDown(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	const (
		n         = 10000
		maxBytes  = 2 << 20
		bigSize   = 256 << 10
		maxFiller = 40
	)
	t.Parallel()
	// The broker is gone for alpha: it reaches the broker through a proxy
	// that is closed (connections refused) and opened again. The broker
	// keeping what it holds across its own restart is
	// TestBrokerFaultsLoseNothing's.
	rmq, amqpURL, alphaURL, px := vhostBehindProxy(t)
	// One consumer (no adaptive credit): beta's reader hands the commands
	// to its handler in the queue's order over one NATS connection, and the
	// handler answers them one after another. With several consumers,
	// commands are handled concurrently and their order is not kept. (A
	// prefetch of 1 keeps the order too, at a round trip and a quorum
	// settlement per command: a minute for 10,000.)
	beta := startMeshNode(t, "beta", amqpURL, bridgeConfig{Prefetch: 64, MaxStagePrefetch: 64})
	alphaData := t.TempDir()
	alphaConfig := bridgeConfig{OutboxMaxBytes: maxBytes}
	alpha := startMeshNode(t, "alpha", alphaURL, alphaConfig, "--data", alphaData)
	h := ledger.NewHistory()
	hnc := natsConn(t, beta)
	sub, err := hnc.QueueSubscribe("work.batch", "handlers", func(m *nats.Msg) {
		h.Delivered(ledger.DeliveryOf("beta", m))
		_ = m.Respond(nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	flush(t, hnc)
	waitConsumers(t, rmq, amqpURL, "cmd.batch", 1)

	px.Cut(t)
	meshtest.WaitStatus(t, alpha.HTTPURL(), 30*time.Second, "alpha's link down", func(s appliance.Status) bool { return s.Broker.State != "connected" })

	// Pipelined on one connection: alpha receives, and so accepts, the
	// commands in sequence order.
	nc := natsConn(t, alpha)
	inbox := nats.NewInbox()
	var mu sync.Mutex
	answers := map[int]*nats.Msg{}
	rsub, err := nc.Subscribe(inbox+".*", func(m *nats.Msg) {
		seq, err := strconv.Atoi(m.Subject[len(inbox)+1:])
		if err != nil {
			return
		}
		mu.Lock()
		answers[seq] = m
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = rsub.SetPendingLimits(-1, -1)
	start := time.Now()
	for seq := range n {
		if err := nc.PublishMsg(&nats.Msg{Subject: "cmd.batch", Reply: inbox + "." + strconv.Itoa(seq), Data: ledger.Payload("alpha", seq)}); err != nil {
			t.Fatal(err)
		}
	}
	flush(t, nc)
	answered := func() int { mu.Lock(); defer mu.Unlock(); return len(answers) }
	if !meshtest.Poll(2*time.Minute, func() bool { return answered() == n }) {
		t.Fatalf("after 2m: %d of %d submissions answered", answered(), n)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d commands accepted into the outbox in %s", n, time.Since(start).Round(time.Millisecond))
	notOutbox := ledger.Tally{}
	for seq := range n {
		m := answers[seq]
		if code, text := natstest.ServiceError(m); code != 0 {
			h.Submitted(ledger.Op{Origin: "alpha", Seq: seq}, ledger.Refused)
			notOutbox[fmt.Sprintf("error %d %s", code, ledger.Clip(text))]++
			continue
		}
		h.Submitted(ledger.Op{Origin: "alpha", Seq: seq}, ledger.Acked)
		if a := m.Header.Get(hdrAccepted); a != "outbox" {
			notOutbox["accepted by "+a]++
		}
	}
	if len(notOutbox) != 0 {
		t.Errorf("want all %d accepted into the outbox, got %s", n, notOutbox)
	}
	st := meshtest.Status(t, alpha.HTTPURL())
	if st.Outbox.Depth != n || st.Outbox.MaxBytes != maxBytes {
		t.Errorf("outbox: got depth %d max_bytes %d, want %d and %d", st.Outbox.Depth, st.Outbox.MaxBytes, n, maxBytes)
	}

	// Fill it up: large commands until the outbox refuses one.
	var full string
	big := 0
	for i := range maxFiller {
		seq := n + i
		o, resp, err := ledger.Submit(nc, "cmd.batch", ledger.PaddedPayload("alpha", seq, bigSize), 20*time.Second)
		h.Submitted(ledger.Op{Origin: "alpha", Seq: seq}, o)
		if o == ledger.Acked {
			big++
			continue
		}
		if err != nil {
			t.Fatalf("large command %d: no answer: %v", i, err)
		}
		code, text := natstest.ServiceError(resp)
		if code != 507 || !strings.Contains(text, "outbox full") {
			t.Fatalf("large command %d: got error %d %q, want 507 outbox full", i, code, text)
		}
		full = text
		break
	}
	if full == "" {
		t.Fatalf("%d large commands of %d bytes accepted into an outbox of %d bytes; want a refusal", maxFiller, bigSize, maxBytes)
	}
	st = meshtest.Status(t, alpha.HTTPURL())
	t.Logf("outbox full after %d large commands: %q; status %+v", big, full, st.Outbox)
	if st.Outbox.Bytes > maxBytes || st.Outbox.Depth != int64(n+big) {
		t.Errorf("full outbox: got depth %d bytes %d, want depth %d and at most %d bytes", st.Outbox.Depth, st.Outbox.Bytes, n+big, maxBytes)
	}
	if h.Count() != 0 {
		t.Errorf("%d commands handled while the broker was down; want 0 (beta hosts the stage, not alpha)", h.Count())
	}

	// What alpha acknowledged survives kill -9: the outbox is on disk.
	alpha.Kill()
	alpha = meshtest.StartProcess(t, meshNodeArgs(t, "alpha", alphaURL, alphaConfig, "--data", alphaData)...)
	if st := meshtest.Status(t, alpha.HTTPURL()); st.Outbox.Depth != int64(n+big) {
		t.Errorf("outbox after kill -9 and restart: got depth %d, want %d", st.Outbox.Depth, n+big)
	}

	px.Restore(t)
	start = time.Now()
	if !meshtest.Poll(3*time.Minute, func() bool { return len(h.Check().Lost) == 0 }) {
		t.Errorf("after 3m: %d commands not delivered", len(h.Check().Lost))
	}
	t.Logf("outbox delivered in %s", time.Since(start).Round(time.Millisecond))
	meshtest.WaitStatus(t, alpha.HTTPURL(), time.Minute, "alpha's outbox empty", func(s appliance.Status) bool { return s.Outbox.Depth == 0 })
	time.Sleep(time.Second) // room for duplicates
	r := h.Check()
	t.Logf("checker:\n%s", r)
	if !r.Valid() {
		t.Errorf("lost %d, unmarked duplicates %d, unexpected %d (a refused command delivered?); want 0 each:\n%s",
			len(r.Lost), len(r.DupUnmarked), len(r.Unexpected), r)
	}
	if inv := r.TotalInversions(); inv != 0 {
		t.Errorf("order: got %d inversions, want the order alpha accepted them in:\n%s", inv, r)
	}
}

// TestHandlerProcess is not a scenario: it is the body of the handler
// process that TestCommandRedeliveredAfterHandlerKilled starts (this test
// binary run again with E2E_HANDLER_NATS set) and kills. Without that
// variable it returns at once.
func TestHandlerProcess(t *testing.T) {
	natsURL := os.Getenv("E2E_HANDLER_NATS")
	if natsURL == "" {
		return
	}
	stage, mode := os.Getenv("E2E_HANDLER_STAGE"), os.Getenv("E2E_HANDLER_MODE")
	cred, err := nats.NkeyOptionFromSeed(os.Getenv("E2E_HANDLER_CREDS"))
	if err != nil {
		fmt.Println("HANDLER FAILED", err)
		os.Exit(1)
	}
	nc, err := nats.Connect(natsURL, cred)
	if err != nil {
		fmt.Println("HANDLER FAILED", err)
		os.Exit(1)
	}
	_, err = nc.QueueSubscribe("work."+stage, "handlers", func(m *nats.Msg) {
		fmt.Printf("HANDLED id=%s attempt=%s redelivered=%s body=%s\n",
			m.Header.Get(hdrMsgID), m.Header.Get(hdrAttempt), m.Header.Get(hdrRedelivered), m.Data)
		if mode == "ack" {
			_ = m.Respond(nil)
		}
	})
	if err == nil {
		err = nc.Flush()
	}
	if err != nil {
		fmt.Println("HANDLER FAILED", err)
		os.Exit(1)
	}
	fmt.Println("HANDLER READY")
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sigs:
	case <-time.After(5 * time.Minute): // orphaned: the parent is gone
	}
	nc.Close()
	os.Exit(0)
}

// handlerProc is a handler process started by startHandler.
type handlerProc struct {
	cmd   *exec.Cmd
	lines chan string // HANDLED lines
	done  chan struct{}
}

// startHandler runs the handler process for stage on node p, as a local
// program allowed to serve the stage; mode "hang" never answers, "ack"
// answers success. It is killed in cleanup.
func startHandler(t *testing.T, p *meshtest.Process, stage, mode string) *handlerProc {
	t.Helper()
	creds := meshtest.AddProgram(t, p.NATSURL(), p.DataDir(), programs.Program{Name: "handler-" + mode, Serve: []string{stage}})
	cmd := exec.Command(os.Args[0], "-test.run=^TestHandlerProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "E2E_HANDLER_NATS="+p.NATSURL(), "E2E_HANDLER_CREDS="+creds, "E2E_HANDLER_STAGE="+stage, "E2E_HANDLER_MODE="+mode)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start handler process: %v", err)
	}
	hp := &handlerProc{cmd: cmd, lines: make(chan string, 100), done: make(chan struct{})}
	ready := make(chan string, 1)
	go func() { // reads the handler's output; exits when the process is gone
		defer close(hp.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "HANDLER "):
				ready <- line
			case strings.HasPrefix(line, "HANDLED "):
				hp.lines <- line
			}
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-hp.done
	})
	select {
	case line := <-ready:
		if line != "HANDLER READY" {
			t.Fatalf("handler process: %s", line)
		}
	case <-hp.done:
		t.Fatal("handler process exited before it was ready")
	case <-time.After(20 * time.Second):
		t.Fatal("handler process not ready after 20s")
	}
	return hp
}

// kill sends SIGKILL and waits until the process is gone.
func (hp *handlerProc) kill(t *testing.T) {
	t.Helper()
	if err := hp.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill handler process: %v", err)
	}
	<-hp.done
}

// next returns the next HANDLED line's fields, failing after d.
func (hp *handlerProc) next(t *testing.T, d time.Duration, what string) map[string]string {
	t.Helper()
	select {
	case line := <-hp.lines:
		return parseHandled(line)
	case <-time.After(d):
		t.Fatalf("after %s: %s", d, what)
	}
	return nil
}

// parseHandled splits "HANDLED k=v k=v ..." (body last, may hold spaces).
func parseHandled(line string) map[string]string {
	kv := map[string]string{}
	rest := strings.TrimPrefix(line, "HANDLED ")
	for rest != "" {
		if strings.HasPrefix(rest, "body=") {
			kv["body"] = rest[len("body="):]
			break
		}
		field, after, _ := strings.Cut(rest, " ")
		k, v, _ := strings.Cut(field, "=")
		kv[k] = v
		rest = after
	}
	return kv
}

// TestCommandRedeliveredAfterHandlerKilled kills (SIGKILL) the handler
// process while it holds a command: the command is handled again by the
// next handler process, as attempt 2 and marked as a redelivery.
func TestCommandRedeliveredAfterHandlerKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	rmq := meshtest.RabbitMQ(t)
	amqpURL := rmq.Vhost(t)
	// A short command timeout: the redelivery waits for it.
	beta := startMeshNode(t, "beta", amqpURL, bridgeConfig{CommandTimeout: "5s"})
	alpha := startMeshNode(t, "alpha", amqpURL, bridgeConfig{})
	first := startHandler(t, beta, "chore", "hang")
	waitConsumers(t, rmq, amqpURL, "cmd.chore", 1)

	nc := natsConn(t, alpha)
	if o, resp, err := ledger.Submit(nc, "cmd.chore", ledger.Payload("alpha", 1), 10*time.Second); o != ledger.Acked {
		code, text := natstest.ServiceError(resp)
		t.Fatalf("submit: got %v (error %d %s), want accepted", err, code, text)
	}
	got := first.next(t, 15*time.Second, "the first handler saw no command")
	if got["attempt"] != "1" || got["redelivered"] != "false" || got["body"] != "alpha:1" || got["id"] == "" {
		t.Fatalf("first delivery: got %v, want attempt 1, not redelivered, body alpha:1, an id", got)
	}
	first.kill(t)
	killed := time.Now()

	// The bridge gives up on the dead handler after its command timeout and
	// requeues; the next handler process gets the command again.
	second := startHandler(t, beta, "chore", "ack")
	again := second.next(t, 30*time.Second, "the command was not redelivered to the second handler")
	after := time.Since(killed)
	t.Logf("redelivered %s after the kill: %v", after.Round(time.Millisecond), again)
	if after < 2*time.Second { // the deadline began at the delivery, just before the kill
		t.Errorf("redelivered %v after the kill, before the 5s command timeout ran out", after)
	}
	if again["id"] != got["id"] || again["body"] != "alpha:1" || again["attempt"] != "2" || again["redelivered"] != "true" {
		t.Errorf("redelivery: got %v, want id %s, body alpha:1, attempt 2, redelivered true", again, got["id"])
	}
	select {
	case line := <-second.lines:
		t.Errorf("a third delivery after the handler acked: %s", line)
	case <-time.After(2 * time.Second):
	}
}

// TestCommandRedeliveredAfterNodeKilled kills (SIGKILL) the node whose
// handler holds a command: the broker gives it to the other node hosting
// the stage, as attempt 2 and marked as a redelivery.
func TestCommandRedeliveredAfterNodeKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	rmq := meshtest.RabbitMQ(t)
	amqpURL := rmq.Vhost(t)
	beta := startMeshNode(t, "beta", amqpURL, bridgeConfig{})
	gamma := startMeshNode(t, "gamma", amqpURL, bridgeConfig{})
	alpha := startMeshNode(t, "alpha", amqpURL, bridgeConfig{})

	held := make(chan *nats.Msg, 10)
	bnc := natsConn(t, beta)
	if _, err := bnc.QueueSubscribe("work.chore", "handlers", func(m *nats.Msg) { held <- m }); err != nil {
		t.Fatal(err)
	}
	flush(t, bnc)
	waitConsumers(t, rmq, amqpURL, "cmd.chore", 1)
	nc := natsConn(t, alpha)
	if o, resp, err := ledger.Submit(nc, "cmd.chore", ledger.Payload("alpha", 1), 10*time.Second); o != ledger.Acked {
		code, text := natstest.ServiceError(resp)
		t.Fatalf("submit: got %v (error %d %s), want accepted", err, code, text)
	}
	var first *nats.Msg
	select {
	case first = <-held:
	case <-time.After(15 * time.Second):
		t.Fatal("beta's handler saw no command")
	}

	handled := make(chan *nats.Msg, 10)
	gnc := natsConn(t, gamma)
	if _, err := gnc.QueueSubscribe("work.chore", "handlers", func(m *nats.Msg) {
		handled <- m
		_ = m.Respond(nil)
	}); err != nil {
		t.Fatal(err)
	}
	flush(t, gnc)
	waitConsumers(t, rmq, amqpURL, "cmd.chore", 2)
	beta.Kill()
	killed := time.Now()
	select {
	case m := <-handled:
		t.Logf("redelivered to gamma %s after beta was killed", time.Since(killed).Round(time.Millisecond))
		if m.Header.Get(hdrMsgID) != first.Header.Get(hdrMsgID) || string(m.Data) != "alpha:1" ||
			m.Header.Get(hdrAttempt) != "2" || m.Header.Get(hdrRedelivered) != "true" {
			t.Errorf("redelivery: got id %s body %q attempt %s redelivered %s, want id %s, alpha:1, 2, true",
				m.Header.Get(hdrMsgID), m.Data, m.Header.Get(hdrAttempt), m.Header.Get(hdrRedelivered), first.Header.Get(hdrMsgID))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("after 30s: the command held by the killed node was not redelivered to gamma")
	}
}
