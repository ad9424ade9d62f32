package bridge_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/bridge/brokeradmin"
	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
)

// sealedPerNodePair starts alpha and beta on broker users of their own
// (allowed only the stages given, by name: the permissions' stage list)
// sealing with one content key; edit changes beta's configuration. tap
// receives a copy of everything published on mesh with a retry.# or
// dead.# key, read with the admin's rights.
func sealedPerNodePair(t *testing.T, stages []string, edit func(*bridge.Config)) (a, b *node, tap <-chan amqp.Delivery) {
	t.Helper()
	admin, urlOf := perNodeMesh(t)
	ctx := context.Background()
	cred := func(n string) brokeradmin.Credential {
		c, err := admin.CreateGeneration(ctx, n, 1, stages)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = admin.DeleteGeneration(context.Background(), n, 1) })
		return c
	}
	ck := seal.NewContentKey()
	ring := func() *seal.Keyring {
		r, err := seal.NewKeyring([]seal.ContentKey{ck}, ck.ID)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a = newNode(t, "alpha", urlOf(cred("alpha")), func(c *bridge.Config) { c.Keys = ring() })
	b = newNode(t, "beta", urlOf(cred("beta")), func(c *bridge.Config) {
		c.Keys = ring()
		if edit != nil {
			edit(c)
		}
	})
	a.waitConnected(t)
	b.waitConnected(t)
	return a, b, adminTap(t, a, "retry.#", "dead.#")
}

