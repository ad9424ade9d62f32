package bridge_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
)

// olderMesh gives node's broker user the permissions an older mesh gave
// (no exchange of its own to configure or write, no binding keys of its
// own name on mesh) and declares, as that mesh's admin did, the node's
// exchange node.<node> bound to mesh with to.<node>.#.
func olderMesh(t *testing.T, vhost, adminURL, guestURL, user, node string) {
	t.Helper()
	hc := guestAdmin(t, adminURL)
	queues := `node\.` + node + `\.(requests|replies|events|system)|(cmd|retry|dead)\.(.+)`
	if _, err := hc.UpdatePermissionsIn(vhost, user, rabbithole.Permissions{
		Configure: `^(` + queues + `)$`, Write: `^(mesh|mesh\.dlx|` + queues + `)$`, Read: `^(mesh|node\.` + node + `|` + queues + `)$`}); err != nil {
		t.Fatal(err)
	}
	if _, err := hc.UpdateTopicPermissionsIn(vhost, user, rabbithole.TopicPermissions{Exchange: "mesh",
		Write: `^((cmd|evt|sys)\..+|to\.[A-Za-z0-9_-]+\.(req\..+|reply|sys\..+)|(retry|dead)\.(.+))$`,
		Read:  `^(evt\.#|sys\.#|(cmd|retry|dead)\.(.+))$`}); err != nil {
		t.Fatal(err)
	}
	olderExchange(t, guestURL, node)
}

