package e2e

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/bridge/brokeradmin"
	"github.com/meshbox/meshbox/testing/ledger"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
)

// TestAdversaryWithAnotherNodesCredential runs alpha and beta on broker
// users of their own and attacks alpha with beta's valid credential and a
// plain AMQP client. Every attack is refused by the broker or dropped and
// counted by the node, and the mesh's normal traffic goes on.
func TestAdversaryWithAnotherNodesCredential(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	ctx := context.Background()
	r := meshtest.LeaseRabbitMQ(t)
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
		waitCallable(t, caller, "cap.echo", nil, func(m *nats.Msg) bool { c, _ := natstest.ServiceError(m); return c == 0 })
		resp, err := caller.Request("cap.echo", []byte(what), 5*time.Second)
		if code, text := natstest.ServiceError(resp); err != nil || code != 0 || string(resp.Data) != what {
			t.Fatalf("%s: beta calling echo on alpha: %v %d %q", what, err, code, text)
		}
		if o, resp, err := ledger.Submit(caller, "cmd.resize", []byte(what), 5*time.Second); o != ledger.Acked {
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

	conn := meshtest.Dial(t, betaURL)
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
	// alpha listens to the events the attack below forges (a node's
	// queue is bound only to the topics its programs listen to).
	if _, err := host.Subscribe("evt.order", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	flush(t, host)
	waitListening(t, alpha, "evt.order")
	alphaForged := func() float64 {
		v, _ := scrape(t, alpha.HTTPURL()).value("meshbox_errors_total", "kind=forged")
		return v
	}
	base := alphaForged()
	// 3. Without user_id, claiming an origin in the header: a request with
	// a reply-to of the attacker's choosing, a forged reply and an event.
	forgedOrigin := amqp.Table{codec.HeaderOrigin: "gamma", codec.HeaderCapability: "echo"}
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
	if !meshtest.Poll(10*time.Second, func() bool { return alphaForged() >= base+3 }) {
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
	if !meshtest.Poll(10*time.Second, func() bool { return lateReplies(beta) >= betaLate+1 }) {
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
		if code, text := natstest.ServiceError(resp); err != nil || code != 0 {
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
	if !meshtest.Poll(10*time.Second, func() bool { return lateReplies(alpha) >= alphaLate+flood }) {
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
	gch := meshtest.Channel(t, gammaURL)
	gammaQ, err := gch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatalf("gamma declares its request queue: %v", err)
	}
	if err := gch.QueueBind(gammaQ.Name, "to.gamma.req.#", "mesh", false, nil); err != nil {
		t.Fatalf("gamma binds its request queue: %v", err)
	}
	gammaReqs, err := gch.Consume(gammaQ.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatalf("gamma consumes its requests: %v", err)
	}
	go func() { // the waiting caller: exits when its request is answered or times out
		resp, err := victim.Request("node.gamma.cap.echo", []byte("x"), 20*time.Second)
		if code, text := natstest.ServiceError(resp); err != nil || code != 0 {
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
	if !meshtest.Poll(10*time.Second, func() bool { return alphaForged() >= base+1 }) {
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
	if code := refused(pub("sys.bye", amqp.Publishing{Type: "system", Headers: amqp.Table{codec.HeaderOrigin: "alpha"}, Body: bye})); code != 0 {
		t.Fatalf("publish bye without user_id: code %d", code)
	}
	// beta's bridge skips the first as its own echo; alpha's node rejects
	// it: a bye from beta that names alpha. beta's bridge drops the second.
	if !meshtest.Poll(10*time.Second, func() bool { return rejected() >= rej0+1 }) {
		t.Errorf("alpha's discovery rejections for origin mismatch: %v, want %v", rejected(), rej0+1)
	}
	if !meshtest.Poll(10*time.Second, func() bool { return betaForged() >= forged0+1 }) {
		t.Errorf("beta's forged count: %v, want %v (a bye without user_id)", betaForged(), forged0+1)
	}
	if st := peer(meshtest.Status(t, beta.HTTPURL()), "alpha").State; st != "up" {
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
	ownCh, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	own, err := ownCh.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatalf("beta declares a server-named queue: %v", err)
	}
	for _, key := range []string{"to.alpha.req.#", "to.alpha.reply", "to.alpha.#"} {
		if code := refused(func(ch *amqp.Channel) error {
			return ch.QueueBind(own.Name, key, "mesh", false, nil)
		}); code != amqp.AccessRefused {
			t.Errorf("bind beta's queue to mesh with %s: code %d, want %d", key, code, amqp.AccessRefused)
		}
	}
	if code := refused(func(ch *amqp.Channel) error {
		return ch.QueueBind(own.Name, "to.alpha.req.#", "node.alpha", false, nil)
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
	t.Parallel()
	ctx := context.Background()
	r := meshtest.LeaseRabbitMQ(t)
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
	gch := meshtest.Channel(t, vhostURL)
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