// adminTap receives a copy of everything published on mesh with the keys
// given, read with the broker admin's rights on n's vhost.
func adminTap(t *testing.T, n *node, keys ...string) <-chan amqp.Delivery {
	t.Helper()
	u, err := url.Parse(n.cfg.URL)
	if err != nil {
		t.Fatal(err)
	}
	adminURL, err := url.Parse(sharedRabbit(t).AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	u.User = adminURL.User
	return meshtest.Tap(t, meshtest.Channel(t, u.String()), keys...)
}

// handled is what a test handler saw of one delivery.
type handled struct {
	at  time.Time
	msg *nats.Msg
}

// answerStage serves work.<stage> on n's program connection; reply answers
// the i-th delivery (0 first) with the message to respond with.
func answerStage(t *testing.T, n *node, stage string, reply func(i int, m *nats.Msg) *nats.Msg) (calls func() []handled) {
	t.Helper()
	var mu sync.Mutex
	var got []handled
	sub, err := n.client.QueueSubscribe("work."+stage, "meshbox", func(m *nats.Msg) {
		mu.Lock()
		i := len(got)
		got = append(got, handled{at: time.Now(), msg: m})
		mu.Unlock()
		r := reply(i, m)
		r.Subject = m.Reply
		if err := m.RespondMsg(r); err != nil {
			t.Errorf("reply: %v", err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	n.waitHosts(t, stage)
	return func() []handled {
		mu.Lock()
		defer mu.Unlock()
		return append([]handled(nil), got...)
	}
}

// failure is a handler's error reply with code.
func failure(code, text string) *nats.Msg {
	m := nats.NewMsg("")
	m.Header.Set("Nats-Service-Error-Code", code)
	m.Header.Set("Nats-Service-Error", text)
	return m
}

// A transient failure of a stage with a retry policy waits in the stage's
// retry queue for its backoff, then runs again (attempt 2), on broker
// users of the nodes' own allowed the stage by name; the copy in the retry
// queue is sealed.
func TestRetryWaitsItsBackoff(t *testing.T) {
	const backoff = 1500 * time.Millisecond
	a, b, tap := sealedPerNodePair(t, []string{"flaky"}, func(c *bridge.Config) {
		c.Retry = map[string]bridge.RetryPolicy{"flaky": {Attempts: 3, Backoff: backoff}}
	})
	failedAt := make(chan time.Time, 1)
	calls := answerStage(t, b, "flaky", func(i int, m *nats.Msg) *nats.Msg {
		if i == 0 {
			defer func() { failedAt <- time.Now() }()
			return failure("500", "the disk is busy")
		}
		return nats.NewMsg("")
	})
	a.submit(t, "flaky", []byte(sealMarker), nats.Header{codec.HeaderMsgID: {"flaky-1"}, "X-Job": {"7"}})
	meshtest.WaitFor(t, 15*time.Second, "the second attempt", func() bool { return len(calls()) >= 2 })
	failed := <-failedAt
	got := calls()
	second := got[1]
	delay := second.at.Sub(failed)
	t.Logf("backoff %s, second attempt %s after the failure", backoff, delay)
	if delay < backoff || delay > backoff+4*time.Second {
		t.Errorf("second attempt %s after the failure, want at least the backoff %s and at most 4s more", delay, backoff)
	}
	h := second.msg.Header
	if h.Get(codec.HeaderAttempt) != "2" || h.Get(codec.HeaderMsgID) != "flaky-1" || h.Get("X-Job") != "7" ||
		h.Get(codec.HeaderFirstOrigin) != "alpha" || h.Get(codec.HeaderRedelivered) != "true" {
		t.Errorf("second delivery headers: got %v", h)
	}
	if !bytes.Equal(second.msg.Data, []byte(sealMarker)) {
		t.Errorf("second delivery body: got %q", second.msg.Data)
	}
	// The copy that went through the retry queue was sealed.
	select {
	case d := <-tap:
		if d.RoutingKey != "retry.flaky" || bytes.Contains(d.Body, []byte(sealMarker)) || d.Headers[codec.HeaderKey] == nil {
			t.Errorf("retry copy: key %s, sealed %v, body holds the plain text %v", d.RoutingKey, d.Headers[codec.HeaderKey] != nil,
				bytes.Contains(d.Body, []byte(sealMarker)))
		}
		if d.Expiration != "1500" {
			t.Errorf("retry copy expiration: got %q, want 1500", d.Expiration)
		}
	case <-time.After(5 * time.Second):
		t.Error("no copy went through retry.flaky")
	}
	meshtest.WaitFor(t, 5*time.Second, "the command acked", func() bool { return len(b.b.Status().Commands) == 0 })
	time.Sleep(backoff) // nothing more may come: the second attempt succeeded
	if n := len(calls()); n != 2 {
		t.Errorf("handler calls: got %d, want 2", n)
	}
}

// A handler's permanent failure (422) dead-letters its command at once,
// with the reason, although the stage's policy allows more attempts; the
// dead letter can be listed, shown, replayed (attempts from 1 again, the
// replay recorded) and purged by the node with its own broker user.
func TestPermanentFailureAndDeadLetters(t *testing.T) {
	a, b, _ := sealedPerNodePair(t, []string{"strict"}, func(c *bridge.Config) {
		c.Retry = map[string]bridge.RetryPolicy{"strict": {Attempts: 5, Backoff: 5 * time.Second}}
	})
	ctx := context.Background()
	var okNow sync.Map // message ids the handler now accepts
	calls := answerStage(t, b, "strict", func(i int, m *nats.Msg) *nats.Msg {
		if _, ok := okNow.Load(m.Header.Get(codec.HeaderMsgID)); ok {
			return nats.NewMsg("")
		}
		return failure(strconv.Itoa(codec.CodePermanent), "order 7 has no such item")
	})
	start := time.Now()
	a.submit(t, "strict", []byte("order"), nats.Header{codec.HeaderMsgID: {"strict-1"}, "X-Order": {"7"}})
	var list []bridge.DeadLetter
	meshtest.WaitFor(t, 4*time.Second, "the dead letter", func() bool {
		var err error
		list, err = b.b.DeadLetters(ctx, "strict")
		return err == nil && len(list) == 1
	})
	t.Logf("dead-lettered %s after the submission", time.Since(start))
	if n := len(calls()); n != 1 {
		t.Errorf("handler calls before the dead letter: got %d, want 1 (no retry)", n)
	}
	dl := list[0]
	if dl.ID != "strict-1" || dl.Attempts != 1 || dl.Node != "beta" || dl.Origin != "alpha" ||
		!strings.Contains(dl.Reason, "permanent failure at attempt 1") || !strings.Contains(dl.Reason, "422 order 7 has no such item") ||
		dl.FirstFailure.IsZero() || dl.LastFailure.Before(dl.FirstFailure) {
		t.Errorf("dead letter: got %+v", dl)
	}
	shown, err := b.b.ShowDeadLetter(ctx, "strict", "strict-1")
	if err != nil {
		t.Fatal(err)
	}
	if !shown.Opened || shown.Content["X-Order"] != "7" || shown.Reason != dl.Reason ||
		shown.Headers[codec.HeaderDeadReason] != "permanent failure at attempt 1: handler of stage strict on node beta replied error 422" {
		t.Errorf("shown: got %+v (on the broker, the reason's class only)", shown)
	}
	if _, err := b.b.ShowDeadLetter(ctx, "strict", "nope"); !errors.Is(err, bridge.ErrNoDeadLetter) {
		t.Errorf("show of a missing id: got %v, want ErrNoDeadLetter", err)
	}
	if _, err := b.b.DeadLetters(ctx, "bad stage"); !errors.Is(err, codec.ErrBadInput) {
		t.Errorf("list of a bad stage name: got %v, want ErrBadInput", err)
	}
	meshtest.WaitFor(t, 5*time.Second, "the count in the status", func() bool { return b.b.Status().DeadLetters["strict"] == 1 })

	// Replayed: delivered again with attempt 1 and the replay recorded.
	okNow.Store("strict-1", true)
	n, err := b.b.ReplayDeadLetters(ctx, "strict", "strict-1")
	if err != nil || n != 1 {
		t.Fatalf("replay: got %d, %v", n, err)
	}
	meshtest.WaitFor(t, 10*time.Second, "the replayed command", func() bool { return len(calls()) == 2 })
	h := calls()[1].msg.Header
	if h.Get(codec.HeaderAttempt) != "1" || h.Get(codec.HeaderMsgID) != "strict-1" || h.Get("X-Order") != "7" ||
		!strings.Contains(h.Get(codec.HeaderReplayed), "by beta") || !strings.Contains(h.Get(codec.HeaderReplayed), "permanent failure") ||
		h.Get(codec.HeaderFirstOrigin) != "alpha" {
		t.Errorf("replayed delivery headers: got %v", h)
	}
	meshtest.WaitFor(t, 5*time.Second, "the command acked", func() bool { return len(b.b.Status().Commands) == 0 })
	if list, err := b.b.DeadLetters(ctx, "strict"); err != nil || len(list) != 0 {
		t.Errorf("dead letters after the replay: got %d, %v", len(list), err)
	}

	// Purged.
	a.submit(t, "strict", []byte("order"), nats.Header{codec.HeaderMsgID: {"strict-2"}})
	a.submit(t, "strict", []byte("order"), nats.Header{codec.HeaderMsgID: {"strict-3"}})
	meshtest.WaitFor(t, 5*time.Second, "two dead letters", func() bool {
		list, err := b.b.DeadLetters(ctx, "strict")
		return err == nil && len(list) == 2
	})
	if n, err := b.b.PurgeDeadLetters(ctx, "strict"); err != nil || n != 2 {
		t.Errorf("purge: got %d, %v; want 2", n, err)
	}
	if list, err := b.b.DeadLetters(ctx, "strict"); err != nil || len(list) != 0 {
		t.Errorf("dead letters after the purge: got %d, %v", len(list), err)
	}
	if c := b.b.Status().DeadLetters["strict"]; c != 0 {
		t.Errorf("status count after the purge: got %d", c)
	}
}

// A command's attempts under a retry policy end in its stage's dead
// letters with the count and the first failure.
func TestRetryAttemptsSpentDeadLetter(t *testing.T) {
	vhost := testVhost(t)
	b := newNode(t, "beta", vhost, func(c *bridge.Config) {
		c.Retry = map[string]bridge.RetryPolicy{"doomed": {Attempts: 2, Backoff: 200 * time.Millisecond}}
	})
	b.waitConnected(t)
	calls := answerStage(t, b, "doomed", func(i int, m *nats.Msg) *nats.Msg { return failure("500", "always") })
	b.submit(t, "doomed", []byte("x"), nats.Header{codec.HeaderMsgID: {"doomed-1"}})
	ctx := context.Background()
	var list []bridge.DeadLetter
	meshtest.WaitFor(t, 10*time.Second, "the dead letter", func() bool {
		var err error
		list, err = b.b.DeadLetters(ctx, "doomed")
		return err == nil && len(list) == 1
	})
	dl := list[0]
	if n := len(calls()); n != 2 {
		t.Errorf("handler calls: got %d, want 2", n)
	}
	if dl.Attempts != 2 || !strings.Contains(dl.Reason, "attempt 2 of 2 failed") || !dl.FirstFailure.Before(dl.LastFailure) {
		t.Errorf("dead letter: got %+v", dl)
	}
}

// A command naming a result topic has its handler's result published as
// an event on that topic with the command's message id, to the submitting
// node; a bad topic is refused when submitted.
func TestResultAsEvent(t *testing.T) {
	vhost := testVhost(t)
	a := newNode(t, "alpha", vhost, nil)
	b := newNode(t, "beta", vhost, nil)
	a.waitConnected(t)
	b.waitConnected(t)
	events := make(chan *nats.Msg, 4)
	sub, err := a.client.ChanSubscribe("evt.jobs.done", events)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	waitConsumer(t, vhost, "node.alpha.events")
	a.waitEventsBound(t, "evt.jobs.done")
	answerStage(t, b, "render", func(i int, m *nats.Msg) *nats.Msg {
		r := nats.NewMsg("")
		r.Data = append([]byte("rendered "), m.Data...)
		r.Header.Set("Content-Type", "text/plain")
		return r
	})
	a.submit(t, "render", []byte("page 3"), nats.Header{codec.HeaderMsgID: {"render-1"}, codec.HeaderResultTopic: {"jobs.done"}})
	select {
	case e := <-events:
		if string(e.Data) != "rendered page 3" || e.Header.Get(codec.HeaderMsgID) != "render-1" ||
			e.Header.Get(codec.HeaderOrigin) != "beta" || e.Header.Get("Content-Type") != "text/plain" {
			t.Errorf("result event: got %q %v", e.Data, e.Header)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no result event")
	}
	m, err := a.request(t, "cmd.render", []byte("x"), nats.Header{codec.HeaderResultTopic: {"jobs..done"}}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := natstest.ServiceError(m); code != 400 {
		t.Errorf("bad result topic: got code %d, want 400", code)
	}
}

// A result on a topic bound to a scope is sealed with the scope's key, as
// the scope's events are, and opens at a member; a node outside the scope
// that runs the command does not publish the result (counted as dropped).
func TestScopedResult(t *testing.T) {
	vhost := testVhost(t)
	km, err := seal.ContentKeyFrom("kmesh", seal.NewContentKey().Bytes())
	if err != nil {
		t.Fatal(err)
	}
	kv, err := seal.ContentKeyFrom("kvault", seal.NewContentKey().Bytes())
	if err != nil {
		t.Fatal(err)
	}
	kv.Scope = "vault"
	ring := func(member bool) *seal.Keyring {
		sc := seal.Scopes{Bindings: map[string]string{seal.BindingKey(seal.BindTopic, "ledger.done"): "vault"},
			Member: map[string]bool{}, Current: map[string]string{}, Members: map[string][]string{"vault": {"alpha", "beta"}}}
		keys := []seal.ContentKey{km}
		if member {
			sc.Member["vault"], sc.Current["vault"] = true, kv.ID
			keys = append(keys, kv)
		}
		r := &seal.Keyring{}
		if err := r.SetScoped(keys, km.ID, sc); err != nil {
			t.Fatal(err)
		}
		return r
	}
	regGamma := prometheus.NewRegistry()
	a := newNode(t, "alpha", vhost, func(c *bridge.Config) { c.Keys = ring(true) })
	b := newNode(t, "beta", vhost, func(c *bridge.Config) { c.Keys = ring(true) })
	g := newNode(t, "gamma", vhost, func(c *bridge.Config) { c.Keys, c.Metrics = ring(false), regGamma })
	for _, n := range []*node{a, b, g} {
		n.waitConnected(t)
	}
	ch := meshtest.Channel(t, vhost)
	tap := meshtest.Tap(t, ch, "evt.#")
	events := make(chan *nats.Msg, 4)
	sub, err := a.client.ChanSubscribe("evt.ledger.done", events)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	waitConsumer(t, vhost, "node.alpha.events")
	a.waitEventsBound(t, "evt.ledger.done")
	result := func(i int, m *nats.Msg) *nats.Msg {
		r := nats.NewMsg("")
		r.Data = []byte("posted " + sealMarker)
		return r
	}
	answerStage(t, b, "post", result)
	answerStage(t, g, "post.outside", result)

	a.submit(t, "post", []byte("x"), nats.Header{codec.HeaderMsgID: {"post-1"}, codec.HeaderResultTopic: {"ledger.done"}})
	select {
	case e := <-events:
		if string(e.Data) != "posted "+sealMarker || e.Header.Get(codec.HeaderMsgID) != "post-1" {
			t.Errorf("result event: got %q %v", e.Data, e.Header)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no result event")
	}
	select {
	case d := <-tap:
		if d.Headers[codec.HeaderKey] != kv.ID || bytes.Contains(d.Body, []byte(sealMarker)) {
			t.Errorf("result on the broker: key %v (want the scope's %s), plain text in the body %v",
				d.Headers[codec.HeaderKey], kv.ID, bytes.Contains(d.Body, []byte(sealMarker)))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the tap saw no result event")
	}

	a.submit(t, "post.outside", []byte("x"), nats.Header{codec.HeaderMsgID: {"post-2"}, codec.HeaderResultTopic: {"ledger.done"}})
	meshtest.WaitFor(t, 10*time.Second, "gamma's refusal counted", func() bool { return counter(t, regGamma, "meshbox_errors_total", "dropped") == 1 })
	meshtest.WaitFor(t, 5*time.Second, "gamma's command acked", func() bool { return len(g.b.Status().Commands) == 0 })
	select {
	case e := <-events:
		t.Errorf("a result from outside the scope arrived: %q %v", e.Data, e.Header)
	case d := <-tap:
		t.Errorf("a result from outside the scope reached the broker: %s", d.RoutingKey)
	default:
	}
}

// A node whose broker user has the permissions of before retry and
// dead-letter queues (none on retry.* or dead.*) still hosts a stage with
// a retry policy: it says so in the log, retries the old way (requeue)
// and dead-letters to mesh.dead.
func TestRetryWithOldPermissions(t *testing.T) {
	admin, urlOf := perNodeMesh(t)
	ctx := context.Background()
	cred, err := admin.CreateGeneration(ctx, "beta", 1, []string{bridge.AllStages})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.DeleteGeneration(context.Background(), "beta", 1) })
	// The permissions NodePermissions gave before: stage queues only.
	hc, err := rabbithole.NewClient(strings.Replace(sharedRabbit(t).AdminURL(), "guest:guest@", "", 1), "guest", "guest")
	if err != nil {
		t.Fatal(err)
	}
	hc.SetTransport(&http.Transport{DisableKeepAlives: true})
	queues := `node\.beta\.(requests|replies|events|system)|cmd\.(.+)`
	if _, err := hc.UpdatePermissionsIn(admin.Vhost(), cred.User, rabbithole.Permissions{
		Configure: `^(` + queues + `)$`, Write: `^(mesh|mesh\.dlx|` + queues + `)$`, Read: `^(mesh|node\.beta|` + queues + `)$`}); err != nil {
		t.Fatal(err)
	}
	if _, err := hc.UpdateTopicPermissionsIn(admin.Vhost(), cred.User, rabbithole.TopicPermissions{Exchange: "mesh",
		Write: `^((cmd|evt|sys)\..+|to\.[A-Za-z0-9_-]+\.(req\..+|reply|sys\..+))$`, Read: `^(evt\.#|sys\.#|cmd\.(.+))$`}); err != nil {
		t.Fatal(err)
	}
	// And the exchange the older mesh's admin declared for the node.
	olderExchange(t, strings.Replace(urlOf(cred), cred.User+":"+cred.Password.Reveal(), "guest:guest", 1), "beta")
	warned := &lineCounter{match: "cannot declare a stage's queue"}
	b := newNode(t, "beta", urlOf(cred), func(c *bridge.Config) {
		c.Retry = map[string]bridge.RetryPolicy{"old": {Attempts: 2, Backoff: 5 * time.Second}}
		c.RetryBudget = 2
		warned.next = c.Logger.Handler()
		c.Logger = slog.New(warned)
	})
	b.waitConnected(t)
	calls := answerStage(t, b, "old", func(i int, m *nats.Msg) *nats.Msg {
		if string(m.Data) == "poison" || i == 0 {
			return failure("500", "no")
		}
		return nats.NewMsg("")
	})
	b.submit(t, "old", []byte("x"), nats.Header{codec.HeaderMsgID: {"old-1"}})
	meshtest.WaitFor(t, 10*time.Second, "the second attempt", func() bool { return len(calls()) == 2 })
	if d := calls()[1].at.Sub(calls()[0].at); d >= 5*time.Second {
		t.Errorf("second attempt %s after the first: the policy's backoff, without a retry queue", d)
	}
	if warned.count.Load() == 0 {
		t.Error("no warning that the stage's queues could not be declared")
	}
	b.submit(t, "old", []byte("poison"), nats.Header{codec.HeaderMsgID: {"old-2"}})
	ch := meshtest.Channel(t, strings.Replace(urlOf(cred), cred.User+":"+cred.Password.Reveal(), "guest:guest", 1))
	var dead []amqp.Delivery
	meshtest.WaitFor(t, 15*time.Second, "the dead letter in mesh.dead", func() bool {
		dead = append(dead, deadLetters(t, ch)...)
		return len(dead) > 0
	})
	if dead[0].MessageId != "old-2" {
		t.Errorf("dead letter: got %q", dead[0].MessageId)
	}
	if b.b.Status().Broker.State != bridge.StateConnected {
		t.Errorf("link: got %s, want connected", b.b.Status().Broker.State)
	}
}
