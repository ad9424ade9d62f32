package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/bridge/brokeradmin"
	"github.com/meshbox/meshbox/testing/ledger"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
)

// The broker's operator as the adversary: it makes or re-passwords node
// users and publishes as them, straight to queues or through mesh.

// operatorNodeUser has the broker's operator make broker user
// node.<node>.g<gen> with the permissions of node's own (no stage), as it
// can with any name, and returns its AMQP URL on vhostURL. The user is
// deleted when the test ends.
func operatorNodeUser(t *testing.T, rmq *meshtest.Rabbit, vhostURL, node string, gen int) (string, string) {
	t.Helper()
	ctx := context.Background()
	vhost, err := brokeradmin.VhostOf(vhostURL)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := brokeradmin.Connect(ctx, rmq.AdminURL(), vhost, brokeradmin.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cred, err := admin.CreateGeneration(ctx, node, gen, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.DeleteGeneration(context.Background(), node, gen) })
	u, err := url.Parse(vhostURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(cred.User, cred.Password.Reveal())
	return u.String(), cred.User
}

// errorsOf returns meshbox_errors_total{kind} of the node at p.
func errorsOf(t *testing.T, p *meshtest.Process, kind string) float64 {
	t.Helper()
	v, _ := scrape(t, p.HTTPURL()).value("meshbox_errors_total", "kind="+kind)
	return v
}

// unsealFailuresOf returns meshbox_unseal_failures_total{shape,reason} of
// the node at p.
func unsealFailuresOf(t *testing.T, p *meshtest.Process, shape, reason string) float64 {
	t.Helper()
	v, _ := scrape(t, p.HTTPURL()).value("meshbox_unseal_failures_total", "shape="+shape, "reason="+reason)
	return v
}

// logLines counts the lines of out that hold every one of parts.
func logLines(out string, parts ...string) int {
	n := 0
	for len(out) > 0 {
		line := out
		if i := indexOf(out, "\n"); i >= 0 {
			line, out = out[:i], out[i+1:]
		} else {
			out = ""
		}
		all := true
		for _, p := range parts {
			all = all && indexOf(line, p) >= 0
		}
		if all {
			n++
		}
	}
	return n
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// TestAdversaryOperatorForgesGeneration: the broker's operator makes a
// user node.alpha.g9, which RabbitMQ lets publish with that user_id, and
// speaks for alpha with it: a bye (every peer would mark alpha gone), a
// hello and a request. beta accepts alpha's messages only from the
// generations the mesh database lists for alpha: each forgery is counted
// as forged (not as an unseal failure), logged once per cause and sender,
// and has no effect; alpha's own messages go on. After `mesh node rotate
// alpha`, beta takes alpha's generation 2 and refuses a generation 1 the
// operator makes again.
func TestAdversaryOperatorForgesGeneration(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	ctx := context.Background()
	rmq := meshtest.LeaseRabbitMQ(t)
	vhost, db, alpha, beta := sealedMeshOn(t, rmq)
	host := natsConn(t, alpha)
	if _, err := host.Subscribe("cap.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		t.Fatal(err)
	}
	flush(t, host)
	// beta hosts probe: only the forged request could call it.
	probes := make(chan string, 16)
	bhost := natsConn(t, beta)
	if _, err := bhost.Subscribe("cap.probe", func(m *nats.Msg) { probes <- string(m.Data); _ = m.Respond(nil) }); err != nil {
		t.Fatal(err)
	}
	flush(t, bhost)
	waitRoute(t, beta.HTTPURL(), "echo", "alpha")
	caller := natsConn(t, beta)
	call := func(what string) {
		t.Helper()
		waitCallable(t, caller, "node.alpha.cap.echo", nil, func(m *nats.Msg) bool { c, _ := natstest.ServiceError(m); return c == 0 })
		resp, err := caller.Request("node.alpha.cap.echo", []byte(what), 5*time.Second)
		if code, text := natstest.ServiceError(resp); err != nil || code != 0 || string(resp.Data) != what {
			t.Fatalf("%s: beta calling echo on alpha: %v %d %q", what, err, code, text)
		}
	}
	call("before")
	if st := peer(meshtest.Status(t, beta.HTTPURL()), "alpha").State; st != "up" {
		t.Fatalf("beta's view of alpha before the attack: %q, want up", st)
	}

	fakeURL, fakeUser := operatorNodeUser(t, rmq, vhost, "alpha", 9)
	conn := meshtest.Dial(t, fakeURL)
	pub := func(key string, p amqp.Publishing) {
		t.Helper()
		p.UserId = fakeUser
		code, err := meshtest.BrokerVerdict(conn, func(ch *amqp.Channel) error {
			return ch.PublishWithContext(ctx, "mesh", key, false, false, p)
		})
		if err != nil || code != 0 {
			t.Fatalf("publish %s as %s: code %d, %v: want the broker to accept it", key, fakeUser, code, err)
		}
	}
	forged0, unseal0 := errorsOf(t, beta, "forged"), unsealFailuresOf(t, beta, "request", "not_sealed")
	bye, _ := json.Marshal(map[string]any{"v": 1, "type": "bye", "node": "alpha", "started_at": time.Now().Add(24 * time.Hour), "seq": 1 << 40})
	pub("sys.bye", amqp.Publishing{Type: "system", Body: bye})
	pub("sys.bye", amqp.Publishing{Type: "system", Body: bye})
	pub("to.beta.req.probe", amqp.Publishing{Type: "request", CorrelationId: rand.Text(), ReplyTo: "node.alpha.replies",
		Headers: amqp.Table{codec.HeaderOrigin: "alpha"}, Body: []byte("forged")})
	const forgeries = 3
	if !meshtest.Poll(10*time.Second, func() bool { return errorsOf(t, beta, "forged") >= forged0+forgeries }) {
		t.Errorf("beta's forged count: %v, want %v (two byes and a request as %s)", errorsOf(t, beta, "forged"), forged0+forgeries, fakeUser)
	}
	// Alpha's heartbeats go on: beta never marked it gone (real time:
	// room for a wrong gone, whose absence cannot be signalled).
	time.Sleep(2 * time.Second)
	if st := peer(meshtest.Status(t, beta.HTTPURL()), "alpha").State; st != "up" {
		t.Errorf("beta's view of alpha after byes as %s: %q, want up", fakeUser, st)
	}
	if got := errorsOf(t, beta, "forged"); got != forged0+forgeries {
		t.Errorf("beta's forged count: %v, want exactly %v", got, forged0+forgeries)
	}
	if got := unsealFailuresOf(t, beta, "request", "not_sealed"); got != unseal0 {
		t.Errorf("beta's unseal failures of requests: %v, want %v (the forged request is refused for its sender first)", got, unseal0)
	}
	if n := logLines(beta.Output(), "forged message refused", "cause=newer_generation", fakeUser); n != 1 {
		t.Errorf("beta logged the forgeries of %s %d times, want once:\n%s", fakeUser, n, beta.Output())
	}
	call("after")

	// A rotation: beta takes alpha's new generation, and refuses its
	// revoked one made again by the operator.
	m := &identityMesh{rmq: rmq, vhost: vhost, db: db, admin: []string{"MESHBOX_DB=" + db, "MESHBOX_BROKER_ADMIN=" + rmq.AdminURL()}}
	if code, out, errOut := m.rotate(t, "alpha", "--wait", "25s"); code != 0 {
		t.Fatalf("rotate alpha: exit %d: %s%s", code, out, errOut)
	}
	waitIdentity(t, alpha.HTTPURL(), "alpha on generation 2", func(s appliance.Status) bool {
		return s.Identity.Generation == 2 && s.Identity.Rotation == ""
	})
	call("rotated")
	// Beta refuses the revoked generation once its bindings say it is
	// revoked: as new as alpha's, which hold alpha's rotation ended.
	rev := meshtest.Status(t, alpha.HTTPURL()).Bindings.Revision
	meshtest.WaitStatus(t, beta.HTTPURL(), 30*time.Second, "beta's bindings as new as alpha's after its rotation", func(s appliance.Status) bool {
		return s.Bindings.Revision >= rev
	})
	oldURL, oldUser := operatorNodeUser(t, rmq, vhost, "alpha", 1)
	oc := meshtest.Dial(t, oldURL)
	forged1 := errorsOf(t, beta, "forged")
	if code, err := meshtest.BrokerVerdict(oc, func(ch *amqp.Channel) error {
		return ch.PublishWithContext(ctx, "mesh", "sys.bye", false, false, amqp.Publishing{Type: "system", UserId: oldUser, Body: bye})
	}); err != nil || code != 0 {
		t.Fatalf("publish a bye as %s: code %d, %v", oldUser, code, err)
	}
	if !meshtest.Poll(10*time.Second, func() bool { return errorsOf(t, beta, "forged") >= forged1+1 }) {
		t.Errorf("beta's forged count after a bye as the revoked %s: %v, want %v", oldUser, errorsOf(t, beta, "forged"), forged1+1)
	}
	time.Sleep(time.Second) // real time: room for a wrong gone, whose absence cannot be signalled
	if st := peer(meshtest.Status(t, beta.HTTPURL()), "alpha").State; st != "up" {
		t.Errorf("beta's view of alpha after a bye as the revoked %s: %q, want up", oldUser, st)
	}
	call("last")
	if got := errorsOf(t, beta, "forged"); got != forged1+1 {
		t.Errorf("beta's forged count at the end: %v, want exactly %v (none of alpha's own messages refused)", got, forged1+1)
	}
	select {
	case got := <-probes:
		t.Errorf("beta's probe was called with %q: the forged request reached it", got)
	default:
	}
}

// TestAdversaryCommandsCountedByCause: commands that reach a stage queue
// without a sender beta can trust are refused and counted under their real
// cause: published straight to the queue by the broker's admin without
// user_id (forged, even without any header), through mesh by a broker user
// node.alpha.g9 the operator made (forged), and with alpha's real user but
// a seal that does not open (an unseal failure, tampered). None reaches
// the handler, none counts as malformed, each cause is logged once; alpha's
// real commands are handled, each once.
func TestAdversaryCommandsCountedByCause(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	ctx := context.Background()
	rmq := meshtest.LeaseRabbitMQ(t)
	vhost, db, alpha, beta := sealedMeshOn(t, rmq)
	hnc := natsConn(t, beta)
	handled := make(chan string, 64)
	if _, err := hnc.Subscribe("work.vault", func(m *nats.Msg) { handled <- string(m.Data); _ = m.Respond(nil) }); err != nil {
		t.Fatal(err)
	}
	flush(t, hnc)
	waitConsumers(t, rmq, vhost, "cmd.vault", 1)
	submitter := natsConn(t, alpha)
	real := func(what string) {
		t.Helper()
		if o, resp, err := ledger.Submit(submitter, "cmd.vault", []byte(what), 5*time.Second); o != ledger.Acked {
			t.Fatalf("%s: alpha submitting to vault: %v %v %v", what, o, resp, err)
		}
		select {
		case got := <-handled:
			if got != what {
				t.Fatalf("beta's handler got %q, want %q", got, what)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("%s: alpha's command never reached beta's handler", what)
		}
	}
	real("before")
	forged0, malformed0 := errorsOf(t, beta, "forged"), errorsOf(t, beta, "malformed")
	tampered0 := unsealFailuresOf(t, beta, "command", "tampered")

	// 1. The broker's admin, straight to the stage queue, no user_id: one
	// bare, one claiming alpha in the header.
	ach := meshtest.Channel(t, vhost) // the broker admin's own credential
	for i, h := range []amqp.Table{nil, {codec.HeaderOrigin: "alpha"}} {
		if err := ach.PublishWithContext(ctx, "", "cmd.vault", false, false, amqp.Publishing{Type: "command",
			MessageId: fmt.Sprintf("admin-%d", i), DeliveryMode: amqp.Persistent, Headers: h, Body: []byte("admin")}); err != nil {
			t.Fatal(err)
		}
	}
	// 2. A broker user of alpha's name the operator made, through mesh.
	fakeURL, fakeUser := operatorNodeUser(t, rmq, vhost, "alpha", 9)
	fc := meshtest.Dial(t, fakeURL)
	if code, err := meshtest.BrokerVerdict(fc, func(ch *amqp.Channel) error {
		return ch.PublishWithContext(ctx, "mesh", "cmd.vault", false, false, amqp.Publishing{Type: "command", UserId: fakeUser,
			MessageId: "fake-generation", DeliveryMode: amqp.Persistent, Headers: amqp.Table{codec.HeaderOrigin: "alpha"}, Body: []byte("fake")})
	}); err != nil || code != 0 {
		t.Fatalf("publish a command as %s: code %d, %v", fakeUser, code, err)
	}
	// 3. alpha's real user, a seal that does not open.
	rch := meshtest.Channel(t, brokerURLOf(t, ctx, db, vhost, "alpha"))
	junk := []byte(rand.Text() + rand.Text())
	if err := rch.PublishWithContext(ctx, "mesh", "cmd.vault", false, false, amqp.Publishing{Type: "command",
		UserId: "node.alpha.g1", MessageId: "tampered-seal", DeliveryMode: amqp.Persistent,
		Headers: amqp.Table{codec.HeaderKey: currentKey(t, alpha)}, Body: junk}); err != nil {
		t.Fatal(err)
	}

	// The admin's two are forged at once; the fake generation's after the
	// give-backs of a generation newer than the bindings know.
	if !meshtest.Poll(30*time.Second, func() bool {
		return errorsOf(t, beta, "forged") >= forged0+3 && unsealFailuresOf(t, beta, "command", "tampered") >= tampered0+1
	}) {
		t.Errorf("beta: forged %v (want %v), unseal failures tampered %v (want %v)\n%s", errorsOf(t, beta, "forged"), forged0+3,
			unsealFailuresOf(t, beta, "command", "tampered"), tampered0+1, beta.Output())
	}
	real("after")
	if got := errorsOf(t, beta, "malformed"); got != malformed0 {
		t.Errorf("beta's malformed count: %v, want %v (each refusal under its real cause)", got, malformed0)
	}
	if got := errorsOf(t, beta, "forged"); got != forged0+3 {
		t.Errorf("beta's forged count: %v, want exactly %v", got, forged0+3)
	}
	if n := logLines(beta.Output(), "forged message refused", "cause=no_node_user"); n != 1 {
		t.Errorf("beta logged the admin's commands %d times, want once", n)
	}
	if n := logLines(beta.Output(), "forged message refused", "cause=newer_generation", fakeUser); n != 1 {
		t.Errorf("beta logged the command of %s %d times, want once", fakeUser, n)
	}
	select {
	case got := <-handled:
		t.Errorf("beta's handler got %q, want only alpha's real commands", got)
	default:
	}
}

// TestAdversaryOperatorSpeaksForNode: the broker's operator sets a new
// password on alpha's current broker user (node.alpha.g1, a generation the
// mesh database lists) and speaks discovery for running alpha with it: a
// hello with a capability list of its choosing, a heartbeat, a bye (every
// peer would mark alpha gone until it restarts), a bye with a made-up
// signature, and a verbatim copy of a heartbeat alpha really sent. alpha
// signs what it says and beta knows its signing key from the mesh
// database: each is refused and counted under its cause, logged once, and
// beta keeps alpha up and its calls working. mallory, a node with its own
// valid credential, cannot speak for alpha either (its bye and its copy of
// alpha's heartbeat name the wrong origin), and its gone about alpha is a
// claim beta checks with the broker. The control: alpha's own bye when it
// stops marks it gone at once.
func TestAdversaryOperatorSpeaksForNode(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	ctx := context.Background()
	rmq := meshtest.LeaseRabbitMQ(t)
	vhost, db, alpha, beta := sealedMeshOn(t, rmq)
	host := natsConn(t, alpha)
	if _, err := host.Subscribe("cap.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		t.Fatal(err)
	}
	flush(t, host)
	waitRoute(t, beta.HTTPURL(), "echo", "alpha")
	caller := natsConn(t, beta)
	call := func(what string) {
		t.Helper()
		waitCallable(t, caller, "cap.echo", nil, func(m *nats.Msg) bool { c, _ := natstest.ServiceError(m); return c == 0 })
		for _, subj := range []string{"cap.echo", "node.alpha.cap.echo"} {
			resp, err := caller.Request(subj, []byte(what), 5*time.Second)
			if code, text := natstest.ServiceError(resp); err != nil || code != 0 || string(resp.Data) != what {
				t.Fatalf("%s: beta calling %s: %v %d %q", what, subj, err, code, text)
			}
		}
	}
	call("before")
	if !meshtest.Poll(30*time.Second, func() bool { return peer(meshtest.Status(t, beta.HTTPURL()), "alpha").Signs }) {
		t.Errorf("beta's view of alpha: %+v, want signs (alpha's record has a signing key)", peer(meshtest.Status(t, beta.HTTPURL()), "alpha"))
	}
	started := peer(meshtest.Status(t, beta.HTTPURL()), "alpha").StartedAt

	// The operator taps every broadcast, to copy one of alpha's.
	tapped := meshtest.Tap(t, meshtest.Channel(t, vhost), "sys.#")
	alphaURL := brokerURLOf(t, ctx, db, vhost, "alpha")
	au, _ := url.Parse(alphaURL)
	alphaUser := au.User.Username()
	// Heartbeats are minutes apart; a change of alpha's bindings brings
	// its next one within seconds.
	if code, out, errOut := cliEnv(t, []string{"MESHBOX_DB=" + db}, "mesh", "override", "set", "alpha", "tapped", "size", "1"); code != 0 {
		t.Fatalf("override set: exit %d: %s%s", code, out, errOut)
	}
	var heartbeat []byte
	deadline := time.After(20 * time.Second)
	for heartbeat == nil {
		select {
		case d := <-tapped:
			if d.UserId == alphaUser && d.RoutingKey == "sys.heartbeat" {
				heartbeat = d.Body
			}
		case <-deadline:
			t.Fatal("the operator's tap saw no heartbeat of alpha")
		}
	}

	// The operator re-passwords alpha's user (alpha's connection stays up)
	// and publishes as alpha.
	password := rand.Text()
	rh, err := rabbithole.NewClient(rmq.ManagementURL(), "guest", "guest")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rh.PutUser(alphaUser, rabbithole.UserSettings{Password: password, Tags: rabbithole.UserTags{}}); err != nil {
		t.Fatalf("the operator sets a new password on %s: %v", alphaUser, err)
	}
	au.User = url.UserPassword(alphaUser, password)
	opConn := meshtest.Dial(t, au.String())
	publishAs := func(conn *amqp.Connection, user, key string, body []byte) {
		t.Helper()
		code, err := meshtest.BrokerVerdict(conn, func(ch *amqp.Channel) error {
			return ch.PublishWithContext(ctx, "mesh", key, false, false, amqp.Publishing{Type: "system", UserId: user, Body: body})
		})
		if err != nil || code != 0 {
			t.Fatalf("publish %s as %s: code %d, %v: want the broker to accept it", key, user, code, err)
		}
	}
	discovery := func(m map[string]any) []byte {
		m["node"], m["started_at"], m["proto"] = "alpha", started, 3
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	unsigned0, forged0, replayed0 := discoveryRejected(t, beta, "unsigned"), discoveryRejected(t, beta, "forged"), discoveryRejected(t, beta, "replayed")
	publishAs(opConn, alphaUser, "sys.hello", discovery(map[string]any{"v": 1, "type": "hello", "seq": 1 << 40, "capabilities": []string{"decoy"}, "heartbeat_ms": 5000}))
	publishAs(opConn, alphaUser, "sys.heartbeat", discovery(map[string]any{"v": 1, "type": "heartbeat", "seq": 1<<40 + 1, "hash": "00", "heartbeat_ms": 3600000}))
	publishAs(opConn, alphaUser, "sys.bye", discovery(map[string]any{"v": 1, "type": "bye", "seq": 1<<40 + 2}))
	sig := make([]byte, 64)
	_, _ = rand.Read(sig)
	publishAs(opConn, alphaUser, "sys.bye", discovery(map[string]any{"v": 1, "type": "bye", "seq": 1<<40 + 3, "sig": base64.RawURLEncoding.EncodeToString(sig)}))
	publishAs(opConn, alphaUser, "sys.heartbeat", heartbeat)
	if !meshtest.Poll(10*time.Second, func() bool {
		return discoveryRejected(t, beta, "unsigned") >= unsigned0+3 && discoveryRejected(t, beta, "forged") >= forged0+1 &&
			discoveryRejected(t, beta, "replayed") >= replayed0+1
	}) {
		t.Errorf("beta's refused discovery: unsigned %v (want %v), forged %v (want %v), replayed %v (want %v)",
			discoveryRejected(t, beta, "unsigned"), unsigned0+3, discoveryRejected(t, beta, "forged"), forged0+1,
			discoveryRejected(t, beta, "replayed"), replayed0+1)
	}
	time.Sleep(2 * time.Second) // real time: alpha's own heartbeats go on meanwhile, and a wrong gone would show
	if p := peer(meshtest.Status(t, beta.HTTPURL()), "alpha"); p.State != "up" || !slices.Contains(p.Capabilities, "echo") || slices.Contains(p.Capabilities, "decoy") {
		t.Errorf("beta's view of alpha after the operator spoke for it: %+v, want up, hosting echo and not decoy", p)
	}
	call("after the operator")
	for _, reason := range []string{"unsigned", "forged", "replayed"} {
		if n := logLines(beta.Output(), "discovery message refused", "sender=alpha", "reason="+reason); n != 1 {
			t.Errorf("beta logged the %s messages for alpha %d times, want once:\n%s", reason, n, beta.Output())
		}
	}

	// mallory, a node with its own real credential.
	env := []string{"MESHBOX_DB=" + db, "MESHBOX_BROKER_ADMIN=" + rmq.AdminURL()}
	if code, out, errOut := cliEnv(t, env, "mesh", "node", "add", "mallory"); code != 0 {
		t.Fatalf("mesh node add mallory: exit %d: %s%s", code, out, errOut)
	}
	t.Cleanup(func() { _, _, _ = cliEnv(t, env, "mesh", "node", "remove", "mallory", "--force") })
	// Its password, as mallory knows it: set here, so the test does not
	// depend on how the database keeps it.
	mu, _ := url.Parse(brokerURLOf(t, ctx, db, vhost, "mallory"))
	malloryUser, malloryPassword := mu.User.Username(), rand.Text()
	if _, err := rh.PutUser(malloryUser, rabbithole.UserSettings{Password: malloryPassword, Tags: rabbithole.UserTags{}}); err != nil {
		t.Fatal(err)
	}
	mu.User = url.UserPassword(malloryUser, malloryPassword)
	malloryURL := mu.String()
	if !meshtest.Poll(20*time.Second, func() bool { return peer(meshtest.Status(t, beta.HTTPURL()), "mallory").State != "" }) {
		t.Fatal("beta's bindings never listed mallory")
	}
	mConn := meshtest.Dial(t, malloryURL)
	origin0 := discoveryRejected(t, beta, "origin_mismatch")
	goneIn := func() float64 {
		v, _ := scrape(t, beta.HTTPURL()).value("meshbox_discovery_messages_total", "type=gone", "direction=in")
		return v
	}
	gone0 := goneIn()
	publishAs(mConn, malloryUser, "sys.bye", discovery(map[string]any{"v": 1, "type": "bye", "seq": 1<<40 + 4}))
	publishAs(mConn, malloryUser, "sys.heartbeat", heartbeat)
	gone, _ := json.Marshal(map[string]any{"v": 2, "type": "gone", "node": "mallory", "peer": "alpha", "started_at": time.Now(), "seq": 1, "proto": 3})
	publishAs(mConn, malloryUser, "sys.gone", gone)
	if !meshtest.Poll(10*time.Second, func() bool { return discoveryRejected(t, beta, "origin_mismatch") >= origin0+2 }) {
		t.Errorf("beta's discovery refused for origin mismatch: %v, want %v (mallory's bye and copy for alpha)", discoveryRejected(t, beta, "origin_mismatch"), origin0+2)
	}
	if !meshtest.Poll(10*time.Second, func() bool { return goneIn() >= gone0+1 }) {
		t.Errorf("beta never took mallory's gone (an unsigned message of a node without a signing key)")
	}
	time.Sleep(2 * time.Second) // real time: beta's probe of alpha comes back routed (nothing says so), and a wrong gone would show
	if p := peer(meshtest.Status(t, beta.HTTPURL()), "alpha"); p.State != "up" {
		t.Errorf("beta's view of alpha after mallory spoke for it: %+v, want up", p)
	}
	call("after mallory")

	// The control: alpha's own bye.
	alpha.Signal(syscall.SIGTERM)
	if code := alpha.Wait(); code != 0 {
		t.Fatalf("alpha exited with %d", code)
	}
	if !meshtest.Poll(5*time.Second, func() bool {
		p := peer(meshtest.Status(t, beta.HTTPURL()), "alpha")
		return p.State == "gone" && p.Reason == "left"
	}) {
		t.Errorf("beta's view of alpha after alpha stopped: %+v, want gone (left)", peer(meshtest.Status(t, beta.HTTPURL()), "alpha"))
	}
}

// discoveryRejected returns meshbox_discovery_rejected_total{reason} of
// the node at p.
func discoveryRejected(t *testing.T, p *meshtest.Process, reason string) float64 {
	t.Helper()
	v, _ := scrape(t, p.HTTPURL()).value("meshbox_discovery_rejected_total", "reason="+reason)
	return v
}
