package bench

import (
	"bytes"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// commandLoad is the shape of one command throughput run.
type commandLoad struct {
	stage      string // submitted on cmd.<stage>, handled on work.<stage>
	commands   int    // submitted at most
	submitters int    // concurrent submitters, each waiting for its answer
	// within, when set, time-boxes the submissions: the submitters stop
	// after it. The run still waits (at most 2 minutes) until every
	// command accepted is handled.
	within time.Duration
}

// loopbackLoad is BenchmarkBridge's command load.
var loopbackLoad = commandLoad{stage: "bench", commands: benchCommands, submitters: benchSubmitters}

// commandRuns numbers the command runs of ours: each submits a body of
// its own, so that a handler counts only its run's commands.
var commandRuns int

// commandThroughput submits load's commands on A and returns commands
// per second until B's handler has seen them all, and this process's
// and the broker's CPU time per command over that time.
func commandThroughput(b *testing.B, rmq *meshtest.Rabbit, nodeA, nodeB *appliance.Appliance, load commandLoad) throughput {
	b.Helper()
	commandRuns++
	body := []byte(strconv.Itoa(commandRuns))
	handled := newHandledCount(load.commands)
	sub, snc := commandHandler(b, nodeA, nodeB, load.stage, func(m *nats.Msg) {
		if bytes.Equal(m.Data, body) {
			handled.add()
		}
	})
	r := submitCommands(b, rmq, snc, load, body, acceptedBy(""), handled)
	_ = sub.Unsubscribe()
	b.Logf("ours: %d commands accepted by A in %v, handled on B in %v, process CPU %v, broker CPU %v", r.commands, r.acceptedIn, r.took, r.cpu, r.broker)
	return r.throughput()
}

// commandHandler subscribes a handler of stage on B that answers every
// command at once, calling onCommand first (for every command but the
// probes); it returns the subscription and a program's connection on A
// once B hosts the stage as A sees it: until then a submission is
// refused as unroutable.
func commandHandler(b *testing.B, nodeA, nodeB *appliance.Appliance, stage string, onCommand func(*nats.Msg)) (*nats.Subscription, *nats.Conn) {
	b.Helper()
	hnc := benchConn(b, nodeB.NATSURL(), meshtest.AdminOption(b, nodeB.DataDir()))
	sub, err := hnc.QueueSubscribe(wire.WorkSubject(stage), "handlers", func(m *nats.Msg) {
		if string(m.Data) != "probe" {
			onCommand(m)
		}
		_ = m.Respond(nil)
	})
	if err != nil {
		b.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	if err := hnc.Flush(); err != nil {
		b.Fatal(err)
	}
	snc := benchConn(b, nodeA.NATSURL(), meshtest.AdminOption(b, nodeA.DataDir()))
	meshtest.WaitFor(b, 30*time.Second, "stage "+stage+" hosted on B", func() bool {
		resp, err := snc.Request(wire.CommandSubject(stage), []byte("probe"), 5*time.Second)
		return err == nil && resp.Header.Get(wire.HeaderAccepted) == "broker"
	})
	return sub, snc
}

// acceptedBy checks a submission's answer: accepted at all (how ""), or
// accepted in that way (wire.HeaderAccepted: broker, outbox).
func acceptedBy(how string) func(*nats.Msg) bool {
	return func(resp *nats.Msg) bool {
		v := resp.Header.Get(wire.HeaderAccepted)
		return v != "" && (how == "" || v == how)
	}
}

// handledCount counts what a run's handler (or consumer) has seen and
// closes all once the count reaches the run's target: at first all it
// may submit, then (expect) what it did submit.
type handledCount struct {
	n, target atomic.Int64
	once      sync.Once
	all       chan struct{}
}

func newHandledCount(target int) *handledCount {
	h := &handledCount{all: make(chan struct{})}
	h.target.Store(int64(target))
	return h
}

// add counts one.
func (h *handledCount) add() {
	if h.n.Add(1) >= h.target.Load() {
		h.once.Do(func() { close(h.all) })
	}
}

// expect sets the target to n.
func (h *handledCount) expect(n int) {
	h.target.Store(int64(n))
	if h.count() >= n {
		h.once.Do(func() { close(h.all) })
	}
}

func (h *handledCount) count() int { return int(h.n.Load()) }

// submitted is what submitCommands measured.
type submitted struct {
	commands         int           // accepted and handled
	took, acceptedIn time.Duration // until every one was handled; answered
	cpu, broker      time.Duration // of this process and of the broker's VM
}

// throughput is s per command handled.
func (s submitted) throughput() throughput {
	n := time.Duration(max(1, s.commands))
	return throughput{float64(s.commands) / s.took.Seconds(), s.cpu / n, s.broker / n}
}

// submitCommands submits load's commands with body on nc, each answer
// checked by accepted, and waits until handled has counted every
// accepted one.
func submitCommands(b *testing.B, rmq *meshtest.Rabbit, nc *nats.Conn, load commandLoad, body []byte, accepted func(*nats.Msg) bool, handled *handledCount) submitted {
	b.Helper()
	cpu0, bcpu0 := cpuTime(b), rmq.CPUTime(b)
	start := time.Now()
	n := submit(b, nc, load, body, accepted, start)
	acceptedIn := time.Since(start)
	handled.expect(n)
	select {
	case <-handled.all:
	case <-time.After(2 * time.Minute):
		b.Fatalf("after 2m: %d of %d commands handled", handled.count(), n)
	}
	return submitted{commands: n, took: time.Since(start), acceptedIn: acceptedIn, cpu: cpuTime(b) - cpu0, broker: rmq.CPUTime(b) - bcpu0}
}

// submit sends load's commands with body to cmd.<stage> on nc from
// load.submitters concurrent submitters (until load.within after start,
// if set) and returns how many were accepted, once every submission was
// answered; it fails the benchmark if any was not accepted.
func submit(b *testing.B, nc *nats.Conn, load commandLoad, body []byte, accepted func(*nats.Msg) bool, start time.Time) int {
	b.Helper()
	var failed, next, ok atomic.Int64
	var wg sync.WaitGroup
	subject := wire.CommandSubject(load.stage)
	for range load.submitters {
		wg.Add(1)
		go func() { // submitter: exits when every command is submitted, or the time is up
			defer wg.Done()
			for next.Add(1) <= int64(load.commands) && (load.within == 0 || time.Since(start) < load.within) {
				resp, err := nc.Request(subject, body, 30*time.Second)
				if err != nil || !accepted(resp) {
					failed.Add(1)
				} else {
					ok.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if f := failed.Load(); f != 0 {
		b.Fatalf("%d of %d commands not accepted", f, failed.Load()+ok.Load())
	}
	return int(ok.Load())
}

// rawCommandThroughput is the baseline of commandThroughput: raw
// amqp091-go publishing persistent messages to a quorum queue of its own
// with an async confirm window of benchSubmitters, and a consumer with
// the given prefetch acking each message; messages per second until the
// consumer has acked them all, and this process's CPU time per message.
func rawCommandThroughput(b *testing.B, rmq *meshtest.Rabbit, amqpURL string, prefetch int) throughput {
	b.Helper()
	r := rawShapeThroughput(b, rmq, directLinks(amqpURL, ""), messageShape{name: "raw", prefetch: prefetch})
	b.Logf("raw (prefetch %d): %.0f msg/s, process CPU %v, broker CPU %v per message", prefetch, r.perSec, r.cpu, r.broker)
	return r
}
