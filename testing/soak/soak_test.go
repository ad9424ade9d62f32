//go:build soak

package soak

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/nats-io/nats.go"
)

func TestMain(m *testing.M) { os.Exit(meshtest.Main(m)) }

// settings are the knobs of a soak run, from SOAK_* variables.
type settings struct {
	duration, warmup, sample time.Duration
	maxSlope                 float64 // MB per minute
	commandRate, churnRate   int     // per second
}

func loadSettings(t *testing.T) settings {
	t.Helper()
	dur := func(name string, def time.Duration) time.Duration {
		v := os.Getenv(name)
		if v == "" {
			return def
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a positive duration such as 30m", name, v)
		}
		return d
	}
	num := func(name string, def float64) float64 {
		v := os.Getenv(name)
		if v == "" {
			return def
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f <= 0 {
			t.Fatalf("%s=%q: want a positive number", name, v)
		}
		return f
	}
	s := settings{duration: dur("SOAK_DURATION", 30*time.Minute)}
	s.warmup = dur("SOAK_WARMUP", max(time.Minute, s.duration/6))
	s.sample = dur("SOAK_SAMPLE", 10*time.Second)
	s.maxSlope = num("SOAK_MAX_SLOPE", 0.1)
	s.commandRate = int(num("SOAK_COMMAND_RATE", 200))
	s.churnRate = int(num("SOAK_CHURN_RATE", 20))
	if s.warmup >= s.duration {
		t.Fatalf("SOAK_WARMUP %s is not shorter than SOAK_DURATION %s", s.warmup, s.duration)
	}
	return s
}

// counter counts the outcomes of one kind of load.
type counter struct {
	name         string
	ok, failures atomic.Int64
}

func (c *counter) done(err error) {
	if err != nil {
		c.failures.Add(1)
		return
	}
	c.ok.Add(1)
}

func TestSoak(t *testing.T) {
	s := loadSettings(t)
	rabbit := meshtest.RabbitMQ(t)
	broker := rabbit.Vhost(t)
	a := meshtest.StartProcess(t, "--node", "soak-a", "--broker", broker, "--pprof", "true")
	b := meshtest.StartProcess(t, "--node", "soak-b", "--broker", broker, "--pprof", "true")
	fmt.Printf("SOAK nodes: A pid %d %s, B pid %d %s (heap profile: <http>/debug/pprof/heap)\n", a.Pid(), a.HTTPURL(), b.Pid(), b.HTTPURL())

	sub := func(_ *nats.Subscription, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	ncA := connect(t, a)
	ncB := connect(t, b)
	// B hosts the stage and a capability; each node hosts a local one for
	// its churning callers. A listens to nothing: its events go to B.
	sub(ncB.QueueSubscribe("work.soakstage", "soak", func(m *nats.Msg) { _ = m.Respond([]byte("done")) }))
	sub(ncB.QueueSubscribe("cap.soakecho", "soak", func(m *nats.Msg) { _ = m.Respond(m.Data) }))
	sub(ncA.QueueSubscribe("cap.soaklocal", "soak", func(m *nats.Msg) { _ = m.Respond(m.Data) }))
	sub(ncB.QueueSubscribe("cap.soaklocal", "soak", func(m *nats.Msg) { _ = m.Respond(m.Data) }))
	var events atomic.Int64
	sub(ncB.Subscribe("evt.soak.>", func(*nats.Msg) { events.Add(1) }))
	for _, nc := range []*nats.Conn{ncA, ncB} {
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	meshtest.WaitStatus(t, b.HTTPURL(), time.Minute, "B connected to the broker", func(s appliance.Status) bool {
		return s.Broker.State == "connected"
	})
	meshtest.WaitStatus(t, a.HTTPURL(), time.Minute, "A connected to the broker and routing cap.soakecho to B", func(s appliance.Status) bool {
		return s.Broker.State == "connected" && len(s.Capabilities.Remote["soakecho"]) > 0
	})
	meshtest.WaitFor(t, time.Minute, "a call from A to cap.soakecho answered by B", func() bool {
		_, err := ncA.Request("cap.soakecho", []byte("x"), 2*time.Second)
		return err == nil
	})

	ctx, cancel := context.WithTimeout(context.Background(), s.duration)
	defer cancel()
	var wg sync.WaitGroup
	run := func(f func()) {
		wg.Add(1)
		go func() { // exits when ctx ends (the end of the run)
			defer wg.Done()
			f()
		}()
	}
	commands := &counter{name: "commands A->B"}
	requests := &counter{name: "requests A->B (one connection)"}
	churnA := &counter{name: "churned requests on A"}
	churnB := &counter{name: "churned requests on B"}
	emitted := &counter{name: "events emitted by A"}

	const workers = 8 // commands in flight: each waits for its acceptance
	for range workers {
		run(func() {
			every(ctx, time.Second*workers/time.Duration(s.commandRate), func() {
				_, err := ncA.Request("cmd.soakstage", []byte("work"), 10*time.Second)
				commands.done(err)
			})
		})
	}
	run(func() {
		every(ctx, 5*time.Millisecond, func() { emitted.done(ncA.Publish("evt.soak.tick", []byte("tick"))) })
	})
	run(func() {
		every(ctx, 50*time.Millisecond, func() {
			_, err := ncA.Request("cap.soakecho", []byte("ping"), 5*time.Second)
			requests.done(err)
		})
	})
	churn := func(url string, cred nats.Option, c *counter, subjects ...string) {
		i := 0
		every(ctx, time.Second/time.Duration(s.churnRate), func() {
			subj := subjects[i%len(subjects)]
			i++
			nc, err := nats.Connect(url, nats.Name("soak-churn"), cred)
			if err == nil {
				_, err = nc.Request(subj, []byte("ping"), 5*time.Second)
				nc.Close()
			}
			c.done(err)
		})
	}
	credA, credB := meshtest.AdminOption(t, a.DataDir()), meshtest.AdminOption(t, b.DataDir())
	run(func() { churn(a.NATSURL(), credA, churnA, "cap.soaklocal", "cap.soakecho") })
	run(func() { churn(b.NATSURL(), credB, churnB, "cap.soaklocal") })

	// Sample both nodes until the end of the run.
	start := time.Now()
	var samplesA, samplesB []Memory
	sample := func() {
		ma, errA := ReadMemory(a.Pid())
		mb, errB := ReadMemory(b.Pid())
		if errA != nil || errB != nil {
			t.Fatalf("a node is gone: %v %v", errA, errB)
		}
		samplesA, samplesB = append(samplesA, ma), append(samplesB, mb)
		fmt.Printf("SOAK t=%-6s A rss=%6.1fMB anon=%6.1fMB  B rss=%6.1fMB anon=%6.1fMB  commands=%d requests=%d churn=%d+%d events=%d\n",
			time.Since(start).Round(time.Second), mb2(ma.RSS), mb2(ma.Anon), mb2(mb.RSS), mb2(mb.Anon),
			commands.ok.Load(), requests.ok.Load(), churnA.ok.Load(), churnB.ok.Load(), events.Load())
	}
	sample()
	tick := time.NewTicker(s.sample)
	for done := false; !done; {
		select {
		case <-tick.C:
			sample()
		case <-ctx.Done():
			done = true
		}
	}
	tick.Stop()
	wg.Wait()
	sample()

	for _, c := range []*counter{commands, requests, churnA, churnB, emitted} {
		fmt.Printf("SOAK %-32s ok=%d failed=%d\n", c.name, c.ok.Load(), c.failures.Load())
		if c.ok.Load() == 0 {
			t.Errorf("%s: none succeeded, want load", c.name)
		}
	}
	fmt.Printf("SOAK events received by B: %d\n", events.Load())
	from := start.Add(s.warmup)
	for _, n := range []struct {
		name    string
		samples []Memory
	}{{"A", samplesA}, {"B", samplesB}} {
		slope, count := AnonSlope(n.samples, from)
		first, last := n.samples[0], n.samples[len(n.samples)-1]
		verdict := "PASS"
		if slope > s.maxSlope {
			verdict = "FAIL"
			t.Errorf("node %s: anonymous memory grows %.3f MB/min after warm-up, want at most %.3f", n.name, slope, s.maxSlope)
		}
		fmt.Printf("SOAK node %s: anon %.1f MB -> %.1f MB, slope after %s warm-up %+.3f MB/min over %d samples (limit %.3f): %s\n",
			n.name, mb2(first.Anon), mb2(last.Anon), s.warmup, slope, count, s.maxSlope, verdict)
	}
}

func mb2(kb int64) float64 { return float64(kb) / 1024 }

// every runs f every interval until ctx ends; a slow f delays the next
// run rather than piling runs up.
func every(ctx context.Context, interval time.Duration, f func()) {
	tick := time.NewTicker(max(interval, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			f()
		}
	}
}

func connect(t *testing.T, p *meshtest.Process) *nats.Conn {
	t.Helper()
	return p.Connect(t, nats.Name("soak"))
}
