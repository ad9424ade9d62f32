package e2e

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/testing/ledger"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/nats-io/nats.go"
)

// stageCalls serves work.<stage> on nc; reply answers each delivery. It
// returns what the handler saw so far.
func stageCalls(t *testing.T, nc *nats.Conn, stage string, reply func(m *nats.Msg) *nats.Msg) func() []*nats.Msg {
	t.Helper()
	var mu sync.Mutex
	var got []*nats.Msg
	if _, err := nc.QueueSubscribe("work."+stage, "workers", func(m *nats.Msg) {
		mu.Lock()
		got = append(got, m)
		mu.Unlock()
		r := reply(m)
		r.Subject = m.Reply
		_ = m.RespondMsg(r)
	}); err != nil {
		t.Fatal(err)
	}
	flush(t, nc)
	return func() []*nats.Msg {
		mu.Lock()
		defer mu.Unlock()
		return append([]*nats.Msg(nil), got...)
	}
}

// The real binary with bridge.retry: a transient failure is tried again
// after the stage's backoff, and the command's result arrives as an event
// on its Meshbox-Result-Topic with the command's message id.
func TestRetryAndResultWithTheRealBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	rmq := meshtest.RabbitMQ(t)
	amqpURL := rmq.Vhost(t)
	const backoff = time.Second
	p := startMeshNode(t, "alpha", amqpURL, bridgeConfig{
		Retry: map[string]map[string]any{"render": {"attempts": 3, "backoff": "1s"}},
	})
	nc := natsConn(t, p)
	events := make(chan *nats.Msg, 4)
	if _, err := nc.ChanSubscribe("evt.renders.done", events); err != nil {
		t.Fatal(err)
	}
	var failedAt time.Time
	var mu sync.Mutex
	calls := stageCalls(t, nc, "render", func(m *nats.Msg) *nats.Msg {
		r := nats.NewMsg("")
		if m.Header.Get("Meshbox-Attempt") == "1" {
			mu.Lock()
			failedAt = time.Now()
			mu.Unlock()
			r.Header.Set("Nats-Service-Error-Code", "503")
			r.Header.Set("Nats-Service-Error", "the renderer is warming up")
			return r
		}
		r.Data = []byte("page.png")
		return r
	})
	waitConsumers(t, rmq, amqpURL, "cmd.render", 1)
	msg := &nats.Msg{Subject: "cmd.render", Data: []byte("page"),
		Header: nats.Header{hdrMsgID: {"e2e-render-1"}, "Meshbox-Result-Topic": {"renders.done"}}}
	if out, resp, err := ledger.SubmitMsg(nc, msg, 10*time.Second); out != ledger.Acked {
		t.Fatalf("submit: %v %v %v", out, resp, err)
	}
	var e *nats.Msg
	select {
	case e = <-events:
	case <-time.After(15 * time.Second):
		t.Fatal("no result event")
	}
	got := calls()
	if len(got) != 2 {
		t.Fatalf("handler calls: got %d, want 2", len(got))
	}
	mu.Lock()
	delay := time.Since(failedAt)
	mu.Unlock()
	// The event came after the second attempt, which came after the
	// backoff: measured from the failure to the result. The broker
	// expires the waiting copy at its TTL within a few milliseconds,
	// either way (once 5 ms early on a loaded machine): 50 ms of slack.
	t.Logf("result %s after the failed attempt (backoff %s)", delay, backoff)
	if delay < backoff-50*time.Millisecond || delay > backoff+5*time.Second {
		t.Errorf("result %s after the failed attempt, want the backoff %s (within 50 ms) and at most 5s more", delay, backoff)
	}
	if got[1].Header.Get("Meshbox-Attempt") != "2" || got[1].Header.Get("Meshbox-Result-Topic") != "renders.done" {
		t.Errorf("second delivery: got %v", got[1].Header)
	}
	if string(e.Data) != "page.png" || e.Header.Get(hdrMsgID) != "e2e-render-1" {
		t.Errorf("result event: got %q %v", e.Data, e.Header)
	}
	if v := metricValue(t, p, `meshbox_command_retries_total{stage="render"}`); v != 1 {
		t.Errorf("retries counted: got %v, want 1", v)
	}
}

