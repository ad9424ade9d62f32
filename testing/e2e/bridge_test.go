package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/testing/ledger"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
	"github.com/nats-io/nats.go"
)

// Headers of the node's local API (see the bridge package).
const (
	hdrOrigin       = "Meshbox-Origin"
	hdrMsgID        = "Meshbox-Msg-Id"
	hdrAttempt      = "Meshbox-Attempt"
	hdrRedelivered  = "Meshbox-Redelivered"
	hdrTimeout      = "Meshbox-Timeout"
	hdrAccepted     = "Meshbox-Accepted"
	hdrServiceError = "Nats-Service-Error"
	hdrServiceCode  = "Nats-Service-Error-Code"
)

// bridgeConfig is the bridge part of a node's JSON config file; zero
// fields keep the defaults.
type bridgeConfig struct {
	Routes         map[string]string `json:"routes,omitempty"`
	OutboxMaxBytes int64             `json:"outbox_max_bytes,omitempty"`
	RequestTimeout string            `json:"request_timeout,omitempty"`
	RetryBudget    int               `json:"retry_budget,omitempty"`
	Prefetch       int               `json:"prefetch,omitempty"`
	// MaxStagePrefetch caps a stage's adaptive credit; equal to Prefetch it
	// keeps one consumer per stage.
	MaxStagePrefetch int    `json:"max_stage_prefetch,omitempty"`
	CommandTimeout   string `json:"command_timeout,omitempty"`
	MaxLease         string `json:"max_lease,omitempty"`
	// Dedupe is the stages' idempotency at the node: stage -> {"window",
	// "max_entries"}.
	Dedupe map[string]map[string]any `json:"dedupe,omitempty"`
	// Retry is the stages' retry policies: stage -> {"attempts",
	// "backoff", "max_backoff"}.
	Retry map[string]map[string]any `json:"retry,omitempty"`
}

// startMeshNode runs node name as a child process on the broker at amqpURL,
// with bc in its config file and extra flags (--data, say), and waits until
// its broker link is connected.
func startMeshNode(t *testing.T, name, amqpURL string, bc bridgeConfig, extra ...string) *meshtest.Process {
	t.Helper()
	p := meshtest.StartProcess(t, meshNodeArgs(t, name, amqpURL, bc, extra...)...)
	meshtest.WaitStatus(t, p.HTTPURL(), 30*time.Second, "node "+name+" connected to the broker",
		func(s appliance.Status) bool { return s.Broker.State == "connected" })
	return p
}

// meshNodeArgs are the `meshbox run` flags of a node on the broker at
// amqpURL with bc in its config file.
func meshNodeArgs(t *testing.T, name, amqpURL string, bc bridgeConfig, extra ...string) []string {
	t.Helper()
	return append([]string{"--node", name, "--broker", amqpURL, "--config", bridgeConfigFile(t, name, bc)}, extra...)
}

// bridgeConfigFile writes a config file for node name with bc as its
// bridge part, and returns its path (for --config).
func bridgeConfigFile(t *testing.T, name string, bc bridgeConfig) string {
	t.Helper()
	data, err := json.Marshal(map[string]any{"bridge": bc})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), name+".json")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// waitCallable waits until a call to subject (with headers h) gets an
// answer that ok accepts: routes learned by discovery reach the bridge's
// stand-ins a moment after they show in the status.
func waitCallable(t *testing.T, nc *nats.Conn, subject string, h nats.Header, ok func(*nats.Msg) bool) {
	t.Helper()
	var last string
	if !meshtest.Poll(30*time.Second, func() bool {
		resp, err := nc.RequestMsg(&nats.Msg{Subject: subject, Header: h}, 5*time.Second)
		if err != nil {
			last = err.Error()
			return false
		}
		code, text := natstest.ServiceError(resp)
		last = fmt.Sprintf("code %d %s", code, text)
		return ok(resp)
	}) {
		t.Fatalf("after 30s: %s not callable; last answer: %s", subject, last)
	}
}

