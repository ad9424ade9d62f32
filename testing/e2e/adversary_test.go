package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/bridge/brokeradmin"
	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// TestAdversaryWithAnotherNodesCredential runs alpha and beta on broker
// users of their own and attacks alpha with beta's valid credential and a
// plain AMQP client. Every attack is refused by the broker or dropped and
// counted by the node, and the mesh's normal traffic goes on.
func TestAdversaryWithAnotherNodesCredential(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	ctx := context.Background()
	r := meshtest.RabbitMQ(t)
	vhostURL := r.Vhost(t)
	vhost, err := brokeradmin.VhostOf(vhostURL)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := brokeradmin.Connect(ctx, r.AdminURL(), vhost, brokeradmin.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.DeclareMesh(ctx); err != nil {
		t.Fatal(err)
	}
	nodeURL := func(node string) (string, brokeradmin.Credential) {
		cred, err := admin.CreateGeneration(ctx, node, 1, []string{bridge.AllStages})
		if err != nil {
			t.Fatal(err)
		}
		u, _ := url.Parse(vhostURL)
		u.User = url.UserPassword(cred.User, cred.Password.Reveal())
		return u.String(), cred
	}
	alphaURL, _ := nodeURL("alpha")
	betaURL, betaCred := nodeURL("beta")

	bc := bridgeConfig{}
	alpha := startMeshNode(t, "alpha", alphaURL, bc)
	beta := startMeshNode(t, "beta", betaURL, bc)

	// alpha hosts echo and the stage resize; its handler records the
	// attempt each command arrives with.
	host := natsConn(t, alpha)
	if _, err := host.Subscribe("cap.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		t.Fatal(err)
	}
	attempts := make(chan string, 64)
	if _, err := host.Subscribe("work.resize", func(m *nats.Msg) {
		attempts <- string(m.Data) + " attempt " + m.Header.Get(hdrAttempt) + " from " + m.Header.Get(hdrOrigin)
		_ = m.Respond(nil)
	}); err != nil {
		t.Fatal(err)
	}
	flush(t, host)
	waitRoute(t, beta.HTTPURL(), "echo", "alpha")
	caller := natsConn(t, beta)
	normal := func(what string) {
		t.Helper()
		waitCallable(t, caller, "cap.echo", nil, func(m *nats.Msg) bool { c, _ := serviceError(m); return c == 0 })
		resp, err := caller.Request("cap.echo", []byte(what), 5*time.Second)
		if code, text := serviceError(resp); err != nil || code != 0 || string(resp.Data) != what {
			t.Fatalf("%s: beta calling echo on alpha: %v %d %q", what, err, code, text)
		}
		if o, resp, err := submit(caller, "cmd.resize", []byte(what), 5*time.Second); o != acked {
			t.Fatalf("%s: beta submitting resize: %v %v %v", what, o, resp, err)
		}
		select {
		case got := <-attempts:
			if got != what+" attempt 1 from beta" {
				t.Fatalf("%s: alpha's handler got %q, want attempt 1 from beta", what, got)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the command never reached alpha's handler", what)
		}
	}
	normal("before")

	conn, err := amqp.Dial(betaURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// refused runs op on a fresh channel and returns the broker's error
	// code (0: allowed); a synchronous call after it catches an
	// asynchronous refusal (a publish).
	refused := func(op func(ch *amqp.Channel) error) int {
		t.Helper()
		code, err := meshtest.BrokerVerdict(conn, op)
		if err != nil {
			t.Fatal(err)
		}
		return code
	}
	pub := func(key string, p amqp.Publishing) func(ch *amqp.Channel) error {
		return func(ch *amqp.Channel) error {
			return ch.PublishWithContext(ctx, "mesh", key, false, false, p)
		}
	}

	// 1. Consume alpha's request and event queues.
	for _, q := range []string{"node.alpha.requests", "node.alpha.events", "node.alpha.system", "node.alpha.replies"} {
		if code := refused(func(ch *amqp.Channel) error { _, err := ch.Consume(q, "", true, false, false, false, nil); return err }); code != amqp.AccessRefused {
			t.Errorf("consume %s with beta's credential: code %d, want %d (access refused)", q, code, amqp.AccessRefused)
		}
	}

	// 2. Claim to be alpha in user_id: the broker refuses it.
	if code := refused(pub("to.alpha.req.echo", amqp.Publishing{Type: "request", UserId: "node.alpha.g1", CorrelationId: "c1", ReplyTo: "node.beta.replies"})); code != amqp.PreconditionFailed {
		t.Errorf("publish with alpha's user_id: code %d, want %d", code, amqp.PreconditionFailed)
	}
	alphaForged := func() float64 {
		v, _ := scrape(t, alpha.HTTPURL()).value("meshbox_errors_total", "kind=forged")
		return v
	}
	base := alphaForged()
	// 3. Without user_id, claiming an origin in the header: a request with
	// a reply-to of the attacker's choosing, a forged reply and an event.
	forgedOrigin := amqp.Table{bridge.HeaderOrigin: "gamma", bridge.HeaderCapability: "echo"}
	for _, m := range []struct {
		key string
		p   amqp.Publishing
	}{
		{"to.alpha.req.echo", amqp.Publishing{Type: "request", Headers: forgedOrigin, CorrelationId: "c2", ReplyTo: "node.gamma.replies", Body: []byte("x")}},
		{"to.alpha.reply", amqp.Publishing{Type: "reply", Headers: forgedOrigin, CorrelationId: "c3"}},
		{"evt.order", amqp.Publishing{Type: "event", Headers: forgedOrigin, MessageId: "m1"}},
	} {
		if code := refused(pub(m.key, m.p)); code != 0 {
			t.Fatalf("publish %s without user_id: code %d, want accepted by the broker", m.key, code)
		}
	}
	if !waitFor(10*time.Second, func() bool { return alphaForged() >= base+3 }) {
		t.Errorf("alpha's forged count: %v, want %v (request, reply, event without a node's user_id)", alphaForged(), base+3)
	}

	// 3b. With beta's own (valid) user_id, a request whose reply-to is of
	// the attacker's choosing (alpha's reply queue): alpha answers beta,
	// the request's validated origin, where the reply matches no request
	// and is counted late; alpha's own reply queue gets nothing.
	lateReplies := func(p *meshtest.Process) float64 {
		v, _ := scrape(t, p.HTTPURL()).value("meshbox_errors_total", "kind=late_reply")
		return v
	}
	alphaLate, betaLate := lateReplies(alpha), lateReplies(beta)
	if code := refused(pub("to.alpha.req.echo", amqp.Publishing{Type: "request", UserId: betaCred.User, CorrelationId: rand.Text(),
		ReplyTo: "node.alpha.replies", Body: []byte("reply-to")})); code != 0 {
		t.Fatalf("publish request as beta with alpha's reply-to: code %d", code)
	}
	if !waitFor(10*time.Second, func() bool { return lateReplies(beta) >= betaLate+1 }) {
		t.Errorf("beta's late replies: %v, want %v (alpha's answer to the request beta's credential sent)", lateReplies(beta), betaLate+1)
	}
	if got := lateReplies(alpha); got != alphaLate {
		t.Errorf("alpha's late replies: %v, want %v (alpha answered the reply-to of the attacker's choosing)", got, alphaLate)
	}

	// 3c. A flood of replies with guessed correlation ids, with beta's
	// valid user_id, while alpha's caller waits on a request to beta: the
	// caller gets beta's real answer, the flood is dropped as late.
	const flood = 100
	holder := natsConn(t, beta)
	held, release := make(chan struct{}, 1), make(chan struct{})
	releaseHold := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseHold) // before holder closes: its handler must return
	if _, err := holder.Subscribe("cap.hold", func(m *nats.Msg) {
		held <- struct{}{}
		<-release
		_ = m.Respond([]byte("real"))
	}); err != nil {
		t.Fatal(err)
	}
	flush(t, holder)
	waitRoute(t, alpha.HTTPURL(), "hold", "beta")
	victim := natsConn(t, alpha)
	answer := make(chan string, 1)
	go func() { // the waiting caller: exits when its request is answered or times out
		resp, err := victim.Request("cap.hold", []byte("x"), 20*time.Second)
		if code, text := serviceError(resp); err != nil || code != 0 {
			answer <- fmt.Sprintf("error %v %d %s", err, code, text)
			return
		}
		answer <- string(resp.Data)
	}()
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("alpha's request never reached beta's host of hold")
	}
	alphaLate = lateReplies(alpha)
	if code := refused(func(ch *amqp.Channel) error {
		for range flood {
			if err := ch.PublishWithContext(ctx, "mesh", "to.alpha.reply", false, false, amqp.Publishing{Type: "reply",
				UserId: betaCred.User, CorrelationId: rand.Text(), Body: []byte("forged")}); err != nil {
				return err
			}
		}
		return nil
	}); code != 0 {
		t.Fatalf("flood alpha's replies as beta: code %d", code)
	}
	if !waitFor(10*time.Second, func() bool { return lateReplies(alpha) >= alphaLate+flood }) {
		t.Errorf("alpha's late replies after the flood: %v, want %v", lateReplies(alpha), alphaLate+flood)
	}
	releaseHold()
	select {
	case got := <-answer:
		if got != "real" {
			t.Errorf("alpha's caller after the flood of guessed replies: got %q, want beta's real answer", got)
		}
	case <-time.After(25 * time.Second):
		t.Fatal("alpha's caller never got an answer")
	}

	// 3d. Even with the right correlation id, a reply counts only from the
	// node the request was sent to. gamma, a node with a credential of its
	// own, is played by a raw client that sees alpha's request; beta's
	// credential answers it first, then gamma does.
	gammaURL, gammaCred := nodeURL("gamma")
	gconn, err := amqp.Dial(gammaURL)
	if err != nil {
		t.Fatal(err)
	}
	defer gconn.Close()
	gch, err := gconn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gch.QueueDeclare("node.gamma.requests", false, true, true, false, nil); err != nil {
		t.Fatalf("gamma declares its request queue: %v", err)
	}
	if err := gch.QueueBind("node.gamma.requests", "to.gamma.req.#", "mesh", false, nil); err != nil {
		t.Fatalf("gamma binds its request queue: %v", err)
	}
	gammaReqs, err := gch.Consume("node.gamma.requests", "", true, true, false, false, nil)
	if err != nil {
		t.Fatalf("gamma consumes its requests: %v", err)
	}
	go func() { // the waiting caller: exits when its request is answered or times out
		resp, err := victim.Request("node.gamma.cap.echo", []byte("x"), 20*time.Second)
		if code, text := serviceError(resp); err != nil || code != 0 {
			answer <- fmt.Sprintf("error %v %d %s", err, code, text)
			return
		}
		answer <- string(resp.Data)
	}()
	var req amqp.Delivery
	select {
	case req = <-gammaReqs:
	case <-time.After(10 * time.Second):
		t.Fatal("alpha's request to gamma never reached gamma's queue")
	}
	base = alphaForged()
	if code := refused(pub("to.alpha.reply", amqp.Publishing{Type: "reply", UserId: betaCred.User, CorrelationId: req.CorrelationId,
		Body: []byte("forged")})); code != 0 {
		t.Fatalf("publish beta's reply to alpha's request to gamma: code %d", code)
	}
	if !waitFor(10*time.Second, func() bool { return alphaForged() >= base+1 }) {
		t.Errorf("alpha's forged count after beta answered a request to gamma: %v, want %v", alphaForged(), base+1)
	}
	select {
	case got := <-answer:
		t.Fatalf("alpha's caller was answered %q before gamma replied", got)
	default:
	}
	if err := gch.PublishWithContext(ctx, "mesh", "to.alpha.reply", false, false, amqp.Publishing{Type: "reply",
		UserId: gammaCred.User, CorrelationId: req.CorrelationId, Body: []byte("real")}); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-answer:
		if got != "real" {
			t.Errorf("alpha's caller of gamma: got %q, want gamma's real answer", got)
		}
	case <-time.After(25 * time.Second):
		t.Fatal("alpha's caller of gamma never got an answer")
	}

	// 4. A command that claims to be a retry (x-delivery-count 999): the
	// handler sees attempt 1, with beta's own (valid) user_id.
	if code := refused(pub("cmd.resize", amqp.Publishing{Type: "command", UserId: betaCred.User, MessageId: "forged-retry",
		DeliveryMode: amqp.Persistent, Headers: amqp.Table{"x-delivery-count": int64(999)}, Body: []byte("retry")})); code != 0 {
		t.Fatalf("publish command: code %d", code)
	}
	select {
	case got := <-attempts:
		if got != "retry attempt 1 from beta" {
			t.Errorf("forged retry: alpha's handler got %q, want attempt 1 from beta", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the forged retry never reached alpha's handler")
	}

	// 5. A bye for alpha, dated a day ahead: with beta's user_id the node
	// drops it (origin mismatch); without user_id, the bridge does.
	bye, _ := json.Marshal(map[string]any{"v": 1, "type": "bye", "node": "alpha", "started_at": time.Now().Add(24 * time.Hour), "seq": 1 << 40})
	rejected := func() float64 {
		v, _ := scrape(t, alpha.HTTPURL()).value("meshbox_discovery_rejected_total", "reason=origin_mismatch")
		return v
	}
	betaForged := func() float64 {
		v, _ := scrape(t, beta.HTTPURL()).value("meshbox_errors_total", "kind=forged")
		return v
	}
	rej0, forged0 := rejected(), betaForged()
	if code := refused(pub("sys.bye", amqp.Publishing{Type: "system", UserId: betaCred.User, Body: bye})); code != 0 {
		t.Fatalf("publish bye as beta: code %d", code)
	}
	if code := refused(pub("sys.bye", amqp.Publishing{Type: "system", Headers: amqp.Table{bridge.HeaderOrigin: "alpha"}, Body: bye})); code != 0 {
		t.Fatalf("publish bye without user_id: code %d", code)
	}
	// beta's bridge skips the first as its own echo; alpha's node rejects
	// it: a bye from beta that names alpha. beta's bridge drops the second.
	if !waitFor(10*time.Second, func() bool { return rejected() >= rej0+1 }) {
		t.Errorf("alpha's discovery rejections for origin mismatch: %v, want %v", rejected(), rej0+1)
	}
	if !waitFor(10*time.Second, func() bool { return betaForged() >= forged0+1 }) {
		t.Errorf("beta's forged count: %v, want %v (a bye without user_id)", betaForged(), forged0+1)
	}
	if st := getView(t, beta.HTTPURL()).peerState("alpha"); st != "up" {
		t.Errorf("beta's view of alpha after forged byes: %q, want up", st)
	}

	normal("after")

	// 6. Take alpha's name while alpha is offline: its queues cannot be
	// declared, bound or consumed with beta's credential.
	alpha.Signal(syscall.SIGTERM)
	if code := alpha.Wait(); code != 0 {
		t.Fatalf("alpha exited with %d", code)
	}
	for _, q := range []string{"node.alpha.requests", "node.alpha.replies", "node.alpha.system"} {
		if code := refused(func(ch *amqp.Channel) error { _, err := ch.QueueDeclare(q, false, true, false, false, nil); return err }); code != amqp.AccessRefused {
			t.Errorf("declare %s with beta's credential while alpha is offline: code %d, want %d", q, code, amqp.AccessRefused)
		}
	}
	for _, key := range []string{"to.alpha.req.#", "to.alpha.reply", "to.alpha.#"} {
		if code := refused(func(ch *amqp.Channel) error {
			return ch.QueueBind("node.beta.requests", key, "mesh", false, nil)
		}); code != amqp.AccessRefused {
			t.Errorf("bind beta's queue to mesh with %s: code %d, want %d", key, code, amqp.AccessRefused)
		}
	}
	if code := refused(func(ch *amqp.Channel) error {
		return ch.QueueBind("node.beta.requests", "to.alpha.req.#", "node.alpha", false, nil)
	}); code != amqp.AccessRefused {
		t.Errorf("bind beta's queue to an exchange of alpha's name: code %d, want %d", code, amqp.AccessRefused)
	}
	if code := refused(func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare("node.alpha", "topic", true, false, false, false, nil)
	}); code != amqp.AccessRefused {
		t.Errorf("declare an exchange of alpha's name with beta's credential: code %d, want %d", code, amqp.AccessRefused)
	}
}

// TestAdversaryNodeAddedWithoutStages: a node made by `mesh node add`
// without --stages may consume no stage. With its own real credential and
// a plain AMQP client it cannot consume or bind a stage's command queue;
// the controls, added with --stages s and --stages *, can.
func TestAdversaryNodeAddedWithoutStages(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	ctx := context.Background()
	r := meshtest.RabbitMQ(t)
	vhostURL := r.Vhost(t)
	db := meshtest.Postgres(t).Database(t)
	admin := []string{"MESHBOX_DB=" + db, "MESHBOX_BROKER_ADMIN=" + r.AdminURL()}
	if code, _, errOut := cli(t, "init", "--db", db, "--node", "hub", "--broker", meshtest.NoCredential(vhostURL)); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	nodes := []struct {
		name  string
		args  []string
		says  string // in the output of node add
		stage bool   // may consume stage s
	}{
		{"bare", nil, "no stage", false},
		{"staged", []string{"--stages", "s"}, "stages s", true},
		{"every", []string{"--stages", "*"}, "every stage", true},
	}
	// Node roles and broker users outlive the test's database and vhost.
	t.Cleanup(func() {
		for _, n := range nodes {
			_, _, _ = cliEnv(t, admin, "mesh", "node", "remove", n.name, "--force")
		}
	})
	// The stage's queue exists (the admin made it); the nodes try to read it.
	guest, err := amqp.Dial(vhostURL)
	if err != nil {
		t.Fatal(err)
	}
	defer guest.Close()
	gch, err := guest.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gch.QueueDeclare("cmd.s", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}

	for _, n := range nodes {
		code, out, errOut := cliEnv(t, admin, append([]string{"mesh", "node", "add", n.name}, n.args...)...)
		if code != 0 {
			t.Fatalf("mesh node add %s: exit %d: %s%s", n.name, code, out, errOut)
		}
		if !strings.Contains(out, n.says) {
			t.Errorf("mesh node add %s %v: output does not say %q:\n%s", n.name, n.args, n.says, out)
		}
		user, pw := nodeCredential(t, ctx, db, n.name)
		conn, err := amqp.Dial(withCredential(t, vhostURL, user, pw))
		if err != nil {
			t.Fatalf("%s dials the broker with its own credential: %v", n.name, err)
		}
		want, what := amqp.AccessRefused, "access refused"
		if n.stage {
			want, what = 0, "allowed"
		}
		for _, op := range []struct {
			name string
			do   func(ch *amqp.Channel) error
		}{
			{"consume cmd.s", func(ch *amqp.Channel) error {
				_, err := ch.Consume("cmd.s", "", false, false, false, false, nil)
				return err
			}},
			{"bind cmd.s to mesh with cmd.s", func(ch *amqp.Channel) error { return ch.QueueBind("cmd.s", "cmd.s", "mesh", false, nil) }},
		} {
			code, err := meshtest.BrokerVerdict(conn, op.do)
			if err != nil {
				t.Fatal(err)
			}
			if code != want {
				t.Errorf("%s (added with %v): %s: code %d, want %d (%s)", n.name, n.args, op.name, code, want, what)
			}
		}
		_ = conn.Close()
	}
}

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
	ctx := context.Background()
	rmq := meshtest.RabbitMQ(t)
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
		waitCallable(t, caller, "node.alpha.cap.echo", nil, func(m *nats.Msg) bool { c, _ := serviceError(m); return c == 0 })
		resp, err := caller.Request("node.alpha.cap.echo", []byte(what), 5*time.Second)
		if code, text := serviceError(resp); err != nil || code != 0 || string(resp.Data) != what {
			t.Fatalf("%s: beta calling echo on alpha: %v %d %q", what, err, code, text)
		}
	}
	call("before")
	if st := getView(t, beta.HTTPURL()).peerState("alpha"); st != "up" {
		t.Fatalf("beta's view of alpha before the attack: %q, want up", st)
	}

	fakeURL, fakeUser := operatorNodeUser(t, rmq, vhost, "alpha", 9)
	conn, err := amqp.Dial(fakeURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
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
		Headers: amqp.Table{bridge.HeaderOrigin: "alpha"}, Body: []byte("forged")})
	const forgeries = 3
	if !waitFor(10*time.Second, func() bool { return errorsOf(t, beta, "forged") >= forged0+forgeries }) {
		t.Errorf("beta's forged count: %v, want %v (two byes and a request as %s)", errorsOf(t, beta, "forged"), forged0+forgeries, fakeUser)
	}
	// Alpha's heartbeats go on: beta never marked it gone.
	time.Sleep(2 * time.Second)
	if st := getView(t, beta.HTTPURL()).peerState("alpha"); st != "up" {
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
	waitIdentity(t, alpha.HTTPURL(), "alpha on generation 2", func(s identityStatus) bool {
		return s.Identity.Generation == 2 && s.Identity.Rotation == ""
	})
	call("rotated")
	oldURL, oldUser := operatorNodeUser(t, rmq, vhost, "alpha", 1)
	oc, err := amqp.Dial(oldURL)
	if err != nil {
		t.Fatal(err)
	}
	defer oc.Close()
	forged1 := errorsOf(t, beta, "forged")
	if code, err := meshtest.BrokerVerdict(oc, func(ch *amqp.Channel) error {
		return ch.PublishWithContext(ctx, "mesh", "sys.bye", false, false, amqp.Publishing{Type: "system", UserId: oldUser, Body: bye})
	}); err != nil || code != 0 {
		t.Fatalf("publish a bye as %s: code %d, %v", oldUser, code, err)
	}
	if !waitFor(10*time.Second, func() bool { return errorsOf(t, beta, "forged") >= forged1+1 }) {
		t.Errorf("beta's forged count after a bye as the revoked %s: %v, want %v", oldUser, errorsOf(t, beta, "forged"), forged1+1)
	}
	time.Sleep(time.Second)
	if st := getView(t, beta.HTTPURL()).peerState("alpha"); st != "up" {
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
	ctx := context.Background()
	rmq := meshtest.RabbitMQ(t)
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
		if o, resp, err := submit(submitter, "cmd.vault", []byte(what), 5*time.Second); o != acked {
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
	ac, err := amqp.Dial(vhost) // the broker admin's own credential
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	ach, err := ac.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range []amqp.Table{nil, {bridge.HeaderOrigin: "alpha"}} {
		if err := ach.PublishWithContext(ctx, "", "cmd.vault", false, false, amqp.Publishing{Type: "command",
			MessageId: fmt.Sprintf("admin-%d", i), DeliveryMode: amqp.Persistent, Headers: h, Body: []byte("admin")}); err != nil {
			t.Fatal(err)
		}
	}
	// 2. A broker user of alpha's name the operator made, through mesh.
	fakeURL, fakeUser := operatorNodeUser(t, rmq, vhost, "alpha", 9)
	fc, err := amqp.Dial(fakeURL)
	if err != nil {
		t.Fatal(err)
	}
	defer fc.Close()
	if code, err := meshtest.BrokerVerdict(fc, func(ch *amqp.Channel) error {
		return ch.PublishWithContext(ctx, "mesh", "cmd.vault", false, false, amqp.Publishing{Type: "command", UserId: fakeUser,
			MessageId: "fake-generation", DeliveryMode: amqp.Persistent, Headers: amqp.Table{bridge.HeaderOrigin: "alpha"}, Body: []byte("fake")})
	}); err != nil || code != 0 {
		t.Fatalf("publish a command as %s: code %d, %v", fakeUser, code, err)
	}
	// 3. alpha's real user, a seal that does not open.
	rc, err := amqp.Dial(brokerURLOf(t, ctx, db, vhost, "alpha"))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	rch, err := rc.Channel()
	if err != nil {
		t.Fatal(err)
	}
	junk := []byte(rand.Text() + rand.Text())
	if err := rch.PublishWithContext(ctx, "mesh", "cmd.vault", false, false, amqp.Publishing{Type: "command",
		UserId: "node.alpha.g1", MessageId: "tampered-seal", DeliveryMode: amqp.Persistent,
		Headers: amqp.Table{bridge.HeaderKey: currentKey(t, alpha)}, Body: junk}); err != nil {
		t.Fatal(err)
	}

	// The admin's two are forged at once; the fake generation's after the
	// give-backs of a generation newer than the bindings know.
	if !waitFor(30*time.Second, func() bool {
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
	ctx := context.Background()
	rmq := meshtest.RabbitMQ(t)
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
		waitCallable(t, caller, "cap.echo", nil, func(m *nats.Msg) bool { c, _ := serviceError(m); return c == 0 })
		for _, subj := range []string{"cap.echo", "node.alpha.cap.echo"} {
			resp, err := caller.Request(subj, []byte(what), 5*time.Second)
			if code, text := serviceError(resp); err != nil || code != 0 || string(resp.Data) != what {
				t.Fatalf("%s: beta calling %s: %v %d %q", what, subj, err, code, text)
			}
		}
	}
	call("before")
	if !waitFor(30*time.Second, func() bool { return signedPeerOf(t, beta, "alpha").Signs }) {
		t.Errorf("beta's view of alpha: %+v, want signs (alpha's record has a signing key)", signedPeerOf(t, beta, "alpha"))
	}
	started := signedPeerOf(t, beta, "alpha").StartedAt

	// The operator taps every broadcast, to copy one of alpha's.
	tapConn, err := amqp.Dial(vhost)
	if err != nil {
		t.Fatal(err)
	}
	defer tapConn.Close()
	tap, err := tapConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := tap.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := tap.QueueBind(q.Name, "sys.#", "mesh", false, nil); err != nil {
		t.Fatal(err)
	}
	tapped, err := tap.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	alphaURL := brokerURLOf(t, ctx, db, vhost, "alpha")
	au, _ := url.Parse(alphaURL)
	alphaUser := au.User.Username()
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
	opConn, err := amqp.Dial(au.String())
	if err != nil {
		t.Fatalf("the operator dials as %s: %v", alphaUser, err)
	}
	defer opConn.Close()
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
	if !waitFor(10*time.Second, func() bool {
		return discoveryRejected(t, beta, "unsigned") >= unsigned0+3 && discoveryRejected(t, beta, "forged") >= forged0+1 &&
			discoveryRejected(t, beta, "replayed") >= replayed0+1
	}) {
		t.Errorf("beta's refused discovery: unsigned %v (want %v), forged %v (want %v), replayed %v (want %v)",
			discoveryRejected(t, beta, "unsigned"), unsigned0+3, discoveryRejected(t, beta, "forged"), forged0+1,
			discoveryRejected(t, beta, "replayed"), replayed0+1)
	}
	time.Sleep(2 * time.Second) // alpha's own heartbeats go on meanwhile
	if p := signedPeerOf(t, beta, "alpha"); p.State != "up" || !slices.Contains(p.Capabilities, "echo") || slices.Contains(p.Capabilities, "decoy") {
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
	if !waitFor(20*time.Second, func() bool { return getView(t, beta.HTTPURL()).peerState("mallory") != "" }) {
		t.Fatal("beta's bindings never listed mallory")
	}
	mConn, err := amqp.Dial(malloryURL)
	if err != nil {
		t.Fatal(err)
	}
	defer mConn.Close()
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
	if !waitFor(10*time.Second, func() bool { return discoveryRejected(t, beta, "origin_mismatch") >= origin0+2 }) {
		t.Errorf("beta's discovery refused for origin mismatch: %v, want %v (mallory's bye and copy for alpha)", discoveryRejected(t, beta, "origin_mismatch"), origin0+2)
	}
	if !waitFor(10*time.Second, func() bool { return goneIn() >= gone0+1 }) {
		t.Errorf("beta never took mallory's gone (an unsigned message of a node without a signing key)")
	}
	time.Sleep(2 * time.Second) // beta's probe of alpha comes back routed
	if p := signedPeerOf(t, beta, "alpha"); p.State != "up" {
		t.Errorf("beta's view of alpha after mallory spoke for it: %+v, want up", p)
	}
	call("after mallory")

	// The control: alpha's own bye.
	alpha.Signal(syscall.SIGTERM)
	if code := alpha.Wait(); code != 0 {
		t.Fatalf("alpha exited with %d", code)
	}
	if !waitFor(5*time.Second, func() bool { p := signedPeerOf(t, beta, "alpha"); return p.State == "gone" && p.Reason == "left" }) {
		t.Errorf("beta's view of alpha after alpha stopped: %+v, want gone (left)", signedPeerOf(t, beta, "alpha"))
	}
}

// signedPeer is a peer in a node's status, with what signed discovery
// shows of it.
type signedPeer struct {
	Name         string    `json:"name"`
	State        string    `json:"state"`
	Reason       string    `json:"reason"`
	StartedAt    time.Time `json:"started_at"`
	Capabilities []string  `json:"capabilities"`
	Signs        bool      `json:"signs"`
}

// signedPeerOf returns peer name in p's status (zero when it has none).
func signedPeerOf(t *testing.T, p *meshtest.Process, name string) signedPeer {
	t.Helper()
	var st struct {
		Peers []signedPeer `json:"peers"`
	}
	getJSON(t, p.HTTPURL()+"/status", "", &st)
	for _, sp := range st.Peers {
		if sp.Name == name {
			return sp
		}
	}
	return signedPeer{}
}

// discoveryRejected returns meshbox_discovery_rejected_total{reason} of
// the node at p.
func discoveryRejected(t *testing.T, p *meshtest.Process, reason string) float64 {
	t.Helper()
	v, _ := scrape(t, p.HTTPURL()).value("meshbox_discovery_rejected_total", "reason="+reason)
	return v
}

// TestAdversaryDatabaseDumpHoldsNoNodePassword is the database's admin
// reading everything the mesh keeps of its nodes' credentials
// (node_credentials, join_tokens) after alpha and beta joined, and again
// after a rotation. Every value found is tried as each node's broker
// password (every broker user of the rows) on the real RabbitMQ and as
// each node role's password on the real PostgreSQL: all are refused. The
// control: each node's own password, as the node opens it, is accepted;
// the nodes call each other after the join, after the rotation, and after
// a restart from their caches with the database stopped.
func TestAdversaryDatabaseDumpHoldsNoNodePassword(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	ctx := context.Background()
	rmq := meshtest.RabbitMQ(t)
	pg := meshtest.NewPostgres(t) // private: this test stops it
	m := &identityMesh{rmq: rmq, vhost: rmq.Vhost(t), db: pg.Database(t), envs: map[string]string{}, data: map[string]string{}}
	m.admin = []string{"MESHBOX_DB=" + m.db, "MESHBOX_BROKER_ADMIN=" + rmq.AdminURL()}
	if code, _, errOut := cli(t, "init", "--db", m.db, "--node", "hub", "--broker", meshtest.NoCredential(m.vhost)); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	nodes := []string{"alpha", "beta"}
	t.Cleanup(func() { // broker users outlive the test's vhost
		for _, n := range nodes {
			_, _, _ = cliEnv(t, m.admin, "mesh", "node", "remove", n, "--force")
		}
	})
	for _, n := range nodes {
		code, out, errOut := cliEnv(t, m.admin, "mesh", "node", "add", n, "--stages", "*")
		if code != 0 {
			t.Fatalf("mesh node add %s: exit %d: %s%s", n, code, out, errOut)
		}
		m.envs[n] = filepath.Join(t.TempDir(), n+".env")
		m.data[n] = filepath.Join(t.TempDir(), "data")
		rememberDataDir(m.db, n, m.data[n])
		if code, out, errOut := cli(t, "join", joinToken(t, out), "--env-file", m.envs[n]); code != 0 {
			t.Fatalf("join %s: exit %d: %s%s", n, code, out, errOut)
		}
	}
	procs := map[string]*meshtest.Process{}
	start := func() {
		t.Helper()
		for _, n := range nodes {
			procs[n] = m.start(t, n)
		}
		host := natsConn(t, procs["alpha"])
		if _, err := host.Subscribe("cap.echo", func(msg *nats.Msg) { _ = msg.Respond(msg.Data) }); err != nil {
			t.Fatal(err)
		}
		flush(t, host)
	}
	call := func(when string) {
		t.Helper()
		caller := natsConn(t, procs["beta"])
		waitCallable(t, caller, "node.alpha.cap.echo", nil, func(msg *nats.Msg) bool { c, _ := serviceError(msg); return c == 0 })
		resp, err := caller.Request("node.alpha.cap.echo", []byte(when), 5*time.Second)
		if err != nil {
			t.Fatalf("%s: beta calling echo on alpha: %v", when, err)
		}
		if code, text := serviceError(resp); code != 0 || string(resp.Data) != when {
			t.Fatalf("%s: beta calling echo on alpha: %d %q %q", when, code, text, resp.Data)
		}
	}

	refusedAll := func(when string) {
		t.Helper()
		values, roles, users := dumpCredentials(t, ctx, m.db)
		if len(users) < len(nodes) || len(roles) < len(nodes) {
			t.Fatalf("%s: the dump names broker users %v and roles %v: it proves nothing", when, users, roles)
		}
		// Every login is tried at once, 16 at a time: a refused login
		// costs the broker and the database a round of their own.
		var wg sync.WaitGroup
		sem := make(chan struct{}, 16)
		try := func(what, name, v string, accepts func() bool) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				if accepts() {
					t.Errorf("%s: the %s accepts a value of the dump as %s's password", when, what, name)
				}
			}()
		}
		for _, user := range users {
			for _, v := range values {
				try("broker", user, v, func() bool { return brokerAccepts(m.vhost, user, v) })
			}
		}
		for _, role := range roles {
			for _, v := range values {
				try("database", role, v, func() bool { return databaseAccepts(ctx, m.db, role, v) })
			}
		}
		wg.Wait()
		t.Logf("%s: %d values of the dump tried on %d broker users and %d roles: all refused", when, len(values), len(users), len(roles))
		// The control: what each node opens is accepted.
		for _, n := range nodes {
			if user, pw := nodeCredential(t, ctx, m.db, n); !brokerAccepts(m.vhost, user, pw) {
				t.Fatalf("%s: the broker refuses %s's own credential, as the node opens it", when, n)
			}
		}
	}

	start()
	call("joined")
	refusedAll("after the join")

	code, out, errOut := m.rotate(t, "--all", "--wait", "30s")
	if code != 0 {
		t.Fatalf("rotate --all: exit %d: %s%s", code, out, errOut)
	}
	for _, n := range nodes {
		waitIdentity(t, procs[n].HTTPURL(), n+" on generation 2, nothing older", func(s identityStatus) bool {
			return s.Identity.Generation == 2 && s.Identity.State == "in use" && s.Identity.Rotation == ""
		})
	}
	call("rotated")
	refusedAll("after the rotation")

	// From the caches alone: the database stopped, both nodes restarted.
	for _, n := range nodes {
		procs[n].Signal(syscall.SIGTERM)
		if code := procs[n].Wait(); code != 0 {
			t.Fatalf("%s stopped with exit %d", n, code)
		}
	}
	pg.Stop(t)
	start()
	for _, n := range nodes {
		waitStatus(t, procs[n].HTTPURL(), 15*time.Second, n+" on its cached bindings", func(s nodeStatus) bool {
			return s.Bindings.Source == "cache"
		})
		waitIdentity(t, procs[n].HTTPURL(), n+" on generation 2 from its cache", func(s identityStatus) bool {
			return s.Identity.Generation == 2 && s.Identity.State == "in use"
		})
	}
	call("restarted from the cache")
	pg.Start(t) // for the cleanup's node remove
}

// TestAdversaryPeerSealsBogusKey: peer, a node of the mesh that holds the
// mesh's key, writes with its own database role (raw pgx) the first copy
// of the key for fresh, a new node none has sealed it for yet: bytes of
// its own choosing, sealed to fresh's real public key. fresh refuses it
// (the bytes do not match the key's commitment), counts and logs it, and
// removes it; once alpha, an honest holder, is back it seals the real key
// for fresh, and calls cross the mesh both ways (the control). A fresh
// that took the bogus key would seal what alpha cannot open.
func TestAdversaryPeerSealsBogusKey(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	ctx := context.Background()
	m := newIdentityMesh(t, "alpha", "peer", "fresh")
	alpha, peer := m.start(t, "alpha"), m.start(t, "peer")
	for _, p := range []*meshtest.Process{alpha, peer} {
		waitSealing(t, p)
		waitKeysInStep(t, p)
	}
	kid := currentKey(t, alpha)
	if kid == "" || currentKey(t, peer) != kid {
		t.Fatalf("alpha seals with %q, peer with %q: want one key", kid, currentKey(t, peer))
	}
	// Both holders stop, so that no honest one seals the key for fresh
	// before the attacker does; peer's database role stays.
	for _, p := range []*meshtest.Process{alpha, peer} {
		p.Signal(syscall.SIGTERM)
		if code := p.Wait(); code != 0 {
			t.Fatalf("a holder stopped with exit %d", code)
		}
	}
	fresh := m.start(t, "fresh")
	lacks := func() bool {
		var st keysStatus
		getJSON(t, fresh.HTTPURL()+"/status", "", &st)
		return st.Keys != nil && slices.Contains(st.Keys.Lacking, kid)
	}
	if !waitFor(30*time.Second, lacks) {
		t.Fatalf("fresh does not say it lacks %s\n%s", kid, fresh.Output())
	}

	// The attack, with peer's own database login.
	pconn, err := pgx.Connect(ctx, envValue(t, m.envs["peer"], "MESHBOX_DB"))
	if err != nil {
		t.Fatal(err)
	}
	defer pconn.Close(ctx)
	var pub []byte
	if err := pconn.QueryRow(ctx, `SELECT public_key FROM nodes WHERE name = 'fresh'`).Scan(&pub); err != nil || len(pub) == 0 {
		t.Fatalf("peer reads fresh's public key: %v (%d bytes)", err, len(pub))
	}
	bogus, err := seal.ContentKeyFrom(kid, seal.NewContentKey().Bytes())
	if err != nil {
		t.Fatal(err)
	}
	blob, err := seal.SealTo(pub, seal.ContentKeyInfo(kid, "fresh"), bogus.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	var wrote bool
	if err := pconn.QueryRow(ctx, `SELECT meshbox_put_sealed_key($1, 'peer', 'fresh', $2, $3)`,
		kid, seal.Fingerprint(pub), blob).Scan(&wrote); err != nil || !wrote {
		t.Fatalf("peer stores its copy for fresh: got %v %v, want stored (the attack needs it)", wrote, err)
	}
	refusedCount := func() float64 {
		v, _ := scrape(t, fresh.HTTPURL()).value("meshbox_sealed_keys_refused_total", "reason=commitment")
		return v
	}
	// fresh either refuses the copy or (without commitments) holds it.
	if !waitFor(15*time.Second, func() bool { return refusedCount() >= 1 || !lacks() }) {
		t.Fatalf("fresh neither refused nor took peer's copy\n%s", fresh.Output())
	}

	// alpha, an honest holder, is back: fresh ends up with the real key,
	// and calls cross the mesh both ways.
	alpha = m.start(t, "alpha")
	waitSealing(t, fresh)
	for _, c := range []struct{ from, to *meshtest.Process }{{fresh, alpha}, {alpha, fresh}} {
		host := natsConn(t, c.to)
		if _, err := host.Subscribe("cap.echo", func(msg *nats.Msg) { _ = msg.Respond(msg.Data) }); err != nil {
			t.Fatal(err)
		}
		flush(t, host)
		to := "alpha"
		if c.to == fresh {
			to = "fresh"
		}
		caller := natsConn(t, c.from)
		subject := "node." + to + ".cap.echo"
		waitCallable(t, caller, subject, nil, func(msg *nats.Msg) bool { code, _ := serviceError(msg); return code == 0 })
		resp, err := caller.Request(subject, []byte("real key"), 5*time.Second)
		if code, text := serviceError(resp); err != nil || code != 0 || string(resp.Data) != "real key" {
			t.Fatalf("calling echo on %s: %v %d %q", to, err, code, text)
		}
		host.Close()
	}

	// What fresh did with peer's copy: counted, logged once, removed.
	if got := refusedCount(); got != 1 {
		t.Errorf("fresh's refused copies (commitment): got %v, want 1", got)
	}
	if n := logLines(fresh.Output(), "refused a sealed copy of a content key", "reason=commitment", "sealed_by=peer"); n != 1 {
		t.Errorf("fresh's log lines for peer's copy: got %d, want 1\n%s", n, fresh.Output())
	}
	aconn, err := pgx.Connect(ctx, m.db)
	if err != nil {
		t.Fatal(err)
	}
	defer aconn.Close(ctx)
	var by string
	if err := aconn.QueryRow(ctx, `SELECT sealed_by FROM sealed_keys WHERE key_id = $1 AND node = 'fresh'`, kid).Scan(&by); err != nil || by != "alpha" {
		t.Errorf("fresh's copy of %s: sealed by %q (%v), want alpha's", kid, by, err)
	}
}