// The real binary and `meshbox dlq`: a permanent failure (422) is
// dead-lettered at once with its reason and counted (status JSON, meshbox
// status, metric); `dlq show` tells it, `dlq replay` delivers it again
// with the attempt count reset and the replay recorded, and `dlq purge`
// empties the stage's dead letters.
func TestDeadLettersWithTheRealBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	rmq := meshtest.RabbitMQ(t)
	amqpURL := rmq.Vhost(t)
	p := startMeshNode(t, "alpha", amqpURL, bridgeConfig{
		Retry: map[string]map[string]any{"orders": {"attempts": 5, "backoff": "10s"}},
	})
	creds := []string{"--server", p.NATSURL(), "--creds", filepath.Join(p.DataDir(), programs.AdminFile)}
	dlq := func(args ...string) (int, string, string) {
		t.Helper()
		return cli(t, append(append([]string{"dlq"}, args...), creds...)...)
	}
	nc := natsConn(t, p)
	var accept sync.Map
	calls := stageCalls(t, nc, "orders", func(m *nats.Msg) *nats.Msg {
		r := nats.NewMsg("")
		if _, ok := accept.Load(m.Header.Get(hdrMsgID)); !ok {
			r.Header.Set("Nats-Service-Error-Code", "422")
			r.Header.Set("Nats-Service-Error", "no such customer")
		}
		return r
	})
	waitConsumers(t, rmq, amqpURL, "cmd.orders", 1)
	submit := func(id string) {
		t.Helper()
		msg := &nats.Msg{Subject: "cmd.orders", Data: []byte("order"), Header: nats.Header{hdrMsgID: {id}, "X-Customer": {"42"}}}
		if out, resp, err := ledger.SubmitMsg(nc, msg, 10*time.Second); out != ledger.Acked {
			t.Fatalf("submit: %v %v %v", out, resp, err)
		}
	}
	submit("e2e-order-1")
	if !meshtest.Poll(5*time.Second, func() bool {
		st := meshtest.Status(t, p.HTTPURL())
		return st.DeadLetters["orders"] == 1
	}) {
		t.Fatal("the status never counted the dead letter")
	}
	if n := len(calls()); n != 1 {
		t.Errorf("handler calls: got %d, want 1 (a permanent failure is not retried)", n)
	}
	if v := metricValue(t, p, `meshbox_dead_letters{stage="orders"}`); v != 1 {
		t.Errorf("meshbox_dead_letters{stage=orders}: got %v, want 1", v)
	}
	if _, out, _ := cli(t, append([]string{"status"}, creds...)...); !strings.Contains(out, "orders 1") {
		t.Errorf("meshbox status does not count the dead letter:\n%s", out)
	}

	code, out, errOut := dlq("list", "orders", "--json")
	var list struct {
		Letters []struct {
			ID, Reason string
			Attempts   int
		}
	}
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list.Letters) != 1 {
		t.Fatalf("dlq list: exit %d\n%s\n%s", code, out, errOut)
	}
	if l := list.Letters[0]; l.ID != "e2e-order-1" || l.Attempts != 1 || !strings.Contains(l.Reason, "422 no such customer") {
		t.Errorf("dlq list: got %+v", l)
	}
	if code, out, errOut := dlq("list"); code != 0 || !strings.Contains(out, "orders") || !strings.Contains(out, "e2e-order-1") {
		t.Errorf("dlq list of every stage: exit %d\n%s\n%s", code, out, errOut)
	}
	code, out, errOut = dlq("show", "orders", "e2e-order-1")
	if code != 0 || !strings.Contains(out, "permanent failure at attempt 1") || !strings.Contains(out, "X-Customer: 42") ||
		!strings.Contains(out, "first failure") {
		t.Errorf("dlq show: exit %d\n%s\n%s", code, out, errOut)
	}

	// Bad arguments are refused before anything is asked.
	for _, args := range [][]string{
		{"replay", "orders"},                         // neither an id nor --all
		{"replay", "orders", "e2e-order-1", "--all"}, // both
		{"show", "orders"},                           // no id
		{"purge", "bad stage"},                       // not a stage name
		{"list", "orders", "extra"},                  // too many
		{"erase", "orders"},                          // no such action
	} {
		if code, _, _ := dlq(args...); code == 0 {
			t.Errorf("dlq %v: exit 0, want a refusal", args)
		}
	}

	accept.Store("e2e-order-1", true)
	if code, out, errOut := dlq("replay", "orders", "e2e-order-1"); code != 0 || !strings.Contains(out, "replayed 1") {
		t.Fatalf("dlq replay: exit %d\n%s\n%s", code, out, errOut)
	}
	if !meshtest.Poll(10*time.Second, func() bool { return len(calls()) == 2 }) {
		t.Fatal("the replayed command was not delivered")
	}
	h := calls()[1].Header
	if h.Get("Meshbox-Attempt") != "1" || !strings.Contains(h.Get("Meshbox-Replayed"), "by alpha") || h.Get("X-Customer") != "42" {
		t.Errorf("replayed delivery: got %v", h)
	}
	if code, out, _ := dlq("list", "orders"); code != 0 || !strings.Contains(out, "no dead letters") {
		t.Errorf("dlq list after the replay: exit %d\n%s", code, out)
	}

	submit("e2e-order-2")
	submit("e2e-order-3")
	if !meshtest.Poll(5*time.Second, func() bool {
		_, out, _ := dlq("list", "orders")
		return strings.Contains(out, "e2e-order-2") && strings.Contains(out, "e2e-order-3")
	}) {
		t.Fatal("the two dead letters never showed")
	}
	if code, out, errOut := dlq("purge", "orders"); code != 0 || !strings.Contains(out, "purged 2") {
		t.Fatalf("dlq purge: exit %d\n%s\n%s", code, out, errOut)
	}
	if code, out, _ := dlq("list", "orders"); code != 0 || !strings.Contains(out, "no dead letters") {
		t.Errorf("dlq list after the purge: exit %d\n%s", code, out)
	}
	st := meshtest.Status(t, p.HTTPURL())
	if st.DeadLetters["orders"] != 0 {
		t.Errorf("status count after the purge: got %d", st.DeadLetters["orders"])
	}
}
