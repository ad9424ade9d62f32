package bridge_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshbox/meshbox/bridge"
)

// A probe of a connected node is routed and dropped by that node's
// bridge unread: it reaches neither discovery (OnSystem) nor a dead-letter
// queue, and nothing comes back. A probe of a node that is not connected
// comes back unroutable, once, at once.
func TestProbeNode(t *testing.T) {
	if testing.Short() {
		t.Skip("needs RabbitMQ")
	}
	vhost := testVhost(t)
	var handed atomic.Int64 // system messages beta's bridge handed to discovery
	reg := prometheus.NewRegistry()
	alpha := newNode(t, "alpha", vhost, nil)
	beta := newNode(t, "beta", vhost, func(c *bridge.Config) {
		c.OnSystem = func(string, []byte, string) { handed.Add(1) }
		c.Metrics = reg
	})
	alpha.waitConnected(t)
	beta.waitConnected(t)

	returned := make(chan string, 8)
	probe := func(to string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := alpha.b.ProbeNode(ctx, to, func() { returned <- to }); err != nil {
			t.Fatalf("probe %s: %v", to, err)
		}
	}
	probe("beta")
	probe("ghost")
	select {
	case who := <-returned:
		if who != "ghost" {
			t.Fatalf("the probe of %s came back unroutable, want only ghost's", who)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the probe of ghost, which is not connected, did not come back within 5s")
	}
	select {
	case who := <-returned:
		t.Fatalf("the probe of %s came back too", who)
	case <-time.After(time.Second):
	}
	if n := handed.Load(); n != 0 {
		t.Fatalf("beta handed %d system messages to discovery, want none (a probe is dropped unread)", n)
	}
	if n := counter(t, reg, "meshbox_errors_total", "malformed"); n != 0 {
		t.Fatalf("beta counted %v malformed messages, want none (a probe is not dead-lettered)", n)
	}

	// beta's connection goes, and with it its system queue.
	if err := beta.b.Close(); err != nil {
		t.Fatal(err)
	}
	probe("beta")
	select {
	case who := <-returned:
		if who != "beta" {
			t.Fatalf("the probe of %s came back, want beta's", who)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the probe of beta after it closed did not come back within 5s")
	}

	if err := alpha.b.ProbeNode(context.Background(), "a.b", func() {}); !errors.Is(err, codec.ErrBadInput) {
		t.Fatalf("probe of an invalid node name: got %v, want ErrBadInput", err)
	}
}

// A node whose link is not connected probes nobody: it says so at once.
func TestProbeNodeLinkDown(t *testing.T) {
	n := buildNode(t, "alpha", "amqp://guest:guest@127.0.0.1:1/", nil)
	if err := n.b.ProbeNode(context.Background(), "beta", func() {}); !errors.Is(err, bridge.ErrLinkDown) {
		t.Fatalf("probe before the link connected: got %v, want ErrLinkDown", err)
	}
}
