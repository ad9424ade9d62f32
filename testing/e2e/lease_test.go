package e2e

import (
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/nats-io/nats.go"
)

// commandsStatus is the commands-in-flight part of a node's status.
type commandsStatus struct {
	Commands []struct {
		Stage                 string  `json:"stage"`
		MsgID                 string  `json:"msg_id"`
		Attempt               int     `json:"attempt"`
		State                 string  `json:"state"`
		AgeSeconds            float64 `json:"age_seconds"`
		LeaseRemainingSeconds float64 `json:"lease_remaining_seconds"`
	} `json:"commands"`
}

// The real binary: a handler that takes 3x command_timeout while sending
// progress completes once, with no retry; meanwhile the status (JSON and
// `meshbox status`) shows the command in flight with its lease.
func TestLeaseWithTheRealBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
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
	if out, resp, err := submitMsg(nc, msg, 10*time.Second); out != acked {
		t.Fatalf("submit: %v %v %v", out, resp, err)
	}
	ok := waitFor(5*time.Second, func() bool {
		var st commandsStatus
		getJSON(t, p.HTTPURL()+"/status", "", &st)
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
	if !waitFor(5*time.Second, func() bool {
		var st commandsStatus
		getJSON(t, p.HTTPURL()+"/status", "", &st)
		return len(st.Commands) == 0
	}) {
		t.Fatal("the command stayed in flight after its result")
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("handler calls: got %d, want 1 (no retry)", n)
	}
}
