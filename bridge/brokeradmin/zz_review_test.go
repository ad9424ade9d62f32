package brokeradmin_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/bridge/brokeradmin"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
)

func TestZZReviewPerms(t *testing.T) {
	for _, st := range [][]string{{"resize"}, {"*"}, nil} {
		p, err := bridge.NodePermissions("alpha", st)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("stages %v:\n configure %s\n write     %s\n read      %s\n topic(%s) write %s\n topic read %s",
			st, p.Configure, p.Write, p.Read, p.TopicExchange, p.TopicWrite, p.TopicRead)
	}
}

func TestZZReviewAttacks(t *testing.T) {
	a, r, vhost := newAdmin(t)
	ctx := context.Background()
	if err := a.DeclareMesh(ctx); err != nil {
		t.Fatal(err)
	}
	alphaCred, err := a.CreateGeneration(ctx, "alpha", 1, []string{"resize"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.DeleteGeneration(context.Background(), "alpha", 1) })
	betaCred, err := a.CreateGeneration(ctx, "beta", 1, []string{"other"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.DeleteGeneration(context.Background(), "beta", 1) })
	gammaCred, err := a.CreateGeneration(ctx, "gamma", 1, []string{"*"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.DeleteGeneration(context.Background(), "gamma", 1) })
	_ = betaCred

	guest, err := amqp.Dial(fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/%s", r.Port(), url.PathEscape(vhost)))
	if err != nil {
		t.Fatal(err)
	}
	defer guest.Close()
	count := func(q string) int {
		ch, err := guest.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		if err != nil {
			t.Logf("count %s: %v", q, err)
			return -1
		}
		return st.Messages
	}
	waitCount := func(q string, want int) int {
		var n int
		for range 40 {
			if n = count(q); n >= want {
				return n
			}
			time.Sleep(50 * time.Millisecond)
		}
		return n
	}

	alpha := dialAs(t, r, vhost, alphaCred)
	gamma := dialAs(t, r, vhost, gammaCred)
	pubMsg := amqp.Publishing{Body: []byte("planted"), UserId: alphaCred.User, Type: "command", MessageId: "m1"}

	// 0. controls: refused directly.
	t.Logf("alpha publish dead.other direct: %d", try(t, alpha, publish("mesh", "dead.other", pubMsg)))

	// A. CC header on an allowed key.
	{
		ch, _ := alpha.Channel()
		_ = ch.Confirm(false)
		p := pubMsg
		p.Headers = amqp.Table{"CC": []any{"dead.other", "retry.other"}}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "mesh", "dead.resize", false, false, p)
		if err != nil {
			t.Logf("A: CC publish error %v", err)
		} else {
			ok := dc.Wait()
			t.Logf("A: CC publish confirmed=%v", ok)
		}
		ch.Close()
		t.Logf("A: dead.other=%d retry.other=%d dead.resize=%d", waitCount("dead.other", 1), count("retry.other"), count("dead.resize"))
	}
	// A2. BCC
	{
		ch, _ := alpha.Channel()
		_ = ch.Confirm(false)
		p := pubMsg
		p.Headers = amqp.Table{"BCC": []any{"dead.other"}}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "mesh", "evt.x", false, false, p)
		if err == nil {
			t.Logf("A2: BCC confirmed=%v", dc.Wait())
		} else {
			t.Logf("A2: %v", err)
		}
		ch.Close()
		t.Logf("A2: dead.other=%d", waitCount("dead.other", 2))
	}

	// B. dead-letter routing key on a server-named queue.
	{
		ch, _ := alpha.Channel()
		q, err := ch.QueueDeclare("", false, true, true, false, amqp.Table{
			"x-dead-letter-exchange":    "mesh",
			"x-dead-letter-routing-key": "dead.other",
		})
		if err != nil {
			t.Fatalf("B: declare: %v", err)
		}
		if err := ch.QueueBind(q.Name, "to.alpha.req.#", "mesh", false, nil); err != nil {
			t.Fatalf("B: bind: %v", err)
		}
		before := count("dead.other")
		if err := ch.PublishWithContext(ctx, "mesh", "to.alpha.req.plant", false, false, pubMsg); err != nil {
			t.Fatal(err)
		}
		var d amqp.Delivery
		var ok bool
		for range 40 {
			d, ok, err = ch.Get(q.Name, false)
			if ok || err != nil {
				break
			}
			time.Sleep(25 * time.Millisecond)
		}
		if !ok {
			t.Fatalf("B: nothing got: %v", err)
		}
		_ = d.Nack(false, false)
		t.Logf("B: dead.other before=%d after=%d", before, waitCount("dead.other", before+1))
		gch, _ := guest.Channel()
		for {
			m, ok, _ := gch.Get("dead.other", true)
			if !ok {
				break
			}
			t.Logf("B: in dead.other: rk=%s user=%s headers=%v", m.RoutingKey, m.UserId, m.Headers)
		}
		gch.Close()
	}
	// C. DLX = default exchange.
	t.Logf("C: DLX '' -> node.beta.events: %d", try(t, alpha, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare("", false, true, true, false, amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "node.beta.events"})
		return err
	}))
	t.Logf("C2: publish default exchange: %d", try(t, alpha, publish("", "node.beta.events", pubMsg)))
	t.Logf("C3: publish amq.direct: %d", try(t, alpha, publish("amq.direct", "x", pubMsg)))
	// D. mesh -> mesh.dlx exchange binding.
	t.Logf("D: bind mesh.dlx <- mesh evt.#: %d", try(t, alpha, func(ch *amqp.Channel) error {
		return ch.ExchangeBind("mesh.dlx", "evt.#", "mesh", false, nil)
	}))
	t.Logf("D2: bind mesh <- mesh.dlx #: %d", try(t, alpha, func(ch *amqp.Channel) error {
		return ch.ExchangeBind("mesh", "#", "mesh.dlx", false, nil)
	}))
	t.Logf("D3: publish mesh.dlx any key: %d", try(t, alpha, publish("mesh.dlx", "whatever.key", pubMsg)))
	t.Logf("D: mesh.dead before event=%d", count("mesh.dead"))
	t.Logf("D: event publish: %d", try(t, alpha, publish("mesh", "evt.hello", pubMsg)))
	t.Logf("D: mesh.dead after event=%d", waitCount("mesh.dead", 2))
	// E. passive declare of another node's queue (info).
	t.Logf("E: passive node.beta.events: %d", try(t, alpha, func(ch *amqp.Channel) error {
		st, err := ch.QueueDeclarePassive("node.beta.events", true, false, false, false, nil)
		t.Logf("E: %+v", st)
		return err
	}))
	t.Logf("E2: passive node.beta.claim: %d", try(t, alpha, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclarePassive("node.beta.claim", true, false, false, false, nil)
		return err
	}))
	t.Logf("E3: unbind beta events: %d", try(t, alpha, func(ch *amqp.Channel) error {
		return ch.QueueUnbind("node.beta.events", "evt.#", "mesh", nil)
	}))
	t.Logf("E4: unbind cmd.other: %d", try(t, alpha, func(ch *amqp.Channel) error {
		return ch.QueueUnbind("cmd.other", "cmd.other", "mesh", nil)
	}))
	t.Logf("E5: claim queue durable non-exclusive: %d", try(t, alpha, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare("node.alpha.claim", true, false, false, false, nil)
		return err
	}))
	t.Logf("E6: then exclusive claim: %d", try(t, alpha, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare("node.alpha.claim", false, true, true, false, nil)
		return err
	}))
	t.Logf("E7: delete claim: %d", try(t, alpha, func(ch *amqp.Channel) error {
		_, err := ch.QueueDelete("node.alpha.claim", false, false, false)
		return err
	}))
	t.Logf("E8: claim exchange with AE mesh: %d", try(t, alpha, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare("node.alpha.claim", "fanout", false, true, false, false, amqp.Table{"alternate-exchange": "mesh"})
	}))
	t.Logf("E9: bind own q to mesh '#': %d", try(t, alpha, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclare("", false, true, true, false, nil)
		if err != nil {
			return err
		}
		return ch.QueueBind(q.Name, "#", "mesh", false, nil)
	}))
	t.Logf("E10: bind own q to mesh 'to.*.req.#': %d", try(t, alpha, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclare("", false, true, true, false, nil)
		if err != nil {
			return err
		}
		return ch.QueueBind(q.Name, "to.*.req.#", "mesh", false, nil)
	}))

	// G. gamma ("*"): an exchange of a stage-queue name bound into mesh.
	gp := amqp.Publishing{Body: []byte("g"), UserId: gammaCred.User}
	t.Logf("G: declare exchange cmd.zz: %d", try(t, gamma, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare("cmd.zz", "fanout", false, false, false, false, nil)
	}))
	t.Logf("G: bind mesh <- cmd.zz: %d", try(t, gamma, func(ch *amqp.Channel) error {
		return ch.ExchangeBind("mesh", "", "cmd.zz", false, nil)
	}))
	t.Logf("G: publish mesh 'to.alpha.other' direct: %d", try(t, gamma, publish("mesh", "to.alpha.other", gp)))
	t.Logf("G: publish cmd.zz 'to.alpha.other': %d", try(t, gamma, publish("cmd.zz", "to.alpha.other", gp)))
	t.Logf("G: delete admin's dead.resize: %d", try(t, gamma, func(ch *amqp.Channel) error {
		_, err := ch.QueueDelete("dead.resize", false, false, false)
		return err
	}))
	t.Logf("G: redeclare dead.resize ttl 0: %d", try(t, gamma, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare("dead.resize", true, false, false, false, amqp.Table{"x-message-ttl": int32(0)})
		return err
	}))
	if err := a.DeclareNodeQueues(ctx, "alpha", []string{"resize"}); err != nil {
		t.Logf("G: admin redeclare: %v", err)
	} else {
		t.Logf("G: admin DeclareNodeQueues accepted the hostile dead.resize silently")
	}
}

