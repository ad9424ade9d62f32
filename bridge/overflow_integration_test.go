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
)

// On a far link, submissions past the direct path's share go into the
// outbox and are answered on its commit; a deep backlog holds answers
// back. Every command is handled once, none lost, none twice; and on
// loopback (the control) nothing overflows.
func TestFarLinkOverflowsIntoTheOutbox(t *testing.T) {
	if testing.Short() {
		t.Skip("uses RabbitMQ")
	}
	t.Parallel()
	vhost := testVhost(t)
	px, slowURL := brokerProxy(t, vhost)
	px.Delay(t, 10*time.Millisecond)
	a := newNode(t, "alpha", slowURL, nil)
	near := newNode(t, "gamma", vhost, nil)
	b := newNode(t, "beta", vhost, nil)
	for _, n := range []*node{a, near, b} {
		n.waitConnected(t)
	}
	bridge.SetParkAbove(a.b, 64)
	bridge.SetParkAbove(near.b, 64)
	var h handler
	serveStage(t, b, "far", &h)
	for _, n := range []*node{a, near} { // the stage is routed in both sessions
		meshtest.WaitFor(t, 10*time.Second, n.name+": stage far routed", func() bool {
			m, err := n.client.Request("cmd.far", []byte("probe"), 5*time.Second)
			return err == nil && m.Header.Get(codec.HeaderAccepted) == "broker"
		})
	}

	submitAll := func(n *node, prefix string, total, submitters int) map[string]int {
		t.Helper()
		var (
			wg   sync.WaitGroup
			next atomic.Int64
			mu   sync.Mutex
			how  = map[string]int{}
		)
		for range submitters {
			wg.Add(1)
			go func() { // exits when every command is submitted
				defer wg.Done()
				for i := next.Add(1); i <= int64(total); i = next.Add(1) {
					m, err := n.client.Request("cmd.far", []byte(prefix+strconv.FormatInt(i, 10)), 30*time.Second)
					v := "refused"
					if err == nil {
						v = m.Header.Get(codec.HeaderAccepted)
						if v == "" {
							v = "refused: " + m.Header.Get("Nats-Service-Error")
						}
					}
					mu.Lock()
					how[v]++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		return how
	}
	const total, submitters = 3000, 400
	howFar := submitAll(a, "far-", total, submitters)
	howNear := submitAll(near, "near-", total, submitters)
	t.Logf("far node: %v; near node: %v", howFar, howNear)
	if howFar["broker"]+howFar["outbox"] != total || howNear["broker"]+howNear["outbox"] != total {
		t.Fatalf("answers: far %v, near %v; want all %d accepted on each", howFar, howNear, total)
	}
	over, held := bridge.Overflow(a.b)
	if howFar["outbox"] == 0 || over == 0 {
		t.Fatalf("far node: %d answered from the outbox, %d overflowed; want some of both (%d submitters, 10 ms each way)", howFar["outbox"], over, submitters)
	}
	if held == 0 {
		t.Fatalf("far node: no answer held back with a backlog limit of 64 and %d submitters", submitters)
	}
	// The control: a link quicker than OverflowRTT never overflows. A
	// machine so busy that even loopback calls took that long measures a
	// far link, and then overflowing is right.
	if rtt := bridge.LinkRTT(near.b); rtt < bridge.OverflowRTT {
		if over, held := bridge.Overflow(near.b); over != 0 || held != 0 || howNear["outbox"] != 0 {
			t.Fatalf("near node (loopback, round trip %v): %d overflowed, %d held, %d answered from the outbox; want none", rtt, over, held, howNear["outbox"])
		}
	} else {
		t.Logf("the near node measured a round trip of %v on loopback (a busy machine): its control is skipped", rtt)
	}
	meshtest.WaitFor(t, 60*time.Second, "every command handled", func() bool { return len(h.msgs()) >= 2*total+2 })
	time.Sleep(200 * time.Millisecond) // a duplicate would come now
	seen := map[string]int{}
	for _, m := range h.msgs() {
		seen[string(m.Data)]++
	}
	lost, dup := 0, 0
	for _, p := range []string{"far-", "near-"} {
		for i := 1; i <= total; i++ {
			switch n := seen[p+strconv.Itoa(i)]; {
			case n == 0:
				lost++
			case n > 1:
				dup += n - 1
			}
		}
	}
	if lost != 0 || dup != 0 || len(seen) != 2*total+1 {
		t.Fatalf("handled: %d lost, %d duplicated, %d distinct (want %d with the probe)", lost, dup, len(seen), 2*total+1)
	}
	if st := a.b.Status().Outbox; st.Depth != 0 || st.HeldAnswers != 0 {
		t.Fatalf("far node's outbox after the run: %+v, want empty with no answer held", st)
	}
}
