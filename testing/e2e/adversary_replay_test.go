package e2e

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/testing/ledger"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// replayMesh is a sealed mesh of alpha and beta (beta retries stage resize
// once, after 300 ms in its retry queue) and the broker URL of mallory, a
// node added with stage resize and its own real credential, played by a
// raw AMQP client.
func replayMesh(t *testing.T) (rmq *meshtest.Rabbit, vhost, db string, alpha, beta *meshtest.Process, malloryURL string) {
	t.Helper()
	rmq = meshtest.LeaseRabbitMQ(t)
	config := bridgeConfigFile(t, "beta", bridgeConfig{Retry: map[string]map[string]any{"resize": {"attempts": 2, "backoff": "300ms"}}})
	vhost, db, alpha, beta = sealedMeshOn(t, rmq, "--config", config)
	env := []string{"MESHBOX_DB=" + db, "MESHBOX_BROKER_ADMIN=" + rmq.AdminURL()}
	if code, out, errOut := cliEnv(t, env, "mesh", "node", "add", "mallory", "--stages", "resize"); code != 0 {
		t.Fatalf("mesh node add mallory: exit %d: %s%s", code, out, errOut)
	}
	t.Cleanup(func() { _, _, _ = cliEnv(t, env, "mesh", "node", "remove", "mallory", "--force") })
	return rmq, vhost, db, alpha, beta, brokerURLOf(t, context.Background(), db, vhost, "mallory")
}

// replays reads node p's meshbox_replays_refused_total of shape and reason.
func replays(t *testing.T, p *meshtest.Process, shape, reason string) float64 {
	t.Helper()
	v, _ := scrape(t, p.HTTPURL()).value("meshbox_replays_refused_total", "shape="+shape, "reason="+reason)
	return v
}

// rejecter consumes queue q on conn and rejects (dead-letters) each
// message until it has seen its id times+1 times, then acks it. It
// returns how many it rejected so far.
func rejecter(t *testing.T, conn *amqp.Connection, q string, times int) func() int {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("mallory consumes %s: %v", q, err)
	}
	var mu sync.Mutex
	seen := map[string]int{}
	rejected := 0
	go func() { // exits when the channel closes (the connection's cleanup)
		for d := range ds {
			mu.Lock()
			seen[d.MessageId]++
			again := seen[d.MessageId] <= times
			if again {
				rejected++
			}
			mu.Unlock()
			if again {
				_ = d.Nack(false, false)
			} else {
				_ = d.Ack(false)
			}
		}
	}()
	return func() int { mu.Lock(); defer mu.Unlock(); return rejected }
}

