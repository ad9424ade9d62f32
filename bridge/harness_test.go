package bridge_test

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
)

// node is one test node: an embedded NATS server, the appliance's
// in-process connection, a bridge, and a connection for "local programs".
type node struct {
	name   string
	srv    *server.Server
	nc     *nats.Conn // handed to the bridge
	client *nats.Conn // a local program
	b      *bridge.Bridge
	cfg    bridge.Config
	own    atomic.Pointer[nats.Conn] // the bridge's own connection, from Dial
}

// startServer runs an embedded NATS server on a free loopback port.
func startServer(tb testing.TB) *server.Server {
	tb.Helper()
	return natstest.Start(tb)
}

func connect(tb testing.TB, srv *server.Server, name string) *nats.Conn {
	tb.Helper()
	return natstest.Connect(tb, srv, nats.Name(name))
}

// testConfig is the bridge configuration of a test node: quick checks,
// reconnects and deadlines. own receives the bridge's own connection.
func testConfig(tb testing.TB, name, brokerURL string, srv *server.Server, own *atomic.Pointer[nats.Conn]) bridge.Config {
	return bridge.Config{
		Node:           name,
		URL:            brokerURL,
		OutboxPath:     filepath.Join(tb.TempDir(), "outbox.db"),
		RequestTimeout: 3 * time.Second,
		CommandTimeout: 3 * time.Second,
		Heartbeat:      2 * time.Second,
		StallAfter:     time.Minute,
		StallCheck:     200 * time.Millisecond,
		ReconnectMin:   50 * time.Millisecond,
		ReconnectMax:   500 * time.Millisecond,
		Dial: func(opts ...nats.Option) (*nats.Conn, error) {
			nc, err := natstest.Dialer(srv)(opts...)
			if err == nil {
				own.Store(nc)
			}
			return nc, err
		},
		Logger: slog.New(slog.NewTextHandler(tbWriter{tb}, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test_node", name),
	}
}

// newNode starts a node named name on brokerURL; edit may change its
// configuration first. The node is closed in Cleanup.
func newNode(tb testing.TB, name, brokerURL string, edit func(*bridge.Config)) *node {
	tb.Helper()
	n := buildNode(tb, name, brokerURL, edit)
	if err := n.b.Start(context.Background()); err != nil {
		tb.Fatalf("start bridge %s: %v", name, err)
	}
	return n
}

// buildNode is newNode without Start.
func buildNode(tb testing.TB, name, brokerURL string, edit func(*bridge.Config)) *node {
	tb.Helper()
	srv := startServer(tb)
	n := &node{name: name, srv: srv, nc: connect(tb, srv, "appliance"), client: connect(tb, srv, "program")}
	n.cfg = testConfig(tb, name, brokerURL, srv, &n.own)
	if edit != nil {
		edit(&n.cfg)
	}
	b, err := bridge.New(n.cfg, n.nc)
	if err != nil {
		tb.Fatalf("new bridge %s: %v", name, err)
	}
	n.b = b
	// As in a mesh whose nodes all read command batches (the appliance
	// asks discovery): commands waiting together travel together.
	b.SetCommandBatching(true)
	b.SetOrderKeys(true)
	tb.Cleanup(func() {
		if err := b.Close(); err != nil {
			tb.Errorf("close bridge %s: %v", name, err)
		}
	})
	n.feedInterest(tb)
	return n
}

// feedInterest stands in for the appliance's watcher of local interest:
// every 20ms it hands the bridge the cap.* and work.* subjects of the
// server's subscriptions but the bridge's own, and the events they
// listen to, when they changed. It
// stops in Cleanup, before the bridge is closed.
func (n *node) feedInterest(tb testing.TB) {
	stop, done := make(chan struct{}), make(chan struct{})
	tb.Cleanup(func() {
		close(stop)
		<-done
	})
	go func() { // exits when stop is closed
		defer close(done)
		var last, lastEvents []string
		for first := true; ; first = false {
			if !first {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
			sz, err := n.srv.Subsz(&server.SubszOptions{Subscriptions: true, Limit: 1 << 20})
			if err != nil {
				continue
			}
			var self uint64
			if own := n.own.Load(); own != nil {
				self, _ = own.GetClientID()
			}
			var subjects, events []string
			for _, sd := range sz.Subs {
				if sd.Cid == self {
					continue
				}
				if strings.HasPrefix(sd.Subject, "cap.") || strings.HasPrefix(sd.Subject, "work.") {
					subjects = append(subjects, sd.Subject)
				}
				if p, ok := wire.EventPattern(sd.Subject); ok {
					events = append(events, p)
				}
			}
			slices.Sort(subjects)
			subjects = slices.Compact(subjects)
			events = wire.CoverPatterns(events)
			if !first && slices.Equal(subjects, last) && slices.Equal(events, lastEvents) {
				continue
			}
			last, lastEvents = subjects, events
			n.b.SetEventInterest(events)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = n.b.SetLocalInterest(ctx, subjects) // a failed declaration is declared again by the session
			cancel()
		}
	}()
}

type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// waitConnected waits until the node's broker link is connected.
func (n *node) waitConnected(tb testing.TB) {
	tb.Helper()
	meshtest.WaitFor(tb, 15*time.Second, n.name+" connected", func() bool { return n.b.Status().Broker.State == bridge.StateConnected })
}

// waitHosts waits until the bridge sees stage as hosted here and consumes it.
func (n *node) waitHosts(tb testing.TB, stage string) {
	tb.Helper()
	meshtest.WaitFor(tb, 10*time.Second, n.name+" hosting "+stage, func() bool {
		for _, s := range n.b.HostedStages() {
			if s == stage {
				return true
			}
		}
		return false
	})
	waitConsumer(tb, n.cfg.URL, "cmd."+stage)
}

// waitConsumer waits until queue on the broker at brokerURL has a
// consumer: a passive declaration reports the count at once.
func waitConsumer(tb testing.TB, brokerURL, queue string) {
	tb.Helper()
	conn, err := amqp.Dial(brokerURL)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close()
	meshtest.WaitFor(tb, 10*time.Second, "a consumer on "+queue, func() bool {
		ch, err := conn.Channel()
		if err != nil {
			return false
		}
		defer ch.Close()
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err == nil && q.Consumers > 0 // a queue not declared yet closes the channel
	})
}

// request sends a request from n's local program.
func (n *node) request(tb testing.TB, subject string, data []byte, hdr nats.Header, timeout time.Duration) (*nats.Msg, error) {
	tb.Helper()
	m := &nats.Msg{Subject: subject, Data: data, Header: hdr}
	return n.client.RequestMsg(m, timeout)
}

// submit sends a command and requires that it is accepted.
func (n *node) submit(tb testing.TB, stage string, data []byte, hdr nats.Header) *nats.Msg {
	tb.Helper()
	m, err := n.request(tb, "cmd."+stage, data, hdr, 10*time.Second)
	if err != nil {
		tb.Fatalf("submit to %s: %v", stage, err)
	}
	if code, text := natstest.ServiceError(m); code != 0 {
		tb.Fatalf("submit to %s: error %d %s", stage, code, text)
	}
	return m
}

// deadLetters reads (and removes) every message in mesh.dead and in the
// dead-letter queues dead.<stage> of the stages given (which must exist).
func deadLetters(tb testing.TB, ch *amqp.Channel, stages ...string) []amqp.Delivery {
	tb.Helper()
	var out []amqp.Delivery
	for _, q := range append([]string{"mesh.dead"}, prefixed("dead.", stages)...) {
		for {
			d, ok, err := ch.Get(q, true)
			if err != nil {
				tb.Fatal(err)
			}
			if !ok {
				break
			}
			out = append(out, d)
		}
	}
	return out
}

// prefixed returns each of names with prefix.
func prefixed(prefix string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = prefix + n
	}
	return out
}

// brokerProxy puts a cuttable TCP proxy in front of the broker at brokerURL
// and returns the proxied URL.
func brokerProxy(tb testing.TB, brokerURL string) (*meshtest.Proxy, string) {
	tb.Helper()
	u, err := url.Parse(brokerURL)
	if err != nil {
		tb.Fatal(err)
	}
	px := meshtest.NewProxy(tb, u.Host)
	return px, px.Rewrite(brokerURL, u.Host)
}

// recorder collects messages of a subscription.
type recorder struct {
	mu   sync.Mutex
	msgs []*nats.Msg
}

func (r *recorder) add(m *nats.Msg) {
	r.mu.Lock()
	r.msgs = append(r.msgs, m)
	r.mu.Unlock()
}

func (r *recorder) all() []*nats.Msg {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*nats.Msg(nil), r.msgs...)
}

func (r *recorder) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs)
}

func isNoResponders(err error) bool { return errors.Is(err, nats.ErrNoResponders) }

// sharedRabbit returns the package's broker; integration tests skip under
// -short (and only then).
func sharedRabbit(t *testing.T) *meshtest.Rabbit {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: needs RabbitMQ")
	}
	return meshtest.RabbitMQ(t)
}

// testVhost returns the AMQP URL of a fresh vhost for t.
func testVhost(t *testing.T) string {
	t.Helper()
	return sharedRabbit(t).Vhost(t)
}
