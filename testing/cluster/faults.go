package cluster

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/testing/ledger"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/nats-io/nats.go"
)

// Size is how much load a fault run carries: at least Each commands and
// Each events, submitted at about Rate per second each.
type Size struct {
	Each int
	Rate float64
}

// Faults runs the fault scenario (see the package doc): three meshbox
// nodes, one on each node of a three-node RabbitMQ cluster. alpha submits
// commands (handled by beta and gamma) and events (subscribed on beta and
// gamma), and every node calls the next one. The broker node leading the
// stage queue is killed (SIGKILL) and later restarted, then another is
// stopped gracefully. No acknowledged command or event may be lost, a
// duplicate must be marked, a request started after the kill took effect
// or the stop began must fail at once (503), never wait for its deadline,
// and requests succeed again soon after each failover. The graceful stop
// is the regression test of the nodes' request and reply queues, which
// outlived their connections: on a stopping broker node they took
// requests and replies for seconds and delivered none (every call to and
// from a node on it waited for its deadline), and could not be declared
// from another broker node until it had stopped. The figures are logged on one
// line starting CLUSTER FIGURES.
//
// It is also the regression test of two queues that lived on one broker
// node (classic queues): a node's event queue and mesh.dead. With that
// broker node killed, a node that failed over to another one could not
// declare them (404, home node down) and stayed offline: the node on the
// killed broker node never connected again.
func Faults(t *testing.T, size Size) {
	minEach, maxEach, rate := size.Each, 20*size.Each, size.Rate
	const (
		requestTimeout = 2 * time.Second
		atOnce         = time.Second // a failure within this is "at once"
		// inFlightGrace: a request started this soon after the kill
		// returned may have reached the dead node before its peers
		// noticed.
		inFlightGrace = 250 * time.Millisecond
		// stopGrace: the same for the graceful stop, from the SIGTERM: the
		// stopping broker node closes its connections within about 100 ms
		// on a quiet machine, later on a busy one.
		stopGrace      = time.Second
		recoveryTarget = 5 * time.Second
		recoveryLimit  = 15 * time.Second // beyond it the test fails
	)
	c := meshtest.NewRabbitCluster(t)
	vhost := c.Vhost(t)
	names := []string{"alpha", "beta", "gamma"}
	nodes := map[string]*placed{}
	ncs := map[string]*nats.Conn{}
	for i, name := range names {
		nodes[name] = startPlaced(t, c, vhost, name, i, requestTimeout)
		ncs[name] = natsConn(t, nodes[name].p)
		if _, err := ncs[name].Subscribe("cap.echo", func(m *nats.Msg) { _ = m.Respond([]byte(name)) }); err != nil {
			t.Fatal(err)
		}
	}
	cmds, evts := ledger.NewHistory(), ledger.NewHistory()
	for _, name := range names[1:] {
		hnc := natsConn(t, nodes[name].p)
		csub, err := hnc.QueueSubscribe("work.load", "handlers", func(m *nats.Msg) {
			cmds.Delivered(ledger.DeliveryOf(name, m))
			_ = m.Respond(nil)
		})
		if err != nil {
			t.Fatal(err)
		}
		esub, err := hnc.Subscribe("evt.load", func(m *nats.Msg) { evts.Delivered(ledger.DeliveryOf(name, m)) })
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []*nats.Subscription{csub, esub} {
			if err := s.SetPendingLimits(-1, -1); err != nil {
				t.Fatal(err)
			}
		}
		if err := hnc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	for _, nc := range ncs {
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if !meshtest.Poll(30*time.Second, func() bool {
		q, err := c.LookupQueue(vhost, "cmd.load")
		return err == nil && q.Consumers >= 2
	}) {
		t.Fatal("cmd.load has no consumer on beta and gamma after 30s")
	}

	cl := &ledger.Load{NC: natsConn(t, nodes["alpha"].p), Subject: "cmd.load", Origin: "alpha", History: cmds}
	el := &ledger.Load{NC: natsConn(t, nodes["alpha"].p), Subject: "evt.load", Origin: "alpha", History: evts}
	var callers []*caller
	for i, from := range names {
		callers = append(callers, &caller{nc: natsConn(t, nodes[from].p), from: from, to: names[(i+1)%len(names)]})
	}
	stop, stopCalls := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	for _, l := range []*ledger.Load{cl, el} {
		// Load generator: exits when stop is closed and the minimum is in.
		wg.Go(func() { l.Run(8, rate, minEach, maxEach, stop) })
	}
	for _, cr := range callers {
		// Caller: exits when stopCalls is closed.
		wg.Go(func() { cr.run(requestTimeout+3*time.Second, stopCalls) })
	}
	endLoad := sync.OnceFunc(func() { close(stop) })
	endCalls := sync.OnceFunc(func() { close(stopCalls) })
	defer func() { // on a failure too: the generators and callers exit
		endLoad()
		endCalls()
		wg.Wait()
	}()

	start := time.Now()
	if !meshtest.Poll(time.Minute, func() bool { return cl.Started() >= 300 && el.Started() >= 300 }) {
		t.Fatal("the load did not start")
	}
	where := func() map[string]int {
		m := map[string]int{}
		for _, name := range names {
			m[name] = nodes[name].on(meshtest.Status(t, nodes[name].p.HTTPURL()))
		}
		return m
	}
	// settled waits until every node is connected with an empty outbox
	// and every caller had a success started after the fault.
	settled := func(fault time.Time, what string) {
		t.Helper()
		for _, name := range names {
			meshtest.WaitStatus(t, nodes[name].p.HTTPURL(), time.Minute, name+" connected with an empty outbox after "+what, func(st appliance.Status) bool {
				return st.Broker.State == "connected" && st.Outbox.Depth == 0
			})
		}
		if !meshtest.Poll(time.Minute, func() bool {
			for _, cr := range callers {
				if !slices.ContainsFunc(cr.snapshot(), func(c call) bool { return c.code == 0 && c.start.After(fault) }) {
					return false
				}
			}
			return true
		}) {
			t.Fatalf("after %s: a caller had no successful request for a minute", what)
		}
	}

	leader := c.Leader(t, vhost, "cmd.load")
	t.Logf("before the faults: cmd.load led by broker node %d; nodes on %v", leader, where())
	killAt := time.Now()
	c.Kill(t, leader)
	killedAt := time.Now()
	settled(killAt, "the kill")
	t.Logf("after the kill: nodes on %v", where())
	restartAt := time.Now()
	c.Start(t, leader)
	t.Logf("restart of broker node %d began %v after the kill, took %v", leader, restartAt.Sub(killAt).Round(time.Millisecond), time.Since(restartAt).Round(time.Millisecond))
	if !meshtest.Poll(time.Minute, func() bool {
		q, err := c.LookupQueue(vhost, "cmd.load")
		return err == nil && len(q.Online) == c.Size()
	}) {
		t.Fatal("cmd.load did not have every member online a minute after the restart")
	}
	victim := -1
	on := where()
	for i := range c.Size() {
		if i != leader && victim < 0 && slices.Contains(mapValues(on), i) {
			victim = i
		}
	}
	if victim < 0 {
		t.Fatalf("no broker node but the restarted one holds a meshbox node: %v", on)
	}
	stopAt := time.Now()
	c.Stop(t, victim)
	settled(stopAt, "the graceful stop")
	t.Logf("after the graceful stop of broker node %d: nodes on %v", victim, where())

	endLoad()
	if !meshtest.Poll(3*time.Minute, func() bool { return cl.Started() >= int64(minEach) && el.Started() >= int64(minEach) }) {
		t.Fatal("the load did not reach its minimum")
	}
	endCalls()
	wg.Wait()
	end := time.Now()
	t.Logf("load done after %s: %s; %s", end.Sub(start).Round(time.Second), cl.Summary(), el.Summary())

	for _, name := range names {
		meshtest.WaitStatus(t, nodes[name].p.HTTPURL(), 2*time.Minute, name+"'s outbox drained", func(st appliance.Status) bool {
			return st.Broker.State == "connected" && st.Outbox.Depth == 0
		})
	}
	meshtest.Poll(2*time.Minute, func() bool {
		return len(cmds.Check().Lost) == 0 && len(evts.CheckAt("beta").Lost) == 0 && len(evts.CheckAt("gamma").Lost) == 0
	})
	time.Sleep(2 * time.Second) // real time: room for late duplicates

	ct, bt, gt := cmds.Check(), evts.CheckAt("beta"), evts.CheckAt("gamma")
	t.Logf("commands (handled once across beta and gamma):\n%s", ct)
	t.Logf("events at beta:\n%s", bt)
	t.Logf("events at gamma:\n%s", gt)
	for _, r := range []struct {
		what string
		r    ledger.Result
	}{{"commands", ct}, {"events at beta", bt}, {"events at gamma", gt}} {
		if r.r.Acked < minEach || len(r.r.Lost) != 0 || len(r.r.DupUnmarked) != 0 || len(r.r.Unexpected) != 0 {
			t.Errorf("%s: want at least %d acknowledged, none lost, no unmarked duplicate, nothing unexpected:\n%s", r.what, minEach, r.r)
		}
	}

	var all []call
	for _, cr := range callers {
		all = append(all, cr.snapshot()...)
	}
	for _, c := range all {
		if c.code != 0 && (c.code != 503 || c.took >= atOnce) {
			t.Logf("waited: %s -> %s code %d after %v, started %v after the kill, %v after the graceful stop",
				c.from, c.to, c.code, c.took.Round(time.Millisecond), c.start.Sub(killAt).Round(time.Millisecond), c.start.Sub(stopAt).Round(time.Millisecond))
		}
	}
	kill := failures(all, killAt, stopAt, atOnce)
	grace := failures(all, stopAt, end, atOnce)
	// A request in flight when its broker node went (the kill took effect,
	// or the stopping node closed its connections) is lost — requests are
	// at most once — and waits for its deadline: one started before that
	// moment. Every later one must fail at once, if it fails. A broker
	// node that stops gracefully closes its connections as it begins;
	// stopAt is when the stop was asked for.
	inFlightKill, laterKill := hung(all, killAt, killedAt, stopAt, requestTimeout, inFlightGrace, atOnce)
	inFlightStop, laterStop := hung(all, stopAt, stopAt, end, requestTimeout, stopGrace, atOnce)
	t.Logf("CLUSTER FIGURES: commands %d acked, %d lost, %d duplicates (%d unmarked); events %d acked, %d lost at beta, %d at gamma, %d+%d duplicates (%d unmarked); "+
		"requests %d; SIGKILL of the stage leader: %s, %d requests in flight at the kill waited for their deadline; graceful stop of another broker node: %s, %d in flight at the stop waited for their deadline (target %v)",
		ct.Acked, len(ct.Lost), ct.DupMarked+len(ct.DupUnmarked), len(ct.DupUnmarked), bt.Acked, len(bt.Lost), len(gt.Lost),
		bt.DupMarked+len(bt.DupUnmarked), gt.DupMarked+len(gt.DupUnmarked), len(bt.DupUnmarked)+len(gt.DupUnmarked),
		len(all), kill, inFlightKill, grace, inFlightStop, recoveryTarget)
	if laterKill != 0 {
		t.Errorf("after the SIGKILL: %d requests started after it took effect failed otherwise than with 503 within %v (%s); want every failure at once", laterKill, atOnce, kill)
	}
	if laterStop != 0 {
		t.Errorf("after the graceful stop: %d requests started after it began failed otherwise than with 503 within %v (%s); want every failure at once", laterStop, atOnce, grace)
	}
	for what, f := range map[string]faultCalls{"SIGKILL": kill, "graceful stop": grace} {
		if f.recovery > recoveryLimit {
			t.Errorf("requests succeeded again %v after the %s; want well under %v", f.recovery, what, recoveryLimit)
		}
	}
}

// hung counts the calls started in [fault-timeout, to) that failed
// otherwise than with 503 within atOnce: those started before
// tookEffect+grace were in flight when the fault took effect (inFlight),
// the others started after it (later).
func hung(calls []call, fault, tookEffect, to time.Time, timeout, grace, atOnce time.Duration) (inFlight, later int) {
	for _, c := range calls {
		if c.code == 0 || c.code == 503 && c.took < atOnce || c.start.Before(fault.Add(-timeout)) || !c.start.Before(to) {
			continue
		}
		if c.start.Before(tookEffect.Add(grace)) {
			inFlight++
		} else {
			later++
		}
	}
	return inFlight, later
}

// faultCalls sums up the requests made from one fault to the next.
type faultCalls struct {
	calls, failed, atOnce, hung int
	codes                       map[int]int
	slowest                     time.Duration // of the failures
	recovery                    time.Duration // until requests succeeded again
}

func (f faultCalls) String() string {
	return fmt.Sprintf("%d requests, %d failed (%d with 503 at once, %d waited for their deadline or other; codes %v; slowest failure %v), requests succeed again after %v",
		f.calls, f.failed, f.atOnce, f.hung, f.codes, f.slowest.Round(time.Millisecond), f.recovery.Round(time.Millisecond))
}

// failures sums up the calls started in [from, to); a failure within
// atOnce with 503 is "at once".
func failures(calls []call, from, to time.Time, atOnce time.Duration) faultCalls {
	f := faultCalls{codes: map[int]int{}, recovery: recovery(calls, from, to)}
	for _, c := range calls {
		if c.start.Before(from) || !c.start.Before(to) {
			continue
		}
		f.calls++
		if c.code == 0 {
			continue
		}
		f.failed++
		f.codes[c.code]++
		f.slowest = max(f.slowest, c.took)
		if c.code == 503 && c.took < atOnce {
			f.atOnce++
		} else {
			f.hung++
		}
	}
	return f
}

// recovery returns how long after from requests succeeded again: from
// from to the end of the first success that started after the last
// failure started before to. 0 when none failed.
func recovery(calls []call, from, to time.Time) time.Duration {
	var lastFail time.Time
	for _, c := range calls {
		if c.code != 0 && !c.start.Before(from) && c.start.Before(to) && c.start.After(lastFail) {
			lastFail = c.start
		}
	}
	if lastFail.IsZero() {
		return 0
	}
	var back time.Time
	for _, c := range calls {
		if c.code == 0 && c.start.After(lastFail) && (back.IsZero() || c.start.Add(c.took).Before(back)) {
			back = c.start.Add(c.took)
		}
	}
	if back.IsZero() {
		return to.Sub(from)
	}
	return back.Sub(from)
}

func mapValues(m map[string]int) []int {
	var v []int
	for _, x := range m {
		v = append(v, x)
	}
	return v
}