// waitRoute waits until the node at httpURL routes capability name to node
// host (discovery learned it).
func waitRoute(t *testing.T, httpURL, name, host string) {
	t.Helper()
	meshtest.WaitStatus(t, httpURL, 30*time.Second, "a route for "+name+" to "+host, func(s appliance.Status) bool {
		return slices.Contains(s.Capabilities.Remote[name], host)
	})
}

// getJSON decodes the JSON answer of GET u (as user guest when basicAuth is
// "guest").
func getJSON(t *testing.T, u, basicAuth string, v any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	if basicAuth != "" {
		req.SetBasicAuth(basicAuth, basicAuth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s: %s", u, resp.Status, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("GET %s: not JSON: %v\n%s", u, err, body)
	}
}

// waitConsumers waits until queue on the broker rmq (vhost of amqpURL) has
// at least n consumers: the nodes hosting a stage are ready for commands.
func waitConsumers(t *testing.T, rmq *meshtest.Rabbit, amqpURL, queue string, n int) {
	t.Helper()
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	vhost := strings.TrimPrefix(u.Path, "/")
	if vhost == "" {
		vhost = "/"
	}
	api := rmq.ManagementURL() + "/api/queues/" + url.PathEscape(vhost) + "/" + url.PathEscape(queue)
	got := -1
	if !meshtest.Poll(30*time.Second, func() bool {
		req, _ := http.NewRequest(http.MethodGet, api, nil)
		req.SetBasicAuth("guest", "guest")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var q struct {
			Consumers int `json:"consumers"`
		}
		if resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&q) == nil {
			got = q.Consumers
		}
		return got >= n
	}) {
		t.Fatalf("queue %s: got %d consumers after 30s, want %d", queue, got, n)
	}
}

// natsConn connects a client with the node's administrative credential
// to its NATS server; closed in cleanup.
func natsConn(t *testing.T, p *meshtest.Process) *nats.Conn {
	t.Helper()
	return p.Connect(t, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
}

// flush makes sure nc's subscriptions are known to its server.
func flush(t *testing.T, nc *nats.Conn) {
	t.Helper()
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		t.Fatalf("flush: %v", err)
	}
}

// timedRequest sends msg and returns the reply and how long it took.
func timedRequest(nc *nats.Conn, msg *nats.Msg, timeout time.Duration) (*nats.Msg, time.Duration, error) {
	start := time.Now()
	resp, err := nc.RequestMsg(msg, timeout)
	return resp, time.Since(start), err
}

func TestBridgeTwoNodes(t *testing.T)   { testMesh(t, []string{"alpha", "beta"}) }
func TestBridgeThreeNodes(t *testing.T) { testMesh(t, []string{"alpha", "beta", "gamma"}) }

