package e2e

import (
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/testing/ledger"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/nats-io/nats.go"
)

// The real binary: a handler that takes 3x command_timeout while sending
// progress completes once, with no retry; meanwhile the status (JSON and
// `meshbox status`) shows the command in flight with its lease.
func TestLeaseWithTheRealBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	rmq := meshtest.RabbitMQ(t)
	amqpURL := rmq.Vhost(t)
	p := startMeshNode(t, "alpha", amqpURL, bridgeConfig{CommandTimeout: "1s", MaxLease: "20s"})
	nc := natsConn(t, p)
	var calls atomic.Int32
	done := make(chan struct{})
	if _, err := nc.QueueSubscribe("work.long", "workers", func(m *nats.Msg) {
		if calls.Add(1) != 1 {
			return // a retry: counted, never answered
		}
		go func() { // exits after its reply
			end := time.Now().Add(3 * time.Second)
			for time.Now().Before(end) {
				time.Sleep(250 * time.Millisecond)
				pm := nats.NewMsg(m.Reply)
				pm.Header.Set("Meshbox-Progress", "1")
				_ = m.RespondMsg(pm)
			}
			_ = m.Respond([]byte("done"))
			close(done)
		}()
	}); err != nil {
		t.Fatal(err)
	}
	flush(t, nc)
	waitConsumers(t, rmq, amqpURL, "cmd.long", 1)

	msg := &nats.Msg{Subject: "cmd.long", Data: []byte("x"), Header: nats.Header{hdrMsgID: {"e2e-long-1"}}}
	if out, resp, err := ledger.SubmitMsg(nc, msg, 10*time.Second); out != ledger.Acked {
		t.Fatalf("submit: %v %v %v", out, resp, err)
	}
	ok := meshtest.Poll(5*time.Second, func() bool {
		st := meshtest.Status(t, p.HTTPURL())
		for _, c := range st.Commands {
			if c.MsgID == "e2e-long-1" && c.Stage == "long" && c.Attempt == 1 && c.AgeSeconds > 1.5 && c.LeaseRemainingSeconds > 0 {
				return true
			}
		}
		return false
	})
	if !ok {
		t.Fatal("the status never showed the command in flight past its first deadline with a lease left")
	}
	_, out, _ := cli(t, "status", "--server", p.NATSURL(), "--creds", filepath.Join(p.DataDir(), programs.AdminFile))
	if !strings.Contains(out, "stage long id e2e-long-1 attempt 1") {
		t.Errorf("meshbox status does not list the command in flight:\n%s", out)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not finish")
	}
	if !meshtest.Poll(5*time.Second, func() bool {
		st := meshtest.Status(t, p.HTTPURL())
		return len(st.Commands) == 0
	}) {
		t.Fatal("the command stayed in flight after its result")
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("handler calls: got %d, want 1 (no retry)", n)
	}
}

// The real binary with bridge.dedupe: the same Meshbox-Msg-Id submitted
// twice is one command (the handler runs once, the duplicate counted in
// the metrics), and still after the node restarts on its data directory.
func TestDedupeWithTheRealBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	rmq := meshtest.RabbitMQ(t)
	amqpURL := rmq.Vhost(t)
	bc := bridgeConfig{Dedupe: map[string]map[string]any{"once": {"window": "1h", "max_entries": 1000}}}
	data := t.TempDir()
	var calls atomic.Int32
	run := func(p *meshtest.Process) {
		nc := natsConn(t, p)
		if _, err := nc.QueueSubscribe("work.once", "workers", func(m *nats.Msg) {
			calls.Add(1)
			_ = m.Respond(nil)
		}); err != nil {
			t.Fatal(err)
		}
		flush(t, nc)
		waitConsumers(t, rmq, amqpURL, "cmd.once", 1)
		// One after the other: two deliveries of one id at the same moment
		// may both run (see the README).
		for range 2 {
			before := calls.Load() + int32(metricValue(t, p, `meshbox_commands_deduplicated_total{stage="once"}`))
			msg := &nats.Msg{Subject: "cmd.once", Data: []byte("x"), Header: nats.Header{hdrMsgID: {"e2e-once-1"}}}
			if out, resp, err := ledger.SubmitMsg(nc, msg, 10*time.Second); out != ledger.Acked {
				t.Fatalf("submit: %v %v %v", out, resp, err)
			}
			if !meshtest.Poll(10*time.Second, func() bool {
				return calls.Load()+int32(metricValue(t, p, `meshbox_commands_deduplicated_total{stage="once"}`)) > before
			}) {
				t.Fatal("the submission was neither handled nor counted as a duplicate")
			}
		}
		nc.Close()
	}

	p := startMeshNode(t, "alpha", amqpURL, bc, "--data", data)
	run(p)
	if n := calls.Load(); n != 1 {
		t.Fatalf("handler calls before the restart: got %d, want 1", n)
	}
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(); code != 0 {
		t.Fatalf("node exit %d", code)
	}
	p = startMeshNode(t, "alpha", amqpURL, bc, "--data", data)
	run(p) // both submissions are duplicates now
	if got := metricValue(t, p, `meshbox_commands_deduplicated_total{stage="once"}`); got != 2 {
		t.Errorf("duplicates counted after the restart: got %v, want 2", got)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("handler calls after the restart: got %d, want still 1", n)
	}
}

// metricValue returns the value of the series (name with its labels, as
// the text format prints it) in the node's /metrics; 0 when absent.
func metricValue(t *testing.T, p *meshtest.Process, series string) float64 {
	t.Helper()
	resp, err := http.Get(p.HTTPURL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("metric %s: %v", series, err)
			}
			return f
		}
	}
	return 0
}
