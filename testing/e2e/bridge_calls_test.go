package e2e

// Regression scenarios: a static route survives discovery's route
// updates, and thousands of calls in a row are all answered by their host
// (the node's "no host" answer once misjudged interest after ~1,000
// requests and answered first).

import (
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
	"github.com/nats-io/nats.go"
)

func TestStaticRouteToAbsentNode(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	amqpURL := meshtest.RabbitMQ(t).Vhost(t)
	p := startMeshNode(t, "alpha", amqpURL, bridgeConfig{Routes: map[string]string{"ghost": "nobody"}})
	nc := natsConn(t, p)
	// The static route gives cap.ghost a stand-in on alpha; the node it
	// names is not connected, so the broker returns the request at once.
	for range 3 {
		resp, d, err := timedRequest(nc, nats.NewMsg("cap.ghost"), 10*time.Second)
		if err != nil {
			t.Fatalf("cap.ghost routed to node nobody: %v after %s, want a 503 reply from the stand-in", err, d)
		}
		code, text := natstest.ServiceError(resp)
		if code != 503 || !strings.Contains(text, "nobody") || d > time.Second {
			t.Fatalf("cap.ghost: got code %d %q after %s, want 503 naming node nobody within 1s", code, text, d)
		}
		time.Sleep(time.Second) // real time is the thing under test: the route outlives the discovery rounds meanwhile
	}
}

// TestManyCallsAcrossNodes makes a few thousand calls from alpha to a
// capability beta hosts: every one must be answered by beta.
func TestManyCallsAcrossNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	amqpURL := meshtest.RabbitMQ(t).Vhost(t)
	alpha := startMeshNode(t, "alpha", amqpURL, bridgeConfig{})
	beta := startMeshNode(t, "beta", amqpURL, bridgeConfig{})
	host := natsConn(t, beta)
	if _, err := host.Subscribe("cap.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		t.Fatal(err)
	}
	flush(t, host)
	waitRoute(t, alpha.HTTPURL(), "echo", "beta")
	nc := natsConn(t, alpha)
	waitCallable(t, nc, "cap.echo", nil, func(m *nats.Msg) bool { c, _ := natstest.ServiceError(m); return c == 0 })
	const n = 3000
	failed, first := callEchoes(nc, n)
	if len(failed) != 0 {
		t.Errorf("of %d calls from alpha to cap.echo on beta, some failed, the first at call %d: %v", n, first, failed)
	}
}

// TestManyLocalCalls makes a few thousand calls to a capability a local
// program hosts on the same node: every one must be answered by the host.
func TestManyLocalCalls(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	p := meshtest.StartProcess(t, "--node", "solo")
	host := natsConn(t, p)
	if _, err := host.Subscribe("cap.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		t.Fatal(err)
	}
	flush(t, host)
	nc := natsConn(t, p)
	const n = 3000
	failed, first := callEchoes(nc, n)
	if len(failed) != 0 {
		t.Errorf("of %d local calls to cap.echo, some failed, the first at call %d: %v", n, first, failed)
	}
}

// callEchoes calls cap.echo n times in a row on nc and tallies the calls
// not answered with their own body, by what went wrong; first is the
// number of the first of them (-1 if none).
func callEchoes(nc *nats.Conn, n int) (failed map[string]int, first int) {
	failed, first = map[string]int{}, -1
	for i := range n {
		resp, err := nc.Request("cap.echo", []byte("ping"), 5*time.Second)
		switch code, text := natstest.ServiceError(resp); {
		case err != nil:
			failed[err.Error()]++
		case code != 0:
			failed[text]++
		case string(resp.Data) != "ping":
			failed["wrong body "+string(resp.Data)]++
		default:
			continue
		}
		if first < 0 {
			first = i
		}
	}
	return failed, first
}