// testMesh runs the normal-case scenarios on nodes names[0] (the caller,
// with static routes to names[1]) and the others, each a separate process.
func testMesh(t *testing.T, names []string) {
	if testing.Short() {
		t.Skip("integration test")
	}
	rmq := meshtest.RabbitMQ(t)
	amqpURL := rmq.Vhost(t)
	caller, first, hosts := names[0], names[1], names[1:]
	const defaultTimeout = 2 * time.Second
	procs := map[string]*meshtest.Process{}
	procs[caller] = startMeshNode(t, caller, amqpURL, bridgeConfig{RequestTimeout: defaultTimeout.String()})
	for _, n := range hosts {
		procs[n] = startMeshNode(t, n, amqpURL, bridgeConfig{})
	}
	ncs := map[string]*nats.Conn{}
	for _, n := range names {
		ncs[n] = natsConn(t, procs[n])
	}

	// Every node hosts whoami; the first host also echo and sleepy (which
	// never answers).
	for _, n := range names {
		if _, err := ncs[n].Subscribe("cap.whoami", func(m *nats.Msg) {
			r := nats.NewMsg(m.Reply)
			r.Header.Set("X-Seen-Origin", m.Header.Get(hdrOrigin))
			r.Data = []byte(n)
			_ = m.RespondMsg(r)
		}); err != nil {
			t.Fatal(err)
		}
	}
	echoed := make(chan *nats.Msg, 10)
	if _, err := ncs[first].Subscribe("cap.echo", func(m *nats.Msg) {
		if m.Header.Get("X-Trace") != "" {
			echoed <- m
		}
		r := nats.NewMsg(m.Reply)
		r.Header.Set("Content-Type", "text/plain; charset=utf-8")
		r.Header.Set("Content-Encoding", "identity")
		r.Header.Add("X-Reply", "one")
		r.Header.Add("X-Reply", "two")
		r.Data = append([]byte("echo:"), m.Data...)
		_ = m.RespondMsg(r)
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := ncs[first].Subscribe("cap.sleepy", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	for _, nc := range ncs {
		flush(t, nc)
	}
	// Discovery tells the caller where echo and sleepy are hosted.
	waitRoute(t, procs[caller].HTTPURL(), "echo", first)
	waitRoute(t, procs[caller].HTTPURL(), "sleepy", first)
	waitCallable(t, ncs[caller], "cap.echo", nil, func(m *nats.Msg) bool { c, _ := natstest.ServiceError(m); return c == 0 })
	waitCallable(t, ncs[caller], "cap.sleepy", nats.Header{hdrTimeout: []string{"100ms"}},
		func(m *nats.Msg) bool { c, _ := natstest.ServiceError(m); return c == 504 })

	t.Run("request with headers", func(t *testing.T) {
		req := nats.NewMsg("cap.echo")
		req.Data = []byte(`{"n":1}`)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Trace", "trace-1")
		req.Header.Add("X-Multi", "a")
		req.Header.Add("X-Multi", "b")
		resp, err := ncs[caller].RequestMsg(req, 10*time.Second)
		if err != nil {
			t.Fatalf("cap.echo from %s: %v", caller, err)
		}
		if code, text := natstest.ServiceError(resp); code != 0 {
			t.Fatalf("cap.echo: error reply %d %s", code, text)
		}
		if got, want := string(resp.Data), `echo:{"n":1}`; got != want {
			t.Errorf("reply body: got %q, want %q", got, want)
		}
		for _, h := range []struct {
			key  string
			want []string
		}{
			{"Content-Type", []string{"text/plain; charset=utf-8"}},
			{"Content-Encoding", []string{"identity"}},
			{"X-Reply", []string{"one", "two"}},
		} {
			if got := resp.Header.Values(h.key); !slices.Equal(got, h.want) {
				t.Errorf("reply header %s: got %q, want %q", h.key, got, h.want)
			}
		}
		var in *nats.Msg
		select {
		case in = <-echoed:
		case <-time.After(5 * time.Second):
			t.Fatal("the echo handler saw no request")
		}
		for _, h := range []struct {
			key  string
			want []string
		}{
			{"Content-Type", []string{"application/json"}},
			{"X-Trace", []string{"trace-1"}},
			{"X-Multi", []string{"a", "b"}},
			{hdrOrigin, []string{caller}},
		} {
			if got := in.Header.Values(h.key); !slices.Equal(got, h.want) {
				t.Errorf("request header %s at the handler: got %q, want %q", h.key, got, h.want)
			}
		}
		if string(in.Data) != `{"n":1}` {
			t.Errorf("request body at the handler: got %q, want %q", in.Data, `{"n":1}`)
		}
	})

	t.Run("every node calls every node", func(t *testing.T) {
		for _, from := range names {
			for _, to := range names {
				resp, err := ncs[from].Request("node."+to+".cap.whoami", nil, 10*time.Second)
				if err != nil {
					t.Errorf("node.%s.cap.whoami from %s: %v", to, from, err)
					continue
				}
				if code, text := natstest.ServiceError(resp); code != 0 {
					t.Errorf("node.%s.cap.whoami from %s: error %d %s", to, from, code, text)
					continue
				}
				if string(resp.Data) != to || resp.Header.Get("X-Seen-Origin") != from {
					t.Errorf("node.%s.cap.whoami from %s: got %q from origin %q, want %q from %q",
						to, from, resp.Data, resp.Header.Get("X-Seen-Origin"), to, from)
				}
			}
		}
	})

	t.Run("no host fails at once", func(t *testing.T) {
		const atOnce = time.Second
		// Nobody hosts cap.nothing and no route names it: the node answers
		// 503 (or the NATS server its own "no responders", also a 503).
		resp, d, err := timedRequest(ncs[caller], nats.NewMsg("cap.nothing"), 10*time.Second)
		if code, text := natstest.ServiceError(resp); !errors.Is(err, nats.ErrNoResponders) && (err != nil || code != 503 || text == "") || d > atOnce {
			t.Errorf("cap.nothing: got %v, code %d %q after %s, want a 503 within %s", err, code, text, d, atOnce)
		}
		for _, subj := range []string{
			"node.nobody.cap.whoami",         // no such node
			"node." + first + ".cap.nothing", // the node exists but hosts no such capability
		} {
			resp, d, err := timedRequest(ncs[caller], nats.NewMsg(subj), 10*time.Second)
			if err != nil {
				t.Errorf("%s: %v after %s, want a 503 reply", subj, err, d)
				continue
			}
			code, text := natstest.ServiceError(resp)
			if code != 503 || text == "" || d > atOnce {
				t.Errorf("%s: got code %d %q after %s, want 503 with a reason within %s", subj, code, text, d, atOnce)
			}
		}
	})

	t.Run("deadline", func(t *testing.T) {
		const margin = 500 * time.Millisecond
		for _, tt := range []struct {
			subject string
			header  string
			want    time.Duration
		}{
			{"cap.sleepy", "", defaultTimeout},
			{"cap.sleepy", "600ms", 600 * time.Millisecond},
			{"node." + first + ".cap.sleepy", "800ms", 800 * time.Millisecond},
			{"cap.sleepy", "3s", 3 * time.Second}, // or lengthen the default
		} {
			req := nats.NewMsg(tt.subject)
			if tt.header != "" {
				req.Header.Set(hdrTimeout, tt.header)
			}
			resp, d, err := timedRequest(ncs[caller], req, 10*time.Second)
			if err != nil {
				t.Errorf("%s (%s %q): %v after %s, want a 504 reply", tt.subject, hdrTimeout, tt.header, err, d)
				continue
			}
			code, text := natstest.ServiceError(resp)
			if code != 504 || !strings.Contains(text, "deadline") && !strings.Contains(text, "within") {
				t.Errorf("%s (%s %q): got code %d %q, want 504 naming the deadline", tt.subject, hdrTimeout, tt.header, code, text)
			}
			if d < tt.want-20*time.Millisecond || d > tt.want+margin {
				t.Errorf("%s (%s %q): answered after %s, want %s (+%s)", tt.subject, hdrTimeout, tt.header, d, tt.want, margin)
			}
		}
	})

	t.Run("commands handled once", func(t *testing.T) {
		const n = 300
		h := ledger.NewHistory()
		var wrongMeta atomic.Int64
		var perNode sync.Map
		for _, host := range hosts {
			if _, err := ncs[host].QueueSubscribe("work.job", "workers", func(m *nats.Msg) {
				h.Delivered(ledger.DeliveryOf(host, m))
				if m.Header.Get(hdrAttempt) != "1" || m.Header.Get(hdrRedelivered) != "false" ||
					m.Header.Get(hdrOrigin) != caller || m.Header.Get(hdrMsgID) == "" {
					wrongMeta.Add(1)
				}
				c, _ := perNode.LoadOrStore(host, new(atomic.Int64))
				c.(*atomic.Int64).Add(1)
				_ = m.Respond(nil)
			}); err != nil {
				t.Fatal(err)
			}
			flush(t, ncs[host])
		}
		waitConsumers(t, rmq, amqpURL, "cmd.job", len(hosts))

		var wg sync.WaitGroup
		var next atomic.Int64
		for range 8 {
			wg.Add(1)
			go func() { // submitter: exits when every command is submitted
				defer wg.Done()
				for {
					seq := int(next.Add(1)) - 1
					if seq >= n {
						return
					}
					o, _, _ := ledger.Submit(ncs[caller], "cmd.job", ledger.Payload(caller, seq), 10*time.Second)
					h.Submitted(ledger.Op{Origin: caller, Seq: seq}, o)
				}
			}()
		}
		wg.Wait()
		if !meshtest.Poll(30*time.Second, func() bool { return h.Count() >= n }) {
			t.Errorf("after 30s: %d of %d commands handled", h.Count(), n)
		}
		time.Sleep(time.Second) // room for a duplicate to show up
		r := h.Check()
		t.Logf("commands, %d hosting nodes:\n%s", len(hosts), r)
		var dist []string
		for _, host := range hosts {
			c, _ := perNode.LoadOrStore(host, new(atomic.Int64))
			dist = append(dist, fmt.Sprintf("%s=%d", host, c.(*atomic.Int64).Load()))
		}
		t.Logf("handled per node: %s", strings.Join(dist, " "))
		if r.Acked != n {
			t.Errorf("acknowledged: got %d of %d (refused %d, indeterminate %d)", r.Acked, n, r.Refused, r.Indeterminate)
		}
		if !r.Valid() || r.DupMarked != 0 || r.Deliveries != n {
			t.Errorf("got %d deliveries, want each of %d commands handled exactly once:\n%s", r.Deliveries, n, r)
		}
		if w := wrongMeta.Load(); w != 0 {
			t.Errorf("%d deliveries with attempt != 1, a redelivery mark, a wrong origin or no message id; want none in the normal case", w)
		}
	})

	t.Run("events reach every other node and never echo", func(t *testing.T) {
		const k = 100
		h := ledger.NewHistory()
		var echoes, badOrigin atomic.Int64
		for _, n := range names {
			if _, err := ncs[n].Subscribe("evt.e2e.>", func(m *nats.Msg) {
				d := ledger.DeliveryOf(n, m)
				h.Delivered(d)
				origin := m.Header.Get(hdrOrigin)
				switch {
				case d.Op.Origin == n && origin != "":
					echoes.Add(1) // its own event came back from the mesh
				case d.Op.Origin != n && origin != d.Op.Origin:
					badOrigin.Add(1)
				}
			}); err != nil {
				t.Fatal(err)
			}
			flush(t, ncs[n])
		}
		for _, n := range names {
			waitListening(t, procs[n], "evt.e2e.>", slices.Collect(maps.Values(procs))...)
		}
		for i := range k {
			for _, n := range names {
				if err := ncs[n].Publish("evt.e2e.tick", ledger.Payload(n, i)); err != nil {
					t.Fatal(err)
				}
				h.Submitted(ledger.Op{Origin: n, Seq: i}, ledger.Acked)
			}
		}
		for _, n := range names {
			flush(t, ncs[n])
		}
		want := k * len(names) * len(names)
		if !meshtest.Poll(30*time.Second, func() bool { return h.Count() >= want }) {
			t.Errorf("after 30s: %d of %d event deliveries", h.Count(), want)
		}
		time.Sleep(1500 * time.Millisecond) // room for an echo or a duplicate
		for _, n := range names {
			r := h.CheckAt(n)
			t.Logf("events at %s:\n%s", n, r)
			if !r.Valid() || r.DupMarked != 0 || r.Deliveries != k*len(names) {
				t.Errorf("node %s: got %d event deliveries, want each of %d exactly once:\n%s", n, r.Deliveries, k*len(names), r)
			}
		}
		if e := echoes.Load(); e != 0 {
			t.Errorf("echoes: got %d own events back from the mesh, want 0", e)
		}
		if b := badOrigin.Load(); b != 0 {
			t.Errorf("%d mesh events without the right %s header, want 0", b, hdrOrigin)
		}
	})
}

func TestSameNodeNameOnBrokerIsRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	rmq := meshtest.RabbitMQ(t)
	amqpURL := rmq.Vhost(t)
	first := startMeshNode(t, "twin", amqpURL, bridgeConfig{})
	host := natsConn(t, first)
	if _, err := host.Subscribe("cap.whoami", func(m *nats.Msg) { _ = m.Respond([]byte("first")) }); err != nil {
		t.Fatal(err)
	}
	flush(t, host)
	caller := startMeshNode(t, "caller", amqpURL, bridgeConfig{})

	// Another data directory, the same name, the same broker.
	start := time.Now()
	code, out := meshtest.StartProcessExpectFailure(t, meshNodeArgs(t, "twin", amqpURL, bridgeConfig{})...)
	if code == 0 {
		t.Fatalf("second process named twin: exit 0, want a refusal\n%s", out)
	}
	if !strings.Contains(out, "node name") || !strings.Contains(out, "in use") {
		t.Errorf("second process output: want an error saying the node name is in use, got\n%s", out)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("refusal took %s, want it at once", d)
	}

	// The first keeps its name and its traffic.
	nc := natsConn(t, caller)
	for i := range 5 {
		resp, err := nc.Request("node.twin.cap.whoami", nil, 5*time.Second)
		if err != nil {
			t.Fatalf("call %d to twin after the refusal: %v", i, err)
		}
		if code, text := natstest.ServiceError(resp); code != 0 || string(resp.Data) != "first" {
			t.Fatalf("call %d to twin after the refusal: got %q (error %d %s), want first", i, resp.Data, code, text)
		}
	}
	if st := meshtest.Status(t, first.HTTPURL()); st.Broker.State != "connected" {
		t.Errorf("first twin: broker.state %q, want connected", st.Broker.State)
	}
}

// startTwoNodes starts a mesh database and broker, and the nodes alpha
// (which made the mesh) and beta (recorded by the admin) as processes.
func startTwoNodes(t *testing.T) (alpha, beta *meshtest.Process, db string) {
	t.Helper()
	meshtest.Binary(t) // built before cli's timeout starts
	vhost := meshtest.RabbitMQ(t).Vhost(t)
	db = meshtest.Postgres(t).Database(t)
	if code, _, errOut := cli(t, "init", "--db", db, "--node", "alpha", "--broker", meshtest.NoCredential(vhost)); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	mesh(t, db, "node", "add", "beta", "--record-only")
	alpha = meshtest.StartProcess(t, "--node", "alpha", "--db", db)
	beta = meshtest.StartProcess(t, "--node", "beta", "--db", db)
	return alpha, beta, db
}

// twoNodeMesh is startTwoNodes, returning once both nodes are connected to
// the broker.
func twoNodeMesh(t *testing.T) (alpha, beta *meshtest.Process, db string) {
	t.Helper()
	alpha, beta, db = startTwoNodes(t)
	for _, p := range []*meshtest.Process{alpha, beta} {
		meshtest.WaitStatus(t, p.HTTPURL(), 20*time.Second, p.Node()+" connected to the broker", func(s appliance.Status) bool { return s.Broker.State == "connected" })
	}
	// A node holds the mesh's content key once another sealed it for it
	// through the database: until then it refuses to seal (503).
	for _, p := range []*meshtest.Process{alpha, beta} {
		waitKeysInStep(t, p)
	}
	return alpha, beta, db
}
