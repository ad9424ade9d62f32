package node_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/node"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
)

func TestMain(m *testing.M) {
	code := meshtest.Main(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "leaked goroutines: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Discovery timing of the integration test: gone after 3 × 300ms.
const (
	itHeartbeat = 300 * time.Millisecond
	itMissed    = 3
)

// meshNode is one node wired as the appliance wires it: an embedded NATS
// server, a bridge to the broker, and the node on top.
type meshNode struct {
	name   string
	srv    *server.Server
	api    *nats.Conn
	bridge *bridge.Bridge
	node   *node.Node
	closed bool
	hosted []string // the subjects its programs host, as the appliance's watcher would report them
}

// startMeshNode starts node name on the broker at url; mods may change its
// node config.
func startMeshNode(t *testing.T, url, name string, mods ...func(*node.Config)) *meshNode {
	t.Helper()
	srv := natstest.Start(t)
	mn := &meshNode{name: name, srv: srv}
	t.Cleanup(mn.kill)
	mn.api = natstest.Connect(t, srv, nats.Name("meshbox-api"))
	var err error
	logger := slog.New(slog.NewTextHandler(tbWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})).With("test_node", name)
	var nd atomic.Pointer[node.Node]
	mn.bridge, err = bridge.New(bridge.Config{
		Node:       name,
		URL:        url,
		OutboxPath: filepath.Join(t.TempDir(), "outbox.db"),
		Dial: func(opts ...nats.Option) (*nats.Conn, error) {
			return natstest.Dialer(srv)(append([]nats.Option{nats.Name("meshbox-bridge")}, opts...)...)
		},
		RequestTimeout: 2 * time.Second,
		OnSystem:       func(key string, body []byte, origin string) { nd.Load().HandleSystem(key, body, origin) },
		Logger:         logger.With("component", "bridge"),
	}, mn.api)
	if err != nil {
		t.Fatal(err)
	}
	if err := mn.bridge.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	cfg := node.Config{
		Name:              name,
		Version:           "test",
		Link:              mn.bridge,
		Conn:              mn.api,
		DiscoveryInterval: 5 * time.Second,
		HeartbeatInterval: itHeartbeat,
		MissedHeartbeats:  itMissed,
		NoRoute:           func(err error) bool { return errors.Is(err, bridge.ErrNoRoute) },
		Logger:            logger,
	}
	for _, mod := range mods {
		mod(&cfg)
	}
	mn.node, err = node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	nd.Store(mn.node)
	if err := mn.node.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return mn
}

// kill stops the node without a goodbye: the bridge's connection drops
// first, as when the process is killed.
func (mn *meshNode) kill() {
	if mn.closed {
		return
	}
	mn.closed = true
	_ = mn.bridge.Close()
	_ = mn.node.Close()
	mn.api.Close()
	mn.srv.Shutdown()
	mn.srv.WaitForShutdown()
}

// client connects a local program to the node's NATS server.
func (mn *meshNode) client(t *testing.T, name string) *nats.Conn {
	t.Helper()
	return natstest.ConnectTCP(t, mn.srv, nats.Name(name))
}

// host makes a program on mn host capability capName, answering with the
// node's name.
func (mn *meshNode) host(t *testing.T, capName string) *nats.Subscription {
	t.Helper()
	nc := mn.client(t, "prog-"+capName)
	sub, err := nc.QueueSubscribe("cap."+capName, "q", func(m *nats.Msg) { _ = m.Respond([]byte(mn.name)) })
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// Tell the bridge, then the node, as the appliance's watcher does.
	mn.hosted = append(mn.hosted, "cap."+capName)
	if err := mn.bridge.SetLocalInterest(context.Background(), mn.hosted); err != nil {
		t.Fatal(err)
	}
	mn.node.SetLocal(mn.hosted)
	return sub
}

// call requests subject on nc and returns the answer or the service error.
func call(nc *nats.Conn, subject string) (string, error) {
	msg, err := nc.Request(subject, []byte("hi"), 3*time.Second)
	if err != nil {
		return "", err
	}
	if e := msg.Header.Get("Nats-Service-Error"); e != "" {
		return "", fmt.Errorf("%s %s", msg.Header.Get("Nats-Service-Error-Code"), e)
	}
	return string(msg.Data), nil
}

func peerState(n *node.Node, name string) string {
	for _, p := range n.Peers() {
		if p.Name == name {
			return p.State
		}
	}
	return ""
}

func TestDiscoveryOverTheBroker(t *testing.T) {
	if testing.Short() {
		t.Skip("needs RabbitMQ")
	}
	url := meshtest.RabbitMQ(t).Vhost(t)
	a := startMeshNode(t, url, "A")
	b := startMeshNode(t, url, "B")
	c := startMeshNode(t, url, "C")
	caller := a.client(t, "caller")

	// A capability that appears on B after A started is callable from A
	// within a second of B noticing it.
	meshtest.Eventually(t, 5*time.Second, "A sees B and C", func() error {
		if peerState(a.node, "B") != node.StateUp || peerState(a.node, "C") != node.StateUp {
			return fmt.Errorf("peers %+v", a.node.Peers())
		}
		return nil
	})
	b.host(t, "late")
	took := meshtest.Eventually(t, 3*time.Second, "call cap.late on A", func() error {
		got, err := call(caller, "cap.late")
		if err == nil && got != "B" {
			err = fmt.Errorf("answered by %q, want B", got)
		}
		return err
	})
	if took > time.Second {
		t.Errorf("cap.late callable on A %v after B's program subscribed, want within a second", took)
	}

	// A capability no live node hosts fails at once, naming it.
	start := time.Now()
	if _, err := call(caller, "cap.nobody"); err == nil || time.Since(start) > time.Second {
		t.Errorf("call to an unhosted capability: got %v after %v, want an error at once", err, time.Since(start))
	}

	// The same capability on B and C: calls from A are spread over both.
	b.host(t, "echo")
	c.host(t, "echo")
	meshtest.Eventually(t, 3*time.Second, "A routes echo to B and C", func() error {
		if got := a.node.Routes()["echo"]; !slices.Equal(got, []string{"B", "C"}) {
			return fmt.Errorf("routes %v", got)
		}
		return nil
	})
	// The bridge's stand-in follows the routes.
	meshtest.Eventually(t, 3*time.Second, "calls from A spread over B and C", func() error {
		seen := map[string]int{}
		for range 20 {
			got, err := call(caller, "cap.echo")
			if err != nil {
				return err
			}
			seen[got]++
		}
		if seen["B"] == 0 || seen["C"] == 0 {
			return fmt.Errorf("20 calls answered by %v, want both B and C", seen)
		}
		return nil
	})
	if got, err := call(caller, "node.C.cap.echo"); err != nil || got != "C" {
		t.Fatalf("call node.C.cap.echo: got %q, %v, want C", got, err)
	}

	// C is killed: within the heartbeat window A marks it gone, withdraws
	// its routes, and a call addressed to C fails at once naming it.
	c.kill()
	killed := time.Now()
	meshtest.Eventually(t, itMissed*itHeartbeat+2*time.Second, "A marks C gone", func() error {
		if s := peerState(a.node, "C"); s != node.StateGone {
			return fmt.Errorf("C is %q", s)
		}
		return nil
	})
	t.Logf("C marked gone %v after it was killed", time.Since(killed).Round(time.Millisecond))
	if got := a.node.Routes()["echo"]; !slices.Equal(got, []string{"B"}) {
		t.Fatalf("routes of echo after C died: got %v, want [B]", got)
	}
	start = time.Now()
	_, err := call(caller, "node.C.cap.echo")
	if err == nil || !strings.Contains(err.Error(), "C") || time.Since(start) > time.Second {
		t.Fatalf("call node.C.cap.echo after C died: got %v after %v, want an error naming C at once", err, time.Since(start))
	}
	for range 10 {
		if got, err := call(caller, "cap.echo"); err != nil || got != "B" {
			t.Fatalf("call cap.echo with C gone: got %q, %v, want B", got, err)
		}
	}

	// C comes back: callable again without restarting A or B.
	c2 := startMeshNode(t, url, "C")
	c2.host(t, "echo")
	meshtest.Eventually(t, 5*time.Second, "node.C.cap.echo callable again", func() error {
		got, err := call(caller, "node.C.cap.echo")
		if err == nil && got != "C" {
			err = fmt.Errorf("answered by %q", got)
		}
		return err
	})

	// A node in the records that never starts is expected-but-absent.
	if err := a.node.SetExpected([]string{"B", "C", "D"}); err != nil {
		t.Fatal(err)
	}
	if s := peerState(a.node, "D"); s != node.StateAbsent {
		t.Fatalf("D: got %q, want %s", s, node.StateAbsent)
	}
}

// A killed node's system queue goes with its connection: its ring
// predecessors' next probe gets "no route" from the real broker, and
// every node marks it gone within the probe interval, whatever its
// heartbeat window.
func TestKilledPeerNoticedThroughTheBroker(t *testing.T) {
	if testing.Short() {
		t.Skip("needs RabbitMQ")
	}
	url := meshtest.RabbitMQ(t).Vhost(t)
	const probe = 500 * time.Millisecond
	slow := func(c *node.Config) { c.HeartbeatInterval, c.DiscoveryInterval = time.Minute, probe }
	a := startMeshNode(t, url, "A", slow)
	b := startMeshNode(t, url, "B", slow)
	c := startMeshNode(t, url, "C", slow)
	meshtest.Eventually(t, 5*time.Second, "every node sees the others", func() error {
		for _, n := range []*meshNode{a, b, c} {
			if len(n.node.Peers()) != 2 {
				return fmt.Errorf("%s: peers %+v", n.name, n.node.Peers())
			}
		}
		return nil
	})
	c.kill()
	killed := time.Now()
	for _, n := range []*meshNode{a, b} {
		meshtest.Eventually(t, 2*probe+time.Second, n.name+" marks C gone", func() error {
			for _, p := range n.node.Peers() {
				if p.Name == "C" && p.State == node.StateGone {
					if p.Reason != "not connected to the broker" {
						t.Fatalf("%s: C gone for %q, want the broker's no route", n.name, p.Reason)
					}
					return nil
				}
			}
			return fmt.Errorf("peers %+v", n.node.Peers())
		})
	}
	t.Logf("C marked gone by A and B %v after it was killed (heartbeat window 3m)", time.Since(killed).Round(time.Millisecond))
}

// tbWriter sends log lines to tb.Log.
type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
