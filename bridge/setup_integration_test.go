package bridge_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge"
)

// A broker that accepts the connection and then stalls on the topology's
// declarations must not hold Start past its connect limit: the node goes
// offline and the link loop keeps trying.
func TestStartBoundedWhenBrokerStallsDuringSetup(t *testing.T) {
	t.Parallel()
	vhost := testVhost(t)
	px, url := brokerProxy(t, vhost)
	n := buildNode(t, "stallsetup", url, func(c *bridge.Config) {
		c.Heartbeat = time.Minute // the heartbeat would notice only after minutes
	})
	dialed, stalled := make(chan struct{}), make(chan struct{})
	var once sync.Once
	bridge.SetTestAfterDial(n.b, func() {
		once.Do(func() {
			close(dialed)
			<-stalled
		})
	})
	t.Cleanup(func() { px.Restore(t) }) // runs first: a Start still stuck can finish

	start := time.Now()
	started := make(chan error, 1)
	go func() { started <- n.b.Start(t.Context()) }() // exits when Start returns
	<-dialed
	px.Stall(t)
	close(stalled)
	select {
	case err := <-started:
		if err != nil {
			t.Fatalf("got %v from Start, want nil (offline is not an error)", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Start still waiting 20s after the broker stalled in setup")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("Start took %v, want it bounded by its connect limit (5s)", d)
	}
	st := n.b.Status().Broker
	if st.State != bridge.StateOffline || !strings.Contains(st.Reason, "setup") {
		t.Fatalf("got state %q reason %q, want offline with the setup named", st.State, st.Reason)
	}
}