// TestAdversaryReplaysThroughDeadLettering: mallory, a node with its own
// real credential and stage resize, declares queues of its own with
// x-dead-letter-exchange=mesh, binds them to evt.# and cmd.resize, and
// rejects what arrives, so that the broker publishes alpha's events and
// commands again on mesh with alpha's user_id and seal. beta handles each
// event and command once and counts every replay; the controls: a fresh
// event from alpha arrives, and a command that fails its first attempt
// still comes back through its retry queue and is handled again.
func TestAdversaryReplaysThroughDeadLettering(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	rmq, vhost, _, alpha, beta, malloryURL := replayMesh(t)

	// beta: a subscriber of evt.order and the handler of resize, which
	// fails the first attempt of "retry-me".
	listener := natsConn(t, beta)
	var mu sync.Mutex
	events := map[string]int{}
	if _, err := listener.Subscribe("evt.order", func(m *nats.Msg) {
		mu.Lock()
		events[m.Header.Get(hdrMsgID)]++
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	flush(t, listener)
	waitListening(t, beta, "evt.order", alpha)
	calls := stageCalls(t, listener, "resize", func(m *nats.Msg) *nats.Msg {
		r := nats.NewMsg("")
		if string(m.Data) == "retry-me" && m.Header.Get(hdrAttempt) == "1" {
			r.Header.Set("Nats-Service-Error", "not yet")
			r.Header.Set("Nats-Service-Error-Code", "500")
		}
		return r
	})
	waitConsumers(t, rmq, vhost, "cmd.resize", 1)

	conn := meshtest.Dial(t, malloryURL)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	// The only queues mallory may declare are server-named ones, and
	// RabbitMQ lets it give them mesh as their dead-letter exchange (it
	// may write to mesh).
	dlx := amqp.Table{"x-dead-letter-exchange": bridge.MeshExchange}
	var taps []string
	for _, key := range []string{"evt.#", "cmd.resize"} {
		q, err := ch.QueueDeclare("", false, true, true, false, dlx)
		if err != nil {
			t.Fatalf("mallory declares a queue with a dead-letter exchange: %v", err)
		}
		if err := ch.QueueBind(q.Name, key, bridge.MeshExchange, false, nil); err != nil {
			t.Fatalf("mallory binds %s with %s: %v", q.Name, key, err)
		}
		taps = append(taps, q.Name)
	}
	const times = 2 // replays of each message
	eventsRejected := rejecter(t, conn, taps[0], times)
	commandsRejected := rejecter(t, conn, taps[1], times)

	sender := natsConn(t, alpha)
	const n = 10
	var ids, cmds []string
	for i := range n {
		id := fmt.Sprintf("order-%d", i)
		ids = append(ids, id)
		if err := sender.PublishMsg(&nats.Msg{Subject: "evt.order", Data: []byte(id), Header: nats.Header{hdrMsgID: {id}}}); err != nil {
			t.Fatal(err)
		}
		body := fmt.Sprintf("resize-%d", i)
		cmds = append(cmds, body)
		if o, resp, err := ledger.Submit(sender, "cmd.resize", []byte(body), 5*time.Second); o != ledger.Acked {
			t.Fatalf("alpha submits %s: %v %v %v", body, o, resp, err)
		}
	}
	if o, resp, err := ledger.Submit(sender, "cmd.resize", []byte("retry-me"), 5*time.Second); o != ledger.Acked {
		t.Fatalf("alpha submits retry-me: %v %v %v", o, resp, err)
	}
	flush(t, sender)

	// Every replay reached beta and was refused.
	if !meshtest.Poll(20*time.Second, func() bool {
		return replays(t, beta, "event", "dead_lettered") >= float64(n*times) &&
			replays(t, beta, "command", "dead_lettered") >= float64((n+1)*times)
	}) {
		t.Errorf("beta's refused replays: events %v (mallory rejected %d), commands %v (mallory rejected %d), want %d and %d at least",
			replays(t, beta, "event", "dead_lettered"), eventsRejected(), replays(t, beta, "command", "dead_lettered"), commandsRejected(),
			n*times, (n+1)*times)
	}
	// The control: a fresh event from alpha is delivered.
	if err := sender.PublishMsg(&nats.Msg{Subject: "evt.order", Data: []byte("fresh"), Header: nats.Header{hdrMsgID: {"fresh"}}}); err != nil {
		t.Fatal(err)
	}
	ids = append(ids, "fresh")
	if !meshtest.Poll(20*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return events["fresh"] > 0 && len(calls()) >= n+2
	}) {
		t.Errorf("the fresh event or the commands never all arrived: %d calls", len(calls()))
	}
	time.Sleep(time.Second) // real time: replays that would come late

	// The ledger: each event and command once, retry-me twice (its retry),
	// nothing unexpected.
	mu.Lock()
	var lost, dup []string
	for _, id := range ids {
		switch events[id] {
		case 0:
			lost = append(lost, id)
		case 1:
		default:
			dup = append(dup, fmt.Sprintf("%s x%d", id, events[id]))
		}
		delete(events, id)
	}
	unexpected := len(events)
	mu.Unlock()
	if len(lost) > 0 || len(dup) > 0 || unexpected > 0 {
		t.Errorf("events at beta: lost %v, duplicated %v, unexpected %d", lost, dup, unexpected)
	}
	got := map[string][]string{}
	for _, m := range calls() {
		got[string(m.Data)] = append(got[string(m.Data)], m.Header.Get(hdrAttempt))
	}
	lost, dup = nil, nil
	for _, c := range cmds {
		switch len(got[c]) {
		case 0:
			lost = append(lost, c)
		case 1:
		default:
			dup = append(dup, fmt.Sprintf("%s %v", c, got[c]))
		}
		delete(got, c)
	}
	if r := strings.Join(got["retry-me"], " "); r != "1 2" {
		t.Errorf("retry-me at beta's handler: attempts %q, want \"1 2\" (tried again through its retry queue)", r)
	}
	delete(got, "retry-me")
	if len(lost) > 0 || len(dup) > 0 || len(got) > 0 {
		t.Errorf("commands at beta's handler: lost %v, duplicated %v, unexpected %v", lost, dup, got)
	}
	if eventsRejected() < n*times || commandsRejected() < (n+1)*times {
		t.Errorf("mallory rejected %d events and %d commands, want %d and %d: the attack did not run", eventsRejected(), commandsRejected(), n*times, (n+1)*times)
	}
}

// TestAdversaryOperatorReplaysAnEvent: the broker's operator taps alpha's
// events and, with alpha's own credential (an operator can set any
// user's password), publishes one again as it was: no x-death, alpha's
// user_id and seal. beta delivers it once and counts the duplicate; a
// fresh event from alpha still arrives.
func TestAdversaryOperatorReplaysAnEvent(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	ctx := context.Background()
	_, vhost, db, alpha, beta, _ := replayMesh(t)
	listener := natsConn(t, beta)
	var mu sync.Mutex
	events := map[string]int{}
	if _, err := listener.Subscribe("evt.order", func(m *nats.Msg) {
		mu.Lock()
		events[m.Header.Get(hdrMsgID)]++
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	flush(t, listener)
	waitListening(t, beta, "evt.order", alpha)
	count := func(id string) int { mu.Lock(); defer mu.Unlock(); return events[id] }

	och := meshtest.Channel(t, vhost)
	tap, err := och.QueueDeclare("operator-tap", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := och.QueueBind(tap.Name, "evt.#", bridge.MeshExchange, false, nil); err != nil {
		t.Fatal(err)
	}
	taps, err := och.Consume(tap.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	sender := natsConn(t, alpha)
	publish := func(id string) {
		t.Helper()
		if err := sender.PublishMsg(&nats.Msg{Subject: "evt.order", Data: []byte(id), Header: nats.Header{hdrMsgID: {id}}}); err != nil {
			t.Fatal(err)
		}
		flush(t, sender)
	}
	publish("captured")
	var d amqp.Delivery
	select {
	case d = <-taps:
	case <-time.After(20 * time.Second):
		t.Fatal("the operator's tap never saw alpha's event")
	}
	if !meshtest.Poll(20*time.Second, func() bool { return count("captured") == 1 }) {
		t.Fatalf("beta never got alpha's event")
	}

	aconn := meshtest.Dial(t, brokerURLOf(t, ctx, db, vhost, "alpha"))
	code, err := meshtest.BrokerVerdict(aconn, func(ch *amqp.Channel) error {
		return ch.PublishWithContext(ctx, bridge.MeshExchange, d.RoutingKey, false, false, amqp.Publishing{
			Headers: d.Headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding, DeliveryMode: amqp.Persistent,
			MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type, UserId: d.UserId, Body: d.Body})
	})
	if err != nil || code != 0 {
		t.Fatalf("the operator republishes alpha's event with alpha's credential: code %d, %v", code, err)
	}
	if !meshtest.Poll(20*time.Second, func() bool { return replays(t, beta, "event", "duplicate") >= 1 }) {
		t.Errorf("beta's refused duplicate events: %v, want 1", replays(t, beta, "event", "duplicate"))
	}
	publish("fresh") // the control
	if !meshtest.Poll(20*time.Second, func() bool { return count("fresh") == 1 }) {
		t.Errorf("beta never got alpha's fresh event")
	}
	if got := count("captured"); got != 1 {
		t.Errorf("beta delivered alpha's captured event %d times, want once", got)
	}
}

// TestAdversaryExhaustsTheBroker: a node's broker user has connection and
// channel limits (bridge.NodeLimits) from `mesh node add`: mallory's
// credential opens no more connections than the limit, while beta, a
// running node, stays well within them.
func TestAdversaryExhaustsTheBroker(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	rmq, vhost, _, _, beta, malloryURL := replayMesh(t)
	lim := bridge.NodeLimits()
	u, err := url.Parse(malloryURL)
	if err != nil {
		t.Fatal(err)
	}
	var limits []struct {
		User  string         `json:"user"`
		Value map[string]int `json:"value"`
	}
	getJSON(t, rmq.ManagementURL()+"/api/user-limits/"+url.PathEscape(u.User.Username()), "guest", &limits)
	if len(limits) != 1 || limits[0].Value["max-connections"] != lim.MaxConnections || limits[0].Value["max-channels"] != lim.MaxChannels {
		t.Errorf("mallory's user limits: %+v, want max-connections %d, max-channels %d", limits, lim.MaxConnections, lim.MaxChannels)
	}
	var open []*amqp.Connection
	defer func() {
		for _, c := range open {
			_ = c.Close()
		}
	}()
	refused := 0
	for range lim.MaxConnections + 2 {
		c, err := amqp.Dial(malloryURL)
		if err != nil {
			refused++
			continue
		}
		open = append(open, c)
	}
	if len(open) != lim.MaxConnections || refused != 2 {
		t.Errorf("mallory opened %d connections and was refused %d times, want %d and 2", len(open), refused, lim.MaxConnections)
	}

	// The control: a running node that hosts a stage, its connections
	// and channels as the broker counts them.
	host := natsConn(t, beta)
	calls := stageCalls(t, host, "resize", func(*nats.Msg) *nats.Msg { return nats.NewMsg("") })
	waitConsumers(t, rmq, vhost, "cmd.resize", 1)
	var nconn, nch int
	betaUser := ""
	if !meshtest.Poll(20*time.Second, func() bool {
		var conns, chans []struct {
			User string `json:"user"`
		}
		getJSON(t, rmq.ManagementURL()+"/api/connections", "guest", &conns)
		getJSON(t, rmq.ManagementURL()+"/api/channels", "guest", &chans)
		nconn, nch = 0, 0
		for _, c := range conns {
			if strings.HasPrefix(c.User, "node.beta.") {
				betaUser = c.User
				nconn++
			}
		}
		for _, c := range chans {
			if strings.HasPrefix(c.User, "node.beta.") {
				nch++
			}
		}
		return nconn == 2 && nch > 0
	}) {
		t.Fatalf("beta's connections and channels on the broker: %d and %d, want 2 and some", nconn, nch)
	}
	t.Logf("beta (%s) holds %d connections and %d channels; limits %d and %d", betaUser, nconn, nch, lim.MaxConnections, lim.MaxChannels)
	if nch*4 > lim.MaxChannels || nconn*4 > lim.MaxConnections {
		t.Errorf("beta holds %d connections and %d channels: want at most a quarter of the limits (%d, %d)", nconn, nch, lim.MaxConnections, lim.MaxChannels)
	}
	if o, resp, err := ledger.Submit(natsConn(t, beta), "cmd.resize", []byte("x"), 5*time.Second); o != ledger.Acked {
		t.Errorf("beta submits a command under the limits: %v %v %v", o, resp, err)
	}
	if !meshtest.Poll(10*time.Second, func() bool { return len(calls()) == 1 }) {
		t.Errorf("beta's command never reached its handler")
	}
}

// TestAdversaryOwnExchange: mallory, a node with its own real credential
// (mesh node add --stages resize), tries to route messages onto mesh with
// keys its topic permissions refuse there (dead letters and retry copies
// of a stage it was not given) through an exchange of its own, bound into
// mesh: RabbitMQ matches permissions against names, not kinds, so every
// name a node could configure was an exchange it could declare. Now it is
// refused every exchange that could carry anything, of every name and
// kind, and every queue but a server-named one and its claim queue. The controls: mallory publishes its own stage's dead
// letters on mesh, and an event from alpha still reaches beta.
func TestAdversaryOwnExchange(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	_, _, _, alpha, beta, malloryURL := replayMesh(t)
	conn := meshtest.Dial(t, malloryURL)
	verdict := func(op func(ch *amqp.Channel) error) int {
		t.Helper()
		code, err := meshtest.BrokerVerdict(conn, op)
		if err != nil {
			t.Fatal(err)
		}
		return code
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	own, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatalf("mallory declares a server-named queue (control): %v", err)
	}
	names := []string{"node.mallory.events", "node.mallory.requests", "node.mallory.replies", "node.mallory.system",
		"node.mallory", "cmd.resize", "retry.resize", "dead.resize", own.Name, "amq.gen-mallory", "mallory"}
	for _, name := range names {
		for _, kind := range []string{"fanout", "direct", "topic", "headers"} {
			if code := verdict(func(ch *amqp.Channel) error {
				return ch.ExchangeDeclare(name, kind, false, true, false, false, amqp.Table{"alternate-exchange": bridge.MeshExchange})
			}); code != amqp.AccessRefused {
				t.Errorf("mallory declares %s exchange %q: code %d, want %d (access refused)", kind, name, code, amqp.AccessRefused)
			}
		}
		if name == own.Name {
			continue
		}
		if code := verdict(func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare(name, false, true, true, false, nil)
			return err
		}); code != amqp.AccessRefused {
			t.Errorf("mallory declares queue %q: code %d, want %d (access refused)", name, code, amqp.AccessRefused)
		}
	}
	// The one name mallory may configure besides server-named queues is
	// its claim queue's: an exchange of that name can be declared, but
	// neither bound into mesh nor published into.
	if code := verdict(func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare("node.mallory.claim", "fanout", false, true, false, false, nil)
	}); code != 0 {
		t.Errorf("mallory declares an exchange of its claim queue's name: code %d, want 0", code)
	}
	if code := verdict(func(ch *amqp.Channel) error {
		return ch.ExchangeBind(bridge.MeshExchange, "#", "node.mallory.claim", false, nil)
	}); code != amqp.AccessRefused {
		t.Errorf("mallory binds node.mallory.claim into mesh: code %d, want %d (access refused)", code, amqp.AccessRefused)
	}
	if code := verdict(func(ch *amqp.Channel) error {
		return ch.PublishWithContext(context.Background(), "node.mallory.claim", "dead.other", false, false, amqp.Publishing{Body: []byte("planted")})
	}); code != amqp.AccessRefused {
		t.Errorf("mallory publishes into node.mallory.claim: code %d, want %d (access refused)", code, amqp.AccessRefused)
	}
	// Straight onto mesh, its topic permissions decide.
	pub := func(key string) func(ch *amqp.Channel) error {
		return func(ch *amqp.Channel) error {
			return ch.PublishWithContext(context.Background(), bridge.MeshExchange, key, false, false, amqp.Publishing{Body: []byte("planted")})
		}
	}
	for _, key := range []string{"dead.other", "retry.other"} {
		if code := verdict(pub(key)); code != amqp.AccessRefused {
			t.Errorf("mallory publishes %s on mesh: code %d, want %d (access refused)", key, code, amqp.AccessRefused)
		}
	}
	if code := verdict(pub("dead.resize")); code != 0 {
		t.Errorf("mallory publishes its own stage's dead letter on mesh (control): code %d, want 0", code)
	}

	listener := natsConn(t, beta)
	got := make(chan string, 4)
	if _, err := listener.Subscribe("evt.own-exchange", func(m *nats.Msg) { got <- string(m.Data) }); err != nil {
		t.Fatal(err)
	}
	flush(t, listener)
	sender := natsConn(t, alpha)
	if !meshtest.Poll(20*time.Second, func() bool {
		_ = sender.Publish("evt.own-exchange", []byte("hello"))
		select {
		case <-got:
			return true
		case <-time.After(500 * time.Millisecond):
			return false
		}
	}) {
		t.Error("control: alpha's event never reached beta")
	}
}

// TestAdversaryCarbonCopies: trudy, a node with its own real credential
// and stage thumbs, publishes with a key its topic permissions allow and
// CC or BCC keys they refuse: RabbitMQ 3.10 routes those too, into
// dead.resize and retry.resize of a stage trudy was not given. beta, which
// serves resize, refuses the retry copy that comes back from retry.resize,
// and its dead-letter tools refuse the planted letter (listed as refused,
// never replayed). The controls: a command of resize that dies for real
// is replayed, and a command that fails once still comes back through
// its retry queue.
func TestAdversaryCarbonCopies(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	rmq, vhost, db, alpha, beta, _ := replayMesh(t)
	env := []string{"MESHBOX_DB=" + db, "MESHBOX_BROKER_ADMIN=" + rmq.AdminURL()}
	if code, out, errOut := cliEnv(t, env, "mesh", "node", "add", "trudy", "--stages", "thumbs"); code != 0 {
		t.Fatalf("mesh node add trudy: exit %d: %s%s", code, out, errOut)
	}
	t.Cleanup(func() { _, _, _ = cliEnv(t, env, "mesh", "node", "remove", "trudy", "--force") })
	trudyURL := brokerURLOf(t, context.Background(), db, vhost, "trudy")

	listener := natsConn(t, beta)
	calls := stageCalls(t, listener, "resize", func(m *nats.Msg) *nats.Msg {
		r := nats.NewMsg("")
		if string(m.Data) == "die" || (string(m.Data) == "retry-me" && m.Header.Get(hdrAttempt) == "1") {
			r.Header.Set("Nats-Service-Error", "not now")
			r.Header.Set("Nats-Service-Error-Code", "500")
		}
		return r
	})
	waitConsumers(t, rmq, vhost, "cmd.resize", 1)

	ch := meshtest.Channel(t, trudyURL)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 8))
	plant := func(key string, h amqp.Table, id, expiration string) {
		t.Helper()
		if err := ch.PublishWithContext(context.Background(), bridge.MeshExchange, key, false, false, amqp.Publishing{
			Type: "command", MessageId: id, Headers: h, Body: []byte("planted"), Expiration: expiration,
			UserId: "node.trudy.g1", DeliveryMode: amqp.Persistent}); err != nil {
			t.Fatal(err)
		}
		select {
		case c := <-confirms:
			if !c.Ack {
				t.Fatalf("the broker refused %s", id)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no confirm for %s", id)
		}
	}
	// Dead letters stay; retry copies expire into cmd.resize at once.
	plant("dead.thumbs", amqp.Table{"CC": []any{"dead.resize"}}, "cc-dead", "")
	plant("dead.thumbs", amqp.Table{"BCC": []any{"dead.resize"}}, "bcc-dead", "")
	plant("dead.thumbs", amqp.Table{"CC": []any{"retry.resize"}}, "cc-retry", "100")
	plant("dead.thumbs", amqp.Table{"BCC": []any{"retry.resize"}}, "bcc-retry", "100")
	// The attack ran: the broker put them where trudy may not publish.
	if st, err := ch.QueueDeclarePassive("dead.resize", true, false, false, false, nil); err != nil || st.Messages < 2 {
		t.Fatalf("dead.resize after the plants: %+v %v, want 2 messages (the attack did not run)", st, err)
	}

	// The controls: one command dies for real, one is retried.
	sender := natsConn(t, alpha)
	for _, body := range []string{"die", "retry-me"} {
		if o, resp, err := ledger.Submit(sender, "cmd.resize", []byte(body), 5*time.Second); o != ledger.Acked {
			t.Fatalf("alpha submits %s: %v %v %v", body, o, resp, err)
		}
	}
	onBeta := []string{"MESHBOX_SERVER=" + beta.NATSURL(), "MESHBOX_DATA=" + beta.DataDir()}
	if !meshtest.Poll(30*time.Second, func() bool {
		code, out, _ := cliEnv(t, onBeta, "dlq", "list", "resize", "--json")
		return code == 0 && strings.Count(out, `"stage": "resize"`) >= 3 && refusedCommands(t, beta) >= 2
	}) {
		_, out, errOut := cliEnv(t, onBeta, "dlq", "list", "resize", "--json")
		t.Fatalf("dead letters of resize: %s%s; beta refused %v retry copies, want the real one and both plants listed, 2 copies refused",
			out, errOut, refusedCommands(t, beta))
	}
	// The real one is replayed; the plants stay, named, and say why.
	code, out, errOut := cliEnv(t, onBeta, "dlq", "replay", "resize", "--all")
	if code == 0 || !strings.Contains(errOut, "2 dead letters cannot be replayed") ||
		!strings.Contains(errOut, "cc-dead: replayed message refused (misrouted)") || !strings.Contains(errOut, "bcc-dead: replayed message refused (misrouted)") {
		t.Errorf("dlq replay resize --all: exit %d: %s%s, want the plants refused by name as misrouted", code, out, errOut)
	}
	if n := replays(t, beta, "dead", "misrouted"); n < 2 {
		// Each listing refuses them again; two at the least.
		t.Errorf("beta's refused dead letters: %v, want both plants (misrouted)", n)
	}
	time.Sleep(time.Second) // real time: a refused copy that would come late
	got := map[string][]string{}
	for _, m := range calls() {
		got[string(m.Data)] = append(got[string(m.Data)], m.Header.Get(hdrAttempt))
	}
	if len(got["planted"]) > 0 {
		t.Errorf("beta's handler ran a planted command: attempts %v", got["planted"])
	}
	if r := strings.Join(got["retry-me"], " "); r != "1 2" {
		t.Errorf("retry-me at beta's handler: attempts %q, want \"1 2\"", r)
	}
	if !meshtest.Poll(10*time.Second, func() bool {
		n := 0
		for _, m := range calls() {
			if string(m.Data) == "die" {
				n++
			}
		}
		return n >= 3
	}) {
		t.Errorf("die at beta's handler: attempts %v, want its two and the replay's", got["die"])
	}
}

// refusedCommands is how many commands p refused as replays or misrouted.
func refusedCommands(t *testing.T, p *meshtest.Process) float64 {
	t.Helper()
	return replays(t, p, "command", "dead_lettered") + replays(t, p, "command", "misrouted")
}