// olderExchange declares node.<node> bound to mesh with to.<node>.#, as
// an older mesh's admin did.
func olderExchange(t *testing.T, guestURL, node string) {
	t.Helper()
	ch := meshtest.Channel(t, guestURL)
	if err := ch.ExchangeDeclare("node."+node, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeBind("node."+node, "to."+node+".#", bridge.MeshExchange, false, nil); err != nil {
		t.Fatal(err)
	}
}

// In a mesh upgraded node by node, a node whose broker user still has an
// older mesh's permissions binds its queues through that mesh's exchange
// node.<n> (and says so once in the log), a node with the current ones
// binds its queues to mesh and deletes its older exchange, and the two
// call each other both ways.
func TestOwnQueuesBoundToMesh(t *testing.T) {
	admin, urlOf := perNodeMesh(t)
	credOld, credNew := generation(t, admin, "alpha", 1), generation(t, admin, "gamma", 1)
	guest := strings.Replace(urlOf(credOld), credOld.User+":"+credOld.Password.Reveal(), "guest:guest", 1)
	adminURL := sharedRabbit(t).AdminURL()
	olderMesh(t, admin.Vhost(), adminURL, guest, credOld.User, "alpha")
	olderExchange(t, guest, "gamma") // left by the older mesh; gamma's user has the current permissions

	counters := map[string]*lineCounter{}
	edit := func(name, peer string) func(*bridge.Config) {
		return func(c *bridge.Config) {
			c.Routes = map[string]string{"echo-" + peer: peer}
			lc := &lineCounter{match: "older mesh's", next: c.Logger.Handler()}
			counters[name] = lc
			c.Logger = slog.New(lc)
		}
	}
	alpha := newNode(t, "alpha", urlOf(credOld), edit("alpha", "gamma"))
	gamma := newNode(t, "gamma", urlOf(credNew), edit("gamma", "alpha"))
	alpha.waitConnected(t)
	gamma.waitConnected(t)
	callEachOther(t, alpha, gamma)

	// gamma may not delete its older exchange (its permissions give it no
	// exchange at all); the admin does once it runs on them (rotate).
	ch := meshtest.Channel(t, guest)
	if err := ch.ExchangeDeclarePassive("node.gamma", "topic", true, false, false, false, nil); err != nil {
		t.Fatalf("passive declare of node.gamma: %v, want it left in place by gamma", err)
	}
	if err := admin.DropNodeExchange(context.Background(), "gamma"); err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclarePassive("node.gamma", "topic", true, false, false, false, nil); err == nil {
		t.Error("the admin left gamma's older exchange node.gamma in place")
	} else if ae, ok := err.(*amqp.Error); !ok || ae.Code != amqp.NotFound {
		t.Fatalf("passive declare of node.gamma: %v, want 404", err)
	}
	hc, err := rabbithole.NewClient(strings.Replace(adminURL, "guest:guest@", "", 1), "guest", "guest")
	if err != nil {
		t.Fatal(err)
	}
	hc.SetTransport(&http.Transport{DisableKeepAlives: true})
	sources := func(q string) map[string]string {
		bs, err := hc.ListQueueBindings(admin.Vhost(), q)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, b := range bs {
			if b.Source != "" {
				got[b.RoutingKey] = b.Source
			}
		}
		return got
	}
	if got := sources("node.alpha.requests"); got["to.alpha.req.#"] != "node.alpha" {
		t.Errorf("alpha's request queue bindings: %v, want to.alpha.req.# from node.alpha (its permissions are an older mesh's)", got)
	}
	gammaReq, gammaRep, _ := bridge.OwnQueues(gamma.b)
	if got := sources(gammaReq); got["to.gamma.req.#"] != bridge.MeshExchange {
		t.Errorf("gamma's request queue bindings: %v, want to.gamma.req.# from mesh", got)
	}
	if got := sources(gammaRep); got["to.gamma.reply"] != bridge.MeshExchange {
		t.Errorf("gamma's reply queue bindings: %v, want to.gamma.reply from mesh", got)
	}
	if n := counters["alpha"].count.Load(); n != 1 {
		t.Errorf("alpha logged %d lines about its older permissions, want 1", n)
	}
	if n := counters["gamma"].count.Load(); n != 0 {
		t.Errorf("gamma logged %d lines about older permissions, want 0", n)
	}
	if w := alpha.b.Status().Warnings; len(w) != 1 || w[0] != bridge.WarnOlderPermissions {
		t.Errorf("alpha's status warnings: %q, want the older permissions", w)
	}
	if w := gamma.b.Status().Warnings; len(w) != 0 {
		t.Errorf("gamma's status warnings: %q, want none", w)
	}
}

// A queue named like a node's claim queue, shared (not exclusive), which
// anyone holding the node's credential could declare, does not keep the
// node out: the node deletes it and takes its claim. A second process
// with the same credential is still refused.
func TestClaimSquatCleared(t *testing.T) {
	admin, urlOf := perNodeMesh(t)
	cred := generation(t, admin, "alpha", 1)
	squat := meshtest.Channel(t, urlOf(cred))
	if _, err := squat.QueueDeclare("node.alpha.claim", true, false, false, false, nil); err != nil {
		t.Fatalf("declare a shared claim queue with alpha's credential: %v", err)
	}
	alpha := newNode(t, "alpha", urlOf(cred), nil)
	alpha.waitConnected(t)
	twin := buildNode(t, "alpha", urlOf(cred), nil)
	if err := twin.b.Start(t.Context()); !errors.Is(err, bridge.ErrNodeNameInUse) {
		t.Errorf("a second process with alpha's credential: %v, want ErrNodeNameInUse", err)
	}
}

// previousMesh gives user the permissions the previous meshbox gave a
// node (configure on its queues by name and on node.<n>), as a mesh has
// them until rotate --all.
func previousMesh(t *testing.T, vhost, adminURL, user, node string) {
	t.Helper()
	hc := guestAdmin(t, adminURL)
	queues := `node\.` + node + `\.(requests|replies|events|system)|(cmd|retry|dead)\.(.+)`
	if _, err := hc.UpdatePermissionsIn(vhost, user, rabbithole.Permissions{
		Configure: `^(node\.` + node + `|` + queues + `)$`, Write: `^(mesh|mesh\.dlx|node\.` + node + `|` + queues + `)$`,
		Read: `^(mesh|node\.` + node + `|` + queues + `)$`}); err != nil {
		t.Fatal(err)
	}
}

// During an upgrade, before rotate --all: a node of this version whose
// broker user still has the previous version's permissions names its own
// queues after itself (the named request queue its claim), a node on the
// current permissions uses server-named ones, and the two call each other
// both ways; a second process with the first's credential is refused.
func TestPreviousPermissionsDuringUpgrade(t *testing.T) {
	admin, urlOf := perNodeMesh(t)
	prev, cur := generation(t, admin, "alpha", 1), generation(t, admin, "gamma", 1)
	previousMesh(t, admin.Vhost(), sharedRabbit(t).AdminURL(), prev.User, "alpha")
	alpha := newNode(t, "alpha", urlOf(prev), func(c *bridge.Config) { c.Routes = map[string]string{"echo-gamma": "gamma"} })
	gamma := newNode(t, "gamma", urlOf(cur), func(c *bridge.Config) { c.Routes = map[string]string{"echo-alpha": "alpha"} })
	alpha.waitConnected(t)
	gamma.waitConnected(t)
	if req, rep, sys := bridge.OwnQueues(alpha.b); req != "node.alpha.requests" || rep != "node.alpha.replies" || sys != "node.alpha.system" {
		t.Errorf("alpha's queues on the previous permissions: %s %s %s, want named after it", req, rep, sys)
	}
	if req, _, _ := bridge.OwnQueues(gamma.b); !strings.HasPrefix(req, "amq.gen-") {
		t.Errorf("gamma's request queue on the current permissions: %s, want server-named", req)
	}
	callEachOther(t, alpha, gamma)
	twin := buildNode(t, "alpha", urlOf(prev), nil)
	if err := twin.b.Start(t.Context()); !errors.Is(err, bridge.ErrNodeNameInUse) {
		t.Errorf("a second process with alpha's credential: %v, want ErrNodeNameInUse", err)
	}
}

// callEachOther has each of a and b host echo-<its name> and call the
// other's (routed by the nodes' Routes), both ways.
func callEachOther(t *testing.T, a, b *node) {
	t.Helper()
	for _, n := range []*node{a, b} {
		sub, err := n.client.Subscribe("cap.echo-"+n.name, func(m *nats.Msg) { _ = m.Respond(append([]byte(n.name+":"), m.Data...)) })
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
		if err := n.client.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	waitStandIn(t, a, "echo-"+b.name)
	waitStandIn(t, b, "echo-"+a.name)
	for _, c := range []struct {
		from *node
		to   string
	}{{a, b.name}, {b, a.name}} {
		m, err := c.from.request(t, "cap.echo-"+c.to, []byte("hi"), nil, 5*time.Second)
		if err != nil {
			t.Fatalf("%s calls %s: %v", c.from.name, c.to, err)
		}
		if code, text := natstest.ServiceError(m); code != 0 || string(m.Data) != c.to+":hi" {
			t.Fatalf("%s calls %s: got %q (error %d %q)", c.from.name, c.to, m.Data, code, text)
		}
	}
}

// guestAdmin is a management API client as the test broker's guest.
func guestAdmin(t *testing.T, adminURL string) *rabbithole.Client {
	t.Helper()
	hc, err := rabbithole.NewClient(strings.Replace(adminURL, "guest:guest@", "", 1), "guest", "guest")
	if err != nil {
		t.Fatal(err)
	}
	hc.SetTransport(&http.Transport{DisableKeepAlives: true})
	return hc
}