// ---- node correctness ----

type zzWriter struct{ tb testing.TB }

func (w zzWriter) Write(p []byte) (int, error) { w.tb.Log(strings.TrimRight(string(p), "\n")); return len(p), nil }

func zzBridge(t *testing.T, name, brokerURL string) (*bridge.Bridge, error) {
	t.Helper()
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv, nats.Name("appliance"))
	cfg := bridge.Config{
		Node: name, URL: brokerURL, OutboxPath: filepath.Join(t.TempDir(), "outbox.db"),
		RequestTimeout: 3 * time.Second, CommandTimeout: 3 * time.Second, Heartbeat: 2 * time.Second,
		StallAfter: time.Minute, StallCheck: 200 * time.Millisecond,
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 500 * time.Millisecond,
		Dial:   func(opts ...nats.Option) (*nats.Conn, error) { return natstest.Dialer(srv)(opts...) },
		Logger: slog.New(slog.NewTextHandler(zzWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})).With("test_node", name),
	}
	b, err := bridge.New(cfg, nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b, b.Start(context.Background())
}

func zzWait(t *testing.T, d time.Duration, what string, f func() bool) bool {
	t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if f() {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("TIMEOUT waiting for %s", what)
	return false
}

func TestZZReviewNode(t *testing.T) {
	a, r, vhost := newAdmin(t)
	ctx := context.Background()
	if err := a.DeclareMesh(ctx); err != nil {
		t.Fatal(err)
	}
	hc, err := rabbithole.NewClient(r.ManagementURL(), "guest", "guest")
	if err != nil {
		t.Fatal(err)
	}
	hc.SetTransport(&http.Transport{DisableKeepAlives: true})
	urlOf := func(c brokeradmin.Credential) string {
		return fmt.Sprintf("amqp://%s:%s@127.0.0.1:%d/%s", url.PathEscape(c.User), url.PathEscape(c.Password.Reveal()), r.Port(), url.PathEscape(vhost))
	}
	guest, err := amqp.Dial(fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/%s", r.Port(), url.PathEscape(vhost)))
	if err != nil {
		t.Fatal(err)
	}
	defer guest.Close()
	bindingsTo := func(key string) []string {
		bs, err := hc.ListBindingsIn(vhost)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, b := range bs {
			if b.RoutingKey == key {
				out = append(out, b.Source+"->"+b.Destination)
			}
		}
		return out
	}
	claimCode := func(n string) int {
		return try(t, guest, func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclarePassive("node."+n+".claim", false, true, true, false, nil)
			return err
		})
	}
	oldest := func(user, n string) { // as ownbindings_integration_test.go's olderMesh
		queues := `node\.` + n + `\.(requests|replies|events|system)|(cmd|retry|dead)\.(.+)`
		if _, err := hc.UpdatePermissionsIn(vhost, user, rabbithole.Permissions{
			Configure: `^(` + queues + `)$`, Write: `^(mesh|mesh\.dlx|` + queues + `)$`, Read: `^(mesh|node\.` + n + `|` + queues + `)$`}); err != nil {
			t.Fatal(err)
		}
		if _, err := hc.UpdateTopicPermissionsIn(vhost, user, rabbithole.TopicPermissions{Exchange: "mesh",
			Write: `^((cmd|evt|sys)\..+|to\.[A-Za-z0-9_-]+\.(req\..+|reply|sys\..+)|(retry|dead)\.(.+))$`,
			Read:  `^(evt\.#|sys\.#|(cmd|retry|dead)\.(.+))$`}); err != nil {
			t.Fatal(err)
		}
	}
	parent := func(user, n string) { // fe50df3^'s NodePermissions(n, nil)
		own := `node\.` + n + `\.(requests|replies|events|system)`
		if _, err := hc.UpdatePermissionsIn(vhost, user, rabbithole.Permissions{
			Configure: `^(node\.` + n + `|` + own + `)$`, Write: `^(mesh|mesh\.dlx|node\.` + n + `|` + own + `)$`, Read: `^(mesh|node\.` + n + `|` + own + `)$`}); err != nil {
			t.Fatal(err)
		}
		if _, err := hc.UpdateTopicPermissionsIn(vhost, user, rabbithole.TopicPermissions{Exchange: "mesh",
			Write: `^((cmd|evt|sys)\..+|to\.[A-Za-z0-9_-]+\.(req\..+|reply|sys\..+))$`,
			Read:  `^(evt\.#|sys\.#|to\.` + n + `\.(#|req\.#|reply|sys\.#))$`}); err != nil {
			t.Fatal(err)
		}
	}
	gch, _ := guest.Channel()

	// S1: alpha runs on the oldest permissions through node.alpha.
	g1, err := a.CreateGeneration(ctx, "alpha", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	oldest(g1.User, "alpha")
	if err := gch.ExchangeDeclare("node.alpha", "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := gch.ExchangeBind("node.alpha", "to.alpha.#", "mesh", false, nil); err != nil {
		t.Fatal(err)
	}
	b, err := zzBridge(t, "alpha", urlOf(g1))
	if err != nil {
		t.Fatalf("S1 start: %v", err)
	}
	zzWait(t, 15*time.Second, "alpha connected", func() bool { return b.Status().Broker.State == bridge.StateConnected })
	t.Logf("S1 oldest perms: state=%s warnings=%v req bindings=%v claim=%d", b.Status().Broker.State, b.Status().Warnings, bindingsTo("to.alpha.req.#"), claimCode("alpha"))

	// Rotation: the admin makes g2 (current permissions) and drops node.alpha
	// before the node switched.
	g2, err := a.CreateGeneration(ctx, "alpha", 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("S1 after CreateGeneration(g2), before the switch: req bindings=%v reply bindings=%v", bindingsTo("to.alpha.req.#"), bindingsTo("to.alpha.reply"))
	pubCh, _ := guest.Channel()
	rets := pubCh.NotifyReturn(make(chan amqp.Return, 1))
	_ = pubCh.PublishWithContext(ctx, "mesh", "to.alpha.req.echo", true, false, amqp.Publishing{Body: []byte("x")})
	select {
	case rt := <-rets:
		t.Logf("S1 a request to alpha in that window: returned %d %s", rt.ReplyCode, rt.ReplyText)
	case <-time.After(time.Second):
		t.Logf("S1 a request to alpha in that window: routed")
	}
	if err := b.SetURL(urlOf(g2)); err != nil {
		t.Fatal(err)
	}
	zzWait(t, 20*time.Second, "alpha on g2", func() bool {
		c := b.Status().Broker.Credential
		return c != nil && c.User == g2.User && c.State == bridge.CredentialInUse && b.Status().Broker.State == bridge.StateConnected
	})
	t.Logf("S1 after handover to g2 (current perms): state=%s reason=%q warnings=%v req=%v reply=%v sys=%v claim=%d",
		b.Status().Broker.State, b.Status().Broker.Reason, b.Status().Warnings, bindingsTo("to.alpha.req.#"), bindingsTo("to.alpha.reply"), bindingsTo("to.alpha.sys.#"), claimCode("alpha"))

	// S4: a second process with the same name and credential.
	_, err = zzBridge(t, "alpha", urlOf(g2))
	t.Logf("S4 second alpha on g2: %v (NodeNameInUse=%v)", err, errors.Is(err, bridge.ErrNodeNameInUse))

	// S2: handover to a generation with the previous version's permissions.
	g3, err := a.CreateGeneration(ctx, "alpha", 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	parent(g3.User, "alpha")
	if err := b.SetURL(urlOf(g3)); err != nil {
		t.Fatal(err)
	}
	zzWait(t, 20*time.Second, "alpha on g3", func() bool {
		c := b.Status().Broker.Credential
		return c != nil && c.User == g3.User && c.State == bridge.CredentialInUse && b.Status().Broker.State == bridge.StateConnected
	})
	t.Logf("S2 after handover to g3 (previous version's perms): state=%s reason=%q req=%v claim=%d",
		b.Status().Broker.State, b.Status().Broker.Reason, bindingsTo("to.alpha.req.#"), claimCode("alpha"))
	_, err = zzBridge(t, "alpha", urlOf(g3))
	t.Logf("S4b second alpha on g3: %v", err)

	// S2b: back to the oldest permissions (a node that comes back on the
	// generation it had before the rotation): node.alpha is gone.
	g4, err := a.CreateGeneration(ctx, "alpha", 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	oldest(g4.User, "alpha")
	if err := b.SetURL(urlOf(g4)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	t.Logf("S2b on g4 (oldest perms, node.alpha deleted by the admin): state=%s reason=%q cred=%+v",
		b.Status().Broker.State, b.Status().Broker.Reason, b.Status().Broker.Credential)

	// S5: an event queue declared by a node (with x-expires) is kept by the
	// admin; once it expires the node cannot start.
	if _, err := gch.QueueDeclare("node.delta.events", true, false, false, false,
		amqp.Table{"x-queue-type": "quorum", "x-expires": int64(7 * 24 * 3600 * 1000)}); err != nil {
		t.Fatal(err)
	}
	gd, err := a.CreateGeneration(ctx, "delta", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	qi, err := hc.GetQueue(vhost, "node.delta.events")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("S5 node.delta.events after CreateGeneration: arguments=%v", qi.Arguments)
	if _, err := gch.QueueDelete("node.delta.events", false, false, false); err != nil { // as its x-expires would
		t.Fatal(err)
	}
	bd, err := zzBridge(t, "delta", urlOf(gd))
	time.Sleep(2 * time.Second)
	t.Logf("S5 delta after its event queue expired: start=%v state=%s reason=%q", err, bd.Status().Broker.State, bd.Status().Broker.Reason)
}
