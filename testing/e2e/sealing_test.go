package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/testing/ledger"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
)

// The marker every message of the broker-operator test carries in its body
// and headers.
const operatorMarker = "front-door-code-1234"

// joinedNode adds node with `meshbox mesh node add`, allowed every stage
// (--stages *: the tests host stages on any node), joins it and runs it
// from its env file, with extra flags of `meshbox run` (--config, say).
func joinedNode(t *testing.T, db, brokerAdmin, node string, extra ...string) *meshtest.Process {
	t.Helper()
	p, _ := joinedNodeEnv(t, db, brokerAdmin, node, extra...)
	return p
}

// joinedNodeEnv is joinedNode that also returns the env file `meshbox
// join` wrote (which holds the node's own database login).
func joinedNodeEnv(t *testing.T, db, brokerAdmin, node string, extra ...string) (*meshtest.Process, string) {
	t.Helper()
	code, out, errOut := cliEnv(t, []string{"MESHBOX_DB=" + db, "MESHBOX_BROKER_ADMIN=" + brokerAdmin}, "mesh", "node", "add", node, "--stages", "*")
	if code != 0 {
		t.Fatalf("mesh node add %s: exit %d: %s%s", node, code, out, errOut)
	}
	t.Cleanup(func() {
		_, _, _ = cliEnv(t, []string{"MESHBOX_DB=" + db, "MESHBOX_BROKER_ADMIN=" + brokerAdmin}, "mesh", "node", "remove", node, "--force")
	})
	envFile := filepath.Join(t.TempDir(), node+".env")
	if code, out, errOut := cli(t, "join", joinToken(t, out), "--env-file", envFile); code != 0 {
		t.Fatalf("join %s: exit %d: %s%s", node, code, out, errOut)
	}
	p := meshtest.StartProcess(t, append([]string{"--env-file", envFile}, extra...)...)
	rememberDataDir(db, node, p.DataDir())
	return p, envFile
}

// waitSealing waits until the node seals with a content key and lacks none.
func waitSealing(t *testing.T, p *meshtest.Process) string {
	t.Helper()
	var last string
	if !meshtest.Poll(30*time.Second, func() bool {
		st := meshtest.Status(t, p.HTTPURL())
		if st.Keys == nil {
			last = "no keys in the status"
			return false
		}
		last = fmt.Sprintf("%+v", *st.Keys)
		return st.Keys.Sealing && st.Keys.Current != "" && len(st.Keys.Lacking) == 0
	}) {
		t.Fatalf("the node does not seal after 30s: keys %s\n%s", last, p.Output())
	}
	return last
}

// waitKeysInStep waits until the node's keys are in step with the mesh
// database: the writes of its first start (public key, content key) are
// done and applied.
func waitKeysInStep(t *testing.T, p *meshtest.Process) {
	t.Helper()
	if !meshtest.Poll(30*time.Second, func() bool {
		st := meshtest.Status(t, p.HTTPURL())
		return st.Keys != nil && st.Keys.InStep && st.Keys.Current != ""
	}) {
		t.Fatalf("the node's keys are not in step with the mesh database after 30s\n%s", p.Output())
	}
}

