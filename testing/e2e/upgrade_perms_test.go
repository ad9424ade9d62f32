package e2e

import (
	"net/url"
	"strings"
	"testing"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
)

// TestRotateAllAppliesCurrentPermissions upgrades a mesh in place: its
// node users have the previous meshbox's broker permissions (configure on
// their queues by name), under which the nodes of this version name their
// queues after themselves and call each other; `meshbox mesh node rotate
// --all` gives every node a generation with the current permissions, and
// the nodes move to server-named queues, still calling each other.
func TestRotateAllAppliesCurrentPermissions(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	names := []string{"ant", "bee"}
	m := newIdentityMesh(t, names...)
	u, err := url.Parse(m.vhost)
	if err != nil {
		t.Fatal(err)
	}
	vhost, _ := url.PathUnescape(strings.TrimPrefix(u.Path, "/"))
	rh, err := rabbithole.NewClient(m.rmq.ManagementURL(), "guest", "guest")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		queues := `node\.` + n + `\.(requests|replies|events|system)|(cmd|retry|dead)\.(.+)`
		if _, err := rh.UpdatePermissionsIn(vhost, "node."+n+".g1", rabbithole.Permissions{
			Configure: `^(node\.` + n + `|` + queues + `)$`, Write: `^(mesh|mesh\.dlx|node\.` + n + `|` + queues + `)$`,
			Read: `^(mesh|node\.` + n + `|` + queues + `)$`}); err != nil {
			t.Fatal(err)
		}
	}
	procs := map[string]*meshtest.Process{}
	for _, n := range names {
		procs[n] = m.start(t, n)
		nc := natsConn(t, procs[n])
		if _, err := nc.Subscribe("cap.echo", func(msg *nats.Msg) { _ = msg.Respond(msg.Data) }); err != nil {
			t.Fatal(err)
		}
		flush(t, nc)
	}
	queueNamed := func(q string) bool {
		_, err := rh.GetQueue(vhost, q)
		return err == nil
	}
	calls := func(when string) {
		t.Helper()
		for i, n := range names {
			target := names[(i+1)%len(names)]
			nc := natsConn(t, procs[n])
			waitCallable(t, nc, "node."+target+".cap.echo", nil, func(msg *nats.Msg) bool { c, _ := natstest.ServiceError(msg); return c == 0 })
			resp, err := nc.Request("node."+target+".cap.echo", []byte(when), 5*time.Second)
			if code, text := natstest.ServiceError(resp); err != nil || code != 0 || string(resp.Data) != when {
				t.Fatalf("%s: %s calls %s: %v %d %s", when, n, target, err, code, text)
			}
		}
	}
	for _, n := range names {
		if !meshtest.Poll(10*time.Second, func() bool { return queueNamed("node." + n + ".requests") }) {
			t.Errorf("before the rotation: %s has no queue node.%s.requests (its previous permissions name it)", n, n)
		}
	}
	calls("before")

	if code, out, errOut := m.rotate(t, "--all", "--wait", "60s"); code != 0 {
		t.Fatalf("rotate --all: exit %d: %s%s", code, out, errOut)
	}
	for _, n := range names {
		perms, err := rh.GetPermissionsIn(vhost, "node."+n+".g2")
		if err != nil || !strings.HasPrefix(perms.Configure, `^(amq\.gen-.*|node\.`+n+`\.claim|`) || strings.Contains(perms.Configure, `node\.`+n+`\.(requests`) {
			t.Errorf("%s's generation 2: permissions %+v, %v; want the current ones", n, perms, err)
		}
		if !meshtest.Poll(20*time.Second, func() bool { return !queueNamed("node." + n + ".requests") }) {
			t.Errorf("after the rotation: node.%s.requests still exists; want the node on server-named queues", n)
		}
	}
	calls("after")
}
