package appliance

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// localConfig is the configuration of a standalone node named name on
// free loopback ports, with its data in dataDir.
func localConfig(name, dataDir string) Config {
	cfg := DefaultConfig()
	cfg.Node = name
	cfg.DataDir = dataDir
	cfg.NATS = "127.0.0.1:0"
	cfg.HTTP = "127.0.0.1:0"
	return cfg
}

// startNode starts a standalone node on free ports in its own data
// directory and closes it in cleanup.
func startNode(t testing.TB, name, dataDir string) *Appliance {
	t.Helper()
	cfg := localConfig(name, dataDir)
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := a.Close(); err != nil {
			t.Errorf("close %s: %v", name, err)
		}
	})
	return a
}

func TestTwoNodesSideBySide(t *testing.T) {
	a := startNode(t, "alpha", t.TempDir())
	b := startNode(t, "beta", t.TempDir())
	if a.NATSURL() == b.NATSURL() || a.HTTPURL() == b.HTTPURL() {
		t.Fatalf("got shared addresses %s %s, want distinct", a.NATSURL(), b.NATSURL())
	}
	for _, n := range []*Appliance{a, b} {
		st := n.Status()
		if st.Broker.State != "none" {
			t.Errorf("%s broker.state: got %q, want none", st.Node, st.Broker.State)
		}
		if st.NATS.URL != n.NATSURL() {
			t.Errorf("%s nats.url: got %q, want %q", st.Node, st.NATS.URL, n.NATSURL())
		}
	}
}

func TestDataDirInUse(t *testing.T) {
	dir := t.TempDir()
	startNode(t, "alpha", dir)
	cfg := localConfig("alpha2", dir)
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = a.Start(context.Background())
	if !errors.Is(err, ErrDataDirInUse) {
		t.Fatalf("got %v, want ErrDataDirInUse", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("refusal took %s, want it at once", d)
	}
	if err := a.Close(); err != nil {
		t.Errorf("close after failed start: %v", err)
	}
}

func TestNATSAndStatusEndpoints(t *testing.T) {
	a := startNode(t, "alpha", t.TempDir())
	nc, err := nats.Connect(a.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	// Request/reply between ordinary clients through the embedded server.
	sub, err := nc.Subscribe("cap.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	msg, err := nc.Request("cap.echo", []byte("hi"), 2*time.Second)
	if err != nil {
		t.Fatalf("echo: %v", err)
	}
	if string(msg.Data) != "hi" {
		t.Fatalf("echo: got %q, want hi", msg.Data)
	}

	// The node's own API answers status.
	msg, err = nc.Request(SubjectStatus, nil, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var st Status
	if err := json.Unmarshal(msg.Data, &st); err != nil {
		t.Fatal(err)
	}
	if st.Node != "alpha" || st.StartedAt.IsZero() {
		t.Errorf("status: got node %q started %v, want alpha and a start time", st.Node, st.StartedAt)
	}

	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/status": 200, "/metrics": 200, "/nope": 404} {
		resp, err := http.Get(a.HTTPURL() + path)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: got %d, want %d", path, resp.StatusCode, want)
		}
	}
}

func TestCloseIsIdempotentAndStartAfterCloseFails(t *testing.T) {
	cfg := localConfig("alpha", t.TempDir())
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("close before start: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if err := a.Start(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("start after close: got %v, want ErrClosed", err)
	}
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Node = "bad name"
	if _, err := New(cfg, nil); err == nil {
		t.Fatal("got no error for an invalid node name, want one")
	}
}

func TestCallToUnhostedCapabilityFailsAtOnce(t *testing.T) {
	a := startNode(t, "alpha", t.TempDir())
	nc, err := nats.Connect(a.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// Nobody listens on cap.nobody (the node keeps no catch-all): the
	// server answers "no responders" at once, and `meshbox call` names the
	// capability in its error.
	start := time.Now()
	if _, err := nc.Request("cap.nobody", nil, 5*time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("got %v, want nats.ErrNoResponders", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("answered after %s, want at once", d)
	}

	// With a host, the host alone answers.
	sub, err := nc.SubscribeSync(nats.NewInbox())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Subscribe("cap.somebody", func(m *nats.Msg) { _ = m.Respond([]byte("here")) }); err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest("cap.somebody", sub.Subject, nil); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(2 * time.Second)
	if err != nil || string(m.Data) != "here" || m.Header.Get("Nats-Service-Error") != "" {
		t.Fatalf("got %v %v, want the host's answer", m, err)
	}
	if extra, err := sub.NextMsg(300 * time.Millisecond); err == nil {
		t.Fatalf("got a second answer %q %v, want the host's alone", extra.Data, extra.Header)
	}
}

// A hosted capability gets its host's answer however many requests pass
// (the server's match cache is flushed after about a thousand distinct
// subjects, such as reply inboxes).
func TestHostedCapabilityNeverGetsNoHostAnswer(t *testing.T) {
	a := startNode(t, "alpha", t.TempDir())
	nc, err := nats.Connect(a.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Subscribe("cap.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		t.Fatal(err)
	}
	failed := 0
	for i := range 3000 {
		m, err := nc.Request("cap.echo", []byte("x"), 2*time.Second)
		if err != nil || m.Header.Get("Nats-Service-Error") != "" {
			failed++
			if failed == 1 {
				t.Errorf("call %d: got %v %v, want the host's answer", i, err, m)
			}
		}
	}
	if failed > 0 {
		t.Fatalf("%d of 3000 calls did not get the host's answer", failed)
	}
}

// /debug/pprof is served only when configured.
func TestPprofIsOptIn(t *testing.T) {
	for _, on := range []bool{false, true} {
		cfg := localConfig("alpha", t.TempDir())
		cfg.Pprof = on
		a, err := New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		resp, err := http.Get(a.HTTPURL() + "/debug/pprof/heap")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		want := http.StatusNotFound
		if on {
			want = http.StatusOK
		}
		if resp.StatusCode != want {
			t.Errorf("pprof %v: GET /debug/pprof/heap: got %d, want %d", on, resp.StatusCode, want)
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