// TestBrokerOperatorReadsNothing runs two joined nodes (each with its own
// broker user, database role and key pair) and a broker operator: a raw
// AMQP client with the broker's admin credential that binds # on the mesh
// exchange and on its dead-letter exchange (every message of the mesh
// passes one of them) and, once the traffic is through, reads every queue
// of the vhost. Requests, replies, commands and events with a marker in
// bodies and headers cross the mesh; two commands fail with the marker in
// their handler's error text, one refused for good (422), one failing
// every attempt through the stage's retry queue. The programs see the
// marker, and so does the node's `meshbox dlq show` in the failures'
// reasons; the operator never does. A command with one byte flipped,
// republished, is refused with the reason, counted and logged.
func TestBrokerOperatorReadsNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	ctx := context.Background()
	rmq := meshtest.LeaseRabbitMQ(t)
	// beta retries stage vault once, after a short wait in its retry queue.
	config := bridgeConfigFile(t, "beta", bridgeConfig{Retry: map[string]map[string]any{"vault": {"attempts": 2, "backoff": "300ms"}}})
	vhost, db, alpha, beta := sealedMeshOn(t, rmq, "--config", config)

	// The operator: the broker's admin credential, every key of mesh.
	op := meshtest.Dial(t, vhost)
	och, err := op.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := och.QueueDeclare("operator-tap", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, ex := range []string{"mesh", "mesh.dlx"} {
		if err := och.QueueBind(q.Name, "#", ex, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	tap, err := och.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}

	// beta's program hosts vault.open, the stage vault, and listens to
	// door events.
	prog := natsConn(t, beta)
	if _, err := prog.Subscribe("cap.vault-open", func(m *nats.Msg) {
		r := nats.NewMsg(m.Reply)
		r.Data = append([]byte("opened:"), m.Data...)
		r.Header.Set("X-Answer", m.Header.Get("X-Secret"))
		_ = m.RespondMsg(r)
	}); err != nil {
		t.Fatal(err)
	}
	handled := make(chan *nats.Msg, 16)
	if _, err := prog.QueueSubscribe("work.vault", "h", func(m *nats.Msg) {
		if m.Header.Get("X-Refuse") != "" { // a permanent failure: dead-lettered at once
			r := nats.NewMsg(m.Reply)
			r.Header.Set(hdrServiceCode, "422")
			r.Header.Set(hdrServiceError, "refused by the handler: "+operatorMarker)
			_ = m.RespondMsg(r)
			return
		}
		if m.Header.Get("X-Fail") != "" { // fails every attempt: a retry copy, then a dead letter
			r := nats.NewMsg(m.Reply)
			r.Header.Set(hdrServiceCode, "500")
			r.Header.Set(hdrServiceError, "failed in the handler: "+operatorMarker)
			_ = m.RespondMsg(r)
			return
		}
		handled <- m
		_ = m.Respond(nil)
	}); err != nil {
		t.Fatal(err)
	}
	events := make(chan *nats.Msg, 16)
	if _, err := prog.Subscribe("evt.door", func(m *nats.Msg) { events <- m }); err != nil {
		t.Fatal(err)
	}
	flush(t, prog)
	waitListening(t, beta, "evt.door", alpha)
	waitRoute(t, alpha.HTTPURL(), "vault-open", "beta")
	caller := natsConn(t, alpha)
	secret := nats.Header{"X-Secret": {operatorMarker}, "Content-Type": {"text/" + operatorMarker}}
	waitCallable(t, caller, "cap.vault-open", secret, func(m *nats.Msg) bool { c, _ := natstest.ServiceError(m); return c == 0 })
	resp, err := caller.RequestMsg(&nats.Msg{Subject: "cap.vault-open", Header: secret, Data: []byte(operatorMarker)}, 5*time.Second)
	if err != nil || string(resp.Data) != "opened:"+operatorMarker || resp.Header.Get("X-Answer") != operatorMarker {
		t.Fatalf("request: got %v %v, want the marker through", resp, err)
	}
	var last string
	if !meshtest.Poll(30*time.Second, func() bool { // the stage's queue exists once beta consumes it
		o, resp, err := ledger.SubmitMsg(caller, &nats.Msg{Subject: "cmd.vault", Header: secret, Data: []byte(operatorMarker)}, 5*time.Second)
		last = fmt.Sprintf("%v %v %v", o, resp, err)
		return o == ledger.Acked
	}) {
		t.Fatalf("the command was not accepted: %s", last)
	}
	select {
	case m := <-handled:
		if string(m.Data) != operatorMarker || m.Header.Get("X-Secret") != operatorMarker {
			t.Fatalf("command at the handler: got %q %v, want the marker", m.Data, m.Header)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the command never reached beta's handler")
	}
	refuse := nats.Header{"X-Secret": {operatorMarker}, "X-Refuse": {"yes"}, hdrMsgID: {"refused-1"}}
	if o, resp, err := ledger.SubmitMsg(caller, &nats.Msg{Subject: "cmd.vault", Header: refuse, Data: []byte(operatorMarker)}, 5*time.Second); o != ledger.Acked {
		t.Fatalf("the command to be refused was not accepted: %v %v %v", o, resp, err)
	}
	fail := nats.Header{"X-Secret": {operatorMarker}, "X-Fail": {"yes"}, hdrMsgID: {"failed-1"}}
	if o, resp, err := ledger.SubmitMsg(caller, &nats.Msg{Subject: "cmd.vault", Header: fail, Data: []byte(operatorMarker)}, 5*time.Second); o != ledger.Acked {
		t.Fatalf("the command to fail was not accepted: %v %v %v", o, resp, err)
	}
	if err := caller.PublishMsg(&nats.Msg{Subject: "evt.door", Header: secret, Data: []byte(operatorMarker)}); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-events:
		if string(m.Data) != operatorMarker || m.Header.Get("X-Secret") != operatorMarker {
			t.Fatalf("event at beta: got %q %v, want the marker", m.Data, m.Header)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the event never reached beta")
	}

	// The node reads the handler's words in its dead letters' reasons.
	creds := []string{"--server", beta.NATSURL(), "--creds", filepath.Join(beta.DataDir(), programs.AdminFile)}
	var list struct{ Letters []struct{ ID, Reason string } }
	if !meshtest.Poll(20*time.Second, func() bool {
		code, out, _ := cli(t, append([]string{"dlq", "list", "vault", "--json"}, creds...)...)
		return code == 0 && json.Unmarshal([]byte(out), &list) == nil && len(list.Letters) == 2
	}) {
		t.Fatalf("beta's dlq list does not show the two failed commands: %+v\n%s", list, beta.Output())
	}
	for _, l := range list.Letters {
		if !strings.Contains(l.Reason, operatorMarker) {
			t.Errorf("dlq list: reason of %s is %q, want the handler's words", l.ID, l.Reason)
		}
	}
	for id, want := range map[string]string{"refused-1": "refused by the handler: " + operatorMarker,
		"failed-1": "failed in the handler: " + operatorMarker} {
		code, out, errOut := cli(t, append([]string{"dlq", "show", "vault", id}, creds...)...)
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("dlq show %s: exit %d, want the reason with %q\n%s%s", id, code, want, out, errOut)
		}
	}

	// Everything the operator read: no marker anywhere.
	readsMarker := func(where string, d amqp.Delivery) {
		t.Helper()
		all := fmt.Sprintf("%v|%s|%s|%s|%s|%s|%s|%s", d.Headers, d.ContentType, d.ContentEncoding, d.MessageId,
			d.CorrelationId, d.ReplyTo, d.RoutingKey, d.Body)
		if strings.Contains(all, operatorMarker) || bytes.Contains(d.Body, []byte(operatorMarker)) {
			t.Errorf("the operator reads the marker in a %s on %s (%s)", d.Type, d.RoutingKey, where)
		}
	}
	seen := map[string]int{}
	var cmd amqp.Delivery
	drain := time.After(3 * time.Second)
	for done := false; !done; {
		select {
		case d := <-tap:
			kind := d.Type
			switch {
			case strings.HasPrefix(d.RoutingKey, "dead."):
				kind = "dead letter"
			case strings.HasPrefix(d.RoutingKey, "retry."):
				kind = "retry copy"
			}
			seen[kind]++
			readsMarker("bound to #", d)
			if d.Type == "command" && d.RoutingKey == "cmd.vault" && cmd.Type == "" {
				cmd = d
			}
		case <-drain:
			done = true
		}
	}
	for _, kind := range []string{"request", "reply", "command", "event", "dead letter", "retry copy"} {
		if seen[kind] == 0 {
			t.Errorf("the operator saw no %s (saw %v): the test proves nothing for it", kind, seen)
		}
	}
	if cmd.Type == "" {
		t.Fatal("no command to tamper with")
	}
	// Every queue of the vhost, read without taking anything (what is
	// read goes back when the channel closes); exclusive queues of the
	// nodes refuse the operator.
	queues, read := operatorReadsQueues(t, rmq, vhost, op, readsMarker)
	t.Logf("the operator saw %v bound to #, and read %v in the %d queues of the vhost", seen, read, len(queues))
	if read["dead.vault"] == 0 {
		t.Errorf("the operator read no dead letter in dead.vault (read %v of %v): the sweep proves nothing", read, queues)
	}

	// One byte flipped, republished with alpha's own broker user (as an
	// operator who can publish as a node would): refused with the reason,
	// counted and logged; the handler never sees it.
	alphaURL := brokerURLOf(t, ctx, db, vhost, "alpha")
	ach := meshtest.Channel(t, alphaURL)
	body := bytes.Clone(cmd.Body)
	body[len(body)/2] ^= 0x01
	if err := ach.PublishWithContext(ctx, "mesh", "cmd.vault", false, false, amqp.Publishing{
		Headers: cmd.Headers, MessageId: "tampered-1", Type: "command", UserId: cmd.UserId,
		DeliveryMode: amqp.Persistent, Timestamp: cmd.Timestamp, Body: body,
	}); err != nil {
		t.Fatal(err)
	}
	var dead amqp.Delivery
	if !meshtest.Poll(20*time.Second, func() bool {
		d, ok, err := och.Get("dead.vault", true) // the stage's dead letters
		if err != nil {
			t.Fatal(err)
		}
		if ok && d.MessageId == "tampered-1" {
			dead = d
			return true
		}
		return false
	}) {
		t.Fatalf("the tampered command was not dead-lettered\n%s", beta.Output())
	}
	if r, _ := dead.Headers["Meshbox-Dead-Reason"].(string); !strings.Contains(r, "sealed message refused (tampered)") {
		t.Errorf("dead letter reason %q, want it to say the seal did not open (tampered)", r)
	}
	if bytes.Contains(dead.Body, []byte(operatorMarker)) {
		t.Error("the dead letter holds the marker")
	}
	if v, _ := scrape(t, beta.HTTPURL()).value("meshbox_unseal_failures_total", "shape=command", "reason=tampered"); v != 1 {
		t.Errorf("beta's meshbox_unseal_failures_total{shape=command,reason=tampered}: %v, want 1", v)
	}
	if !strings.Contains(beta.Output(), "sealed message refused") || !strings.Contains(beta.Output(), "reason=tampered") {
		t.Errorf("beta did not log the refusal:\n%s", beta.Output())
	}
	select {
	case m := <-handled:
		t.Errorf("the handler got the tampered command: %q", m.Data)
	default:
	}
}

// brokerURLOf is node's broker URL on vhost with its credential, read as
// the node reads it (nodeCredential).
func brokerURLOf(t *testing.T, ctx context.Context, db, vhost, node string) string {
	t.Helper()
	user, pw := nodeCredential(t, ctx, db, node)
	return withCredential(t, vhost, user, pw)
}

// TestKeyRotationUnderTraffic rotates the mesh's content key while alpha
// submits commands to a stage beta handles: every command is handled, the
// nodes switch to the new key once both hold it, and the old key retires.
func TestKeyRotationUnderTraffic(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	ctx := context.Background()
	_, db, alpha, beta := sealedMesh(t)

	prog := natsConn(t, beta)
	var mu sync.Mutex
	handled := map[string]bool{}
	if _, err := prog.QueueSubscribe("work.ledger", "h", func(m *nats.Msg) {
		mu.Lock()
		handled[string(m.Data)] = true
		mu.Unlock()
		_ = m.Respond(nil)
	}); err != nil {
		t.Fatal(err)
	}
	flush(t, prog)
	caller := natsConn(t, alpha)
	if !meshtest.Poll(30*time.Second, func() bool {
		o, _, _ := ledger.Submit(caller, "cmd.ledger", []byte("probe"), 5*time.Second)
		return o == ledger.Acked
	}) {
		t.Fatal("the stage never accepted a command")
	}

	// Traffic: one command every 20ms until stopped.
	stop, sentc := ledgerTraffic(t, caller)

	old := currentKey(t, alpha)
	mdb, err := meshdb.Open(ctx, db, meshdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mdb.Close()
	const retention = 8 * time.Second
	newID, _, err := mdb.RotateKey(ctx, retention)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*meshtest.Process{alpha, beta} {
		if !meshtest.Poll(30*time.Second, func() bool { return currentKey(t, p) == newID }) {
			t.Fatalf("a node still seals with %s, want %s", currentKey(t, p), newID)
		}
	}
	for _, p := range []*meshtest.Process{alpha, beta} {
		if !meshtest.Poll(retention+20*time.Second, func() bool {
			st := meshtest.Status(t, p.HTTPURL())
			return st.Keys != nil && !slices.Contains(st.Keys.Held, old) && slices.Contains(st.Keys.Held, newID)
		}) {
			t.Fatalf("the old key %s is not retired", old)
		}
	}
	close(stop)
	sent := <-sentc
	if len(sent) < 50 {
		t.Fatalf("only %d commands sent during the rotation", len(sent))
	}
	waitAllHandled(t, 30*time.Second, "in the rotation", sent, &mu, handled)
	if mf, ok := scrape(t, beta.HTTPURL())["meshbox_unseal_failures_total"]; ok {
		for _, m := range mf.GetMetric() {
			if v := m.GetCounter().GetValue(); v != 0 {
				t.Errorf("beta refused %v sealed messages (%v) during the rotation, want none", v, m.GetLabel())
			}
		}
	}
}

// currentKey is the content key the node seals with now.
func currentKey(t *testing.T, p *meshtest.Process) string {
	t.Helper()
	st := meshtest.Status(t, p.HTTPURL())
	if st.Keys == nil {
		return ""
	}
	return st.Keys.Current
}

// waitAllHandled waits until every command in sent is in handled (guarded
// by mu), and fails the test naming the lost ones when some never are.
func waitAllHandled(t *testing.T, d time.Duration, during string, sent []string, mu *sync.Mutex, handled map[string]bool) {
	t.Helper()
	missing := func() []string {
		mu.Lock()
		defer mu.Unlock()
		var lost []string
		for _, s := range sent {
			if !handled[s] {
				lost = append(lost, s)
			}
		}
		return lost
	}
	if !meshtest.Poll(d, func() bool { return len(missing()) == 0 }) {
		lost := missing()
		t.Fatalf("%d of %d commands lost %s: %v", len(lost), len(sent), during, lost)
	}
}

// sealedMesh makes a mesh (init as "console") and joins alpha and beta
// with their own credentials, returning once both seal what they send.
func sealedMesh(t *testing.T) (vhost, db string, alpha, beta *meshtest.Process) {
	t.Helper()
	return sealedMeshOn(t, meshtest.LeaseRabbitMQ(t))
}

// sealedMeshOn is sealedMesh on the broker rmq; betaExtra are extra flags
// of beta's `meshbox run`.
func sealedMeshOn(t *testing.T, rmq *meshtest.Rabbit, betaExtra ...string) (vhost, db string, alpha, beta *meshtest.Process) {
	t.Helper()
	vhost = rmq.Vhost(t)
	db = meshtest.Postgres(t).Database(t)
	if code, _, errOut := cli(t, "init", "--db", db, "--node", "console", "--broker", meshtest.NoCredential(vhost)); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	alpha = joinedNode(t, db, rmq.AdminURL(), "alpha")
	beta = joinedNode(t, db, rmq.AdminURL(), "beta", betaExtra...)
	waitSealing(t, alpha)
	waitSealing(t, beta)
	return vhost, db, alpha, beta
}

// ledgerTraffic submits a command "entry-N" to stage ledger through caller
// every 20ms until stop is closed, then sends the bodies it got accepted on
// sentc.
func ledgerTraffic(t *testing.T, caller *nats.Conn) (stop chan struct{}, sentc chan []string) {
	stop = make(chan struct{})
	sentc = make(chan []string, 1)
	go func() { // exits when stop is closed
		var sent []string
		defer func() { sentc <- sent }()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			body := fmt.Sprintf("entry-%d", i)
			if o, resp, err := ledger.Submit(caller, "cmd.ledger", []byte(body), 5*time.Second); o != ledger.Acked {
				t.Errorf("submit %s during rotation: %v %v %v", body, o, resp, err)
				continue
			}
			sent = append(sent, body)
		}
	}()
	return stop, sentc
}

// operatorReadsQueues lists every queue of vhost through the management
// API and reads every message in each with basic.get on conn, without
// acking (the messages go back when each queue's channel closes), passing
// each to check. It returns the queues and how many messages it read in
// each; a queue the operator may not read (another connection's exclusive
// queue) is skipped.
func operatorReadsQueues(t *testing.T, rmq *meshtest.Rabbit, amqpURL string, conn *amqp.Connection, check func(string, amqp.Delivery)) ([]string, map[string]int) {
	t.Helper()
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	vhost := strings.TrimPrefix(u.Path, "/")
	req, _ := http.NewRequest(http.MethodGet, rmq.ManagementURL()+"/api/queues/"+url.PathEscape(vhost)+"?columns=name", nil)
	req.SetBasicAuth("guest", "guest")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var qs []struct {
		Name string `json:"name"`
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("list queues: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&qs); err != nil {
		t.Fatal(err)
	}
	var names []string
	read := map[string]int{}
	for _, q := range qs {
		names = append(names, q.Name)
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		for {
			d, ok, err := ch.Get(q.Name, false)
			if err != nil || !ok {
				break // err: exclusive to a node's connection; the channel is closed
			}
			read[q.Name]++
			check("in queue "+q.Name, d)
		}
		_ = ch.Close()
	}
	return names, read
}
