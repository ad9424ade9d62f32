package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/testing/ledger"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// TestStageGrantedToARunningNode: a stage granted to a running node with
// `meshbox mesh node set-stages` is consumed for the handler that serves
// it already, within seconds, with neither the node nor the handler
// restarted. Until the grant, the broker refuses the node the stage and
// the node's status says so, with the command that grants it.
func TestStageGrantedToARunningNode(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	m := newIdentityMesh(t, "ant", "bee")
	// bee may consume stage resize, not thumbs.
	if code, out, errOut := cliEnv(t, m.admin, "mesh", "node", "set-stages", "bee", "resize"); code != 0 {
		t.Fatalf("set-stages bee resize: exit %d: %s%s", code, out, errOut)
	}
	ant, bee := m.start(t, "ant"), m.start(t, "bee")
	waitSealing(t, ant)
	waitSealing(t, bee)

	// The handler on bee runs from before the grant to the end.
	handled := make(chan string, 16)
	hnc := natsConn(t, bee)
	if _, err := hnc.QueueSubscribe("work.thumbs", "handlers", func(msg *nats.Msg) {
		select {
		case handled <- string(msg.Data):
		default:
		}
		_ = msg.Respond(nil)
	}); err != nil {
		t.Fatal(err)
	}
	flush(t, hnc)
	refused := func(s appliance.Status) string {
		for _, w := range s.Warnings {
			if strings.Contains(w, "stage thumbs") {
				return w
			}
		}
		return ""
	}
	st := meshtest.WaitStatus(t, bee.HTTPURL(), 30*time.Second, "bee's status saying that it may not consume stage thumbs",
		func(s appliance.Status) bool { return refused(s) != "" })
	if w := refused(st); !strings.Contains(w, "meshbox mesh node set-stages bee resize thumbs") {
		t.Errorf("bee's warning about stage thumbs: %q, want it to say how the admin grants it", w)
	}

	granted := time.Now()
	if code, out, errOut := cliEnv(t, m.admin, "mesh", "node", "set-stages", "bee", "resize", "thumbs"); code != 0 {
		t.Fatalf("set-stages bee resize thumbs: exit %d: %s%s", code, out, errOut)
	}
	nc := natsConn(t, ant)
	msg := &nats.Msg{Subject: "cmd.thumbs", Data: []byte("picture-1"), Header: nats.Header{hdrMsgID: {"e2e-grant-1"}}}
	if out, resp, err := ledger.SubmitMsg(nc, msg, 10*time.Second); out != ledger.Acked {
		t.Fatalf("send thumbs on ant: %v %v %v", out, resp, err)
	}
	select {
	case got := <-handled:
		if got != "picture-1" {
			t.Errorf("bee's handler got %q, want picture-1", got)
		}
		t.Logf("handled on bee %s after the grant", time.Since(granted).Round(time.Millisecond))
	case <-time.After(15 * time.Second):
		t.Fatalf("the command sent on ant after the grant was not handled on bee within 15s (status warnings %q)\n%s",
			meshtest.Status(t, bee.HTTPURL()).Warnings, bee.Output())
	}
	meshtest.WaitStatus(t, bee.HTTPURL(), 10*time.Second, "bee's status without the refusal of stage thumbs",
		func(s appliance.Status) bool { return refused(s) == "" })
}
