package e2e

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/blobs"
	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// TestLocalAdversary runs a two-node mesh on the real broker and database
// and lets a program on node alpha, whose credential allows it to host and
// call "lamp" and publish "door.opened", try everything else: it cannot
// subscribe to work.> or _INBOX.>, cannot answer $MESH.status, cannot host
// a capability or serve a stage it was not given, and the Meshbox-Origin it
// forges is ignored. A client without a credential is refused.
func TestLocalAdversary(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, RabbitMQ and two nodes")
	}
	t.Parallel()
	alpha, beta, _ := twoNodeMesh(t)

	// No credential: refused.
	if nc, err := nats.Connect(alpha.NATSURL(), nats.NoReconnect()); !errors.Is(err, nats.ErrAuthorization) {
		if nc != nil {
			nc.Close()
		}
		t.Fatalf("anonymous connection to a mesh node: got %v, want an authorization violation", err)
	}

	narrow := programs.Program{Name: "narrow", Host: []string{"lamp"}, Call: []string{"lamp"}, Publish: []string{"door.opened"}}
	creds := meshtest.AddProgram(t, alpha.NATSURL(), alpha.DataDir(), narrow)
	violations := make(chan error, 32)
	prog := meshtest.ProgramConn(t, alpha.NATSURL(), creds, narrow, nats.NoReconnect(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case violations <- err:
			default:
			}
		}))
	refused := func(subject string) {
		t.Helper()
		select {
		case err := <-violations:
			if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), `"`+subject+`"`) {
				t.Fatalf("got %v, want the permissions violation for %s", err, subject)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no permissions violation within 10s", subject)
		}
	}

	// What it was given works: it hosts lamp, the mesh sees it, a caller
	// on beta reaches it, and it calls lamp itself through its own inbox.
	if _, err := prog.Subscribe("cap.lamp", func(m *nats.Msg) { _ = m.Respond([]byte("on")) }); err != nil {
		t.Fatal(err)
	}
	if err := prog.Flush(); err != nil {
		t.Fatal(err)
	}
	meshtest.WaitStatus(t, beta.HTTPURL(), 20*time.Second, "lamp on alpha seen from beta", func(v appliance.Status) bool {
		return slices.Contains(v.Capabilities.Remote["lamp"], "alpha")
	})
	onBeta := beta.Connect(t)
	if r, err := onBeta.Request("cap.lamp", nil, 10*time.Second); err != nil || string(r.Data) != "on" {
		t.Fatalf("call lamp from beta: got %v %v, want on", r, err)
	}
	if r, err := prog.Request("cap.lamp", nil, 10*time.Second); err != nil || string(r.Data) != "on" {
		t.Fatalf("the program calls lamp: got %v %v, want on", r, err)
	}

	// What it was not given is refused by alpha's NATS server.
	for _, subj := range []string{"work.>", "_INBOX.>", appliance.SubjectStatus, "$MESH.>", "cap.safe", "work.chores", "cap.>"} {
		if _, err := prog.Subscribe(subj, func(m *nats.Msg) { _ = m.Respond([]byte(`{"node":"forged"}`)) }); err != nil {
			t.Fatal(err)
		}
		refused(subj)
	}
	if _, err := prog.QueueSubscribe("work.chores", "handlers", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	refused("work.chores")
	// (A host may publish on inboxes, where it answers its callers; see
	// TestLocalConfusedDeputy.)
	for _, subj := range []string{"cmd.chores", "evt.alarm.off", appliance.SubjectReloadPrograms} {
		if err := prog.Publish(subj, nil); err != nil {
			t.Fatal(err)
		}
		refused(subj)
	}
	// The node's status still comes from the node, and the mesh never
	// hears of the capability it tried to host.
	onAlpha := alpha.Connect(t)
	for range 3 {
		r, err := onAlpha.Request(appliance.SubjectStatus, nil, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var st appliance.Status
		if err := json.Unmarshal(r.Data, &st); err != nil || st.Node != "alpha" {
			t.Fatalf("status answer %q (%v): want alpha's own", r.Data, err)
		}
	}
	if v := meshtest.Status(t, beta.HTTPURL()); len(v.Capabilities.Remote["safe"]) > 0 || len(v.Capabilities.Remote["chores"]) > 0 {
		t.Errorf("beta sees capabilities the program was refused: %v", v.Capabilities.Remote)
	}

	// A forged origin is ignored: the event reaches beta from alpha.
	events, err := onBeta.SubscribeSync("evt.door.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := onBeta.Flush(); err != nil {
		t.Fatal(err)
	}
	waitListening(t, beta, "evt.door.>", alpha)
	forged := &nats.Msg{Subject: "evt.door.opened", Data: []byte("front"),
		Header: nats.Header{codec.HeaderOrigin: {"beta"}, codec.HeaderRedelivered: {"true"}}}
	if err := prog.PublishMsg(forged); err != nil {
		t.Fatal(err)
	}
	m, err := events.NextMsg(15 * time.Second)
	if err != nil {
		t.Fatalf("the program's event did not reach beta: %v", err)
	}
	if o := m.Header.Get(codec.HeaderOrigin); o != "alpha" || string(m.Data) != "front" {
		t.Errorf("event on beta: origin %q data %q, want origin alpha (the forged beta ignored) and front", o, m.Data)
	}
	if m.Header.Get(codec.HeaderRedelivered) != "" {
		t.Errorf("event on beta carries the program's Meshbox-Redelivered: %v", m.Header)
	}

	// Removed, the program is cut off, and its key no longer gets in.
	key, err := programs.LoadKey(creds)
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	prog.SetClosedHandler(func(*nats.Conn) { close(closed) })
	if code, out, errOut := cli(t, "program", "remove", "narrow", "--data", alpha.DataDir(), "--server", alpha.NATSURL()); code != 0 {
		t.Fatalf("program remove: exit %d: %s %s", code, out, errOut)
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("a removed program stays connected")
	}
	if nc, err := nats.Connect(alpha.NATSURL(), nats.NoReconnect(), nats.Nkey(key.Public(), key.Sign)); !errors.Is(err, nats.ErrAuthorization) {
		if nc != nil {
			nc.Close()
		}
		t.Errorf("a removed program's key: got %v, want an authorization violation", err)
	}
}

// TestLocalConfusedDeputy lets programs on alpha try to make the node (or
// a host) publish for them where they may not publish themselves: a
// program allowed only to call echo gives its calls reply subjects of its
// choosing (the JetStream API, an event topic, another program's inbox,
// the node's own subjects), a program that hosts and calls a capability
// answers its own call at such a subject, and a program that may submit
// to stage s3 names a result topic it may not publish. Each is refused
// and counted under forbidden; the controls (own inbox, a result topic
// every submitter of the stage may publish) work.
func TestLocalConfusedDeputy(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, RabbitMQ and two nodes")
	}
	t.Parallel()
	alpha, beta, _ := twoNodeMesh(t)
	onAlpha, onBeta := alpha.Connect(t), beta.Connect(t)

	// echo reflects its input: hosted on beta (a remote call through
	// alpha's bridge) and, as lecho, on alpha (node.alpha.cap.lecho).
	for nc, subj := range map[*nats.Conn]string{onBeta: "cap.echo", onAlpha: "cap.lecho"} {
		if _, err := nc.Subscribe(subj, func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	meshtest.WaitStatus(t, alpha.HTTPURL(), 20*time.Second, "echo on beta seen from alpha", func(v appliance.Status) bool {
		return slices.Contains(v.Capabilities.Remote["echo"], "beta")
	})

	caller := programs.Program{Name: "caller", Call: []string{"echo", "lecho"}}
	victim := programs.Program{Name: "victim", Subscribe: []string{"alarm.off"}}
	selfie := programs.Program{Name: "selfie", Host: []string{"mirror"}, Call: []string{"mirror"}}
	submitter := programs.Program{Name: "submitter", Submit: []string{"s3"}, Publish: []string{"s3.done"}}
	blobby := programs.Program{Name: "blobby", Blobs: true}
	conns := map[string]*nats.Conn{}
	for _, p := range []programs.Program{caller, victim, selfie, submitter, blobby} {
		creds := meshtest.AddProgram(t, alpha.NATSURL(), alpha.DataDir(), p)
		conns[p.Name] = meshtest.ProgramConn(t, alpha.NATSURL(), creds, p, nats.NoReconnect(),
			nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	}

	// Everything that lands where the attacks aim is counted.
	landed := make(chan string, 64)
	count := func(m *nats.Msg) { landed <- m.Subject + " " + string(m.Data) }
	if _, err := conns["victim"].Subscribe("evt.alarm.off", count); err != nil {
		t.Fatal(err)
	}
	if _, err := conns["victim"].Subscribe("_INBOX.victim.>", count); err != nil {
		t.Fatal(err)
	}
	if _, err := onAlpha.Subscribe("$MESH.stolen", count); err != nil {
		t.Fatal(err)
	}
	// Beta hears what alpha's bridge would carry to the mesh.
	if _, err := onBeta.Subscribe("evt.alarm.off", func(m *nats.Msg) { landed <- "on beta: " + m.Subject + " " + string(m.Data) }); err != nil {
		t.Fatal(err)
	}
	for _, nc := range []*nats.Conn{conns["victim"], onAlpha, onBeta} {
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	waitListening(t, beta, "evt.alarm.off", alpha)
	// JetStream runs on alpha (its blob store), so a stream made through
	// the API would exist.
	if _, err := onAlpha.Request("$JS.API.INFO", nil, 5*time.Second); err != nil {
		t.Fatalf("alpha's JetStream API: %v", err)
	}
	forbidden := func() float64 {
		v, _ := scrape(t, alpha.HTTPURL()).value("meshbox_errors_total", "kind=forbidden")
		return v
	}
	before := forbidden()

	// Control: the caller's own inbox gets its answers, remote and local.
	for _, subj := range []string{"cap.echo", "node.beta.cap.echo", "node.alpha.cap.lecho"} {
		if r, err := conns["caller"].Request(subj, []byte("hello"), 10*time.Second); err != nil || string(r.Data) != "hello" {
			t.Fatalf("control: %s from the caller's inbox: got %v %v, want hello", subj, r, err)
		}
	}

	// 1. The node as the caller's deputy.
	capture := `{"name":"CAPTURE","subjects":["work.>"],"storage":"memory"}`
	attacks := []struct{ subj, reply, data string }{
		{"cap.echo", "$JS.API.STREAM.CREATE.CAPTURE", capture},
		{"node.beta.cap.echo", "evt.alarm.off", "from beta"},
		{"node.alpha.cap.lecho", "evt.alarm.off", "from alpha"},
		{"cap.echo", "_INBOX.victim.x", "into the victim's inbox"},
		{"cap.echo", "$MESH.stolen", "the node's own subject"},
		{"node.nosuch.cap.echo", "evt.alarm.off", "an error text"},
	}
	for _, a := range attacks {
		if err := conns["caller"].PublishRequest(a.subj, a.reply, []byte(a.data)); err != nil {
			t.Fatal(err)
		}
	}
	// 2. A host answering its own call at a subject it may not publish.
	if _, err := conns["selfie"].Subscribe("cap.mirror", func(m *nats.Msg) { _ = m.Respond([]byte("mirrored")) }); err != nil {
		t.Fatal(err)
	}
	if err := conns["selfie"].PublishRequest("cap.mirror", "evt.alarm.off", nil); err != nil {
		t.Fatal(err)
	}
	// Control: the host still answers its callers (here itself) on
	// their inbox.
	if r, err := conns["selfie"].Request("cap.mirror", nil, 10*time.Second); err != nil || string(r.Data) != "mirrored" {
		t.Fatalf("control: the host answers on its caller's inbox: got %v %v", r, err)
	}

	// 4. JetStream as the deputy: a program allowed the blob store stores
	// bytes and asks JetStream for them with a reply subject of its
	// choosing (the server checks no reply subject): the answer lands
	// there, published by the server. The bridge must not carry it to the
	// mesh as alpha's event, nor the node act on it.
	b := conns["blobby"]
	if _, err := b.Request(blobs.SubjectOpen, nil, 10*time.Second); err != nil {
		t.Fatalf("blobby opens the blob store: %v", err)
	}
	if err := b.Publish("$O."+blobs.Bucket+".C.evil", []byte("stored by blobby")); err != nil {
		t.Fatal(err)
	}
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	get := []byte(`{"last_by_subj":"$O.` + blobs.Bucket + `.C.evil"}`)
	for _, reply := range []string{"evt.alarm.off", appliance.SubjectReloadPrograms} {
		if err := b.PublishRequest("$JS.API.DIRECT.GET."+blobs.StreamName, reply, get); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.PublishRequest("$JS.API.STREAM.MSG.GET."+blobs.StreamName, "evt.alarm.off", get); err != nil {
		t.Fatal(err)
	}
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	// The server itself delivers the answers to alpha's local subscribers
	// of evt.alarm.off (the victim): that is the NATS server's, and not
	// the node's, doing; drain those two, and only those.
	for range 2 {
		select {
		case got := <-landed:
			if !strings.HasPrefix(got, "evt.alarm.off ") {
				t.Errorf("an attack landed: %s", got)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("JetStream's answers did not reach the victim on alpha: the attack did not run")
		}
	}

	// 3. A result topic the submitter may not publish: 403, not accepted.
	sub := &nats.Msg{Subject: "cmd.s3", Data: []byte("job"), Header: nats.Header{codec.HeaderResultTopic: {"alarm.off"}}}
	r, err := conns["submitter"].RequestMsg(sub, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code := r.Header.Get("Nats-Service-Error-Code"); code != "403" || r.Header.Get(codec.HeaderAccepted) != "" {
		t.Errorf("result topic alarm.off from a program that may not publish it: got code %q accepted %q (%v), want 403 and not accepted",
			code, r.Header.Get(codec.HeaderAccepted), r.Header)
	}
	// Control: a result topic every submitter of s3 may publish; its
	// handler (on alpha) answers and the result is published there.
	results, err := onAlpha.SubscribeSync("evt.s3.done")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := onAlpha.Subscribe("work.s3", func(m *nats.Msg) { _ = m.Respond([]byte("result")) }); err != nil {
		t.Fatal(err)
	}
	if err := onAlpha.Flush(); err != nil {
		t.Fatal(err)
	}
	sub.Header.Set(codec.HeaderResultTopic, "s3.done")
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		r, err := conns["submitter"].RequestMsg(sub, 10*time.Second)
		if err == nil && r.Header.Get(codec.HeaderAccepted) != "" {
			break
		}
		if time.Now().After(end) { // the stage's queue is declared once alpha sees its handler
			t.Fatalf("control: result topic s3.done: got %v %v, want the command accepted", r, err)
		}
	}
	if m, err := results.NextMsg(15 * time.Second); err != nil || string(m.Data) != "result" {
		t.Errorf("control: the result on evt.s3.done: got %v %v", m, err)
	}

	// Nothing landed, JetStream has no new stream, and each refusal the
	// node made is counted (the host's own publish is the server's
	// refusal, not the node's).
	deadline := time.After(3 * time.Second)
	for done := false; !done; {
		select {
		case got := <-landed:
			t.Errorf("an attack landed: %s", got)
		case <-deadline:
			done = true
		}
	}
	if r, err := onAlpha.Request("$JS.API.STREAM.INFO.CAPTURE", nil, 5*time.Second); err != nil || !strings.Contains(string(r.Data), "not found") {
		t.Errorf("stream CAPTURE: got %s %v, want not found", r.Data, err)
	}
	// The node did not act on JetStream's answer on its own subject: it
	// said so once.
	if n := logLines(alpha.Output(), "the node acts only on requests with an inbox", "subject="+appliance.SubjectReloadPrograms); n != 1 {
		t.Errorf("alpha logged the refused %s %d times, want once", appliance.SubjectReloadPrograms, n)
	}
	if got, want := forbidden()-before, float64(len(attacks)+1+2); got != want { // + the two JetStream answers on evt.alarm.off
		t.Errorf("meshbox_errors_total{kind=forbidden} grew by %v, want %v", got, want)
	}
}

// TestLocalMicroService runs a NATS micro service (nats.go's micro
// package) under a program credential with --host lamp --service lamps:
// it serves cap.lamp and answers the discovery requests $SRV.PING, INFO
// and STATS, for all services, for its name and for its id, and the node
// logs no permissions violation. The control: a program that hosts lamp
// without the service right cannot subscribe to any of those subjects,
// and the service program cannot answer for another service's name.
func TestLocalMicroService(t *testing.T) {
	t.Parallel()
	p := meshtest.StartProcess(t, "--node", "solo")
	prog := programs.Program{Name: "lamp-svc", Host: []string{"lamp"}, Service: []string{"lamps"}}
	creds := meshtest.AddProgram(t, p.NATSURL(), p.DataDir(), prog)
	violations := make(chan error, 32)
	onViolation := nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case violations <- err:
		default:
		}
	})
	nc := meshtest.ProgramConn(t, p.NATSURL(), creds, prog, nats.NoReconnect(), onViolation)
	svc, err := micro.AddService(nc, micro.Config{
		Name: "lamps", Version: "1.0.0", Description: "the lamp",
		Endpoint: &micro.EndpointConfig{Subject: "cap.lamp", Handler: micro.HandlerFunc(func(r micro.Request) { _ = r.Respond([]byte("on")) })},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	id := svc.Info().ID

	admin := p.Connect(t)
	if r, err := admin.Request("cap.lamp", nil, 5*time.Second); err != nil || string(r.Data) != "on" {
		t.Fatalf("call lamp: got %v %v, want on", r, err)
	}
	for _, verb := range []string{"PING", "INFO", "STATS"} {
		for _, subj := range []string{"$SRV." + verb, "$SRV." + verb + ".lamps", "$SRV." + verb + ".lamps." + id} {
			r, err := admin.Request(subj, nil, 5*time.Second)
			if err != nil {
				t.Errorf("%s: %v, want the service's answer", subj, err)
				continue
			}
			var got micro.ServiceIdentity
			if err := json.Unmarshal(r.Data, &got); err != nil || got.Name != "lamps" || got.ID != id {
				t.Errorf("%s: got %q (%v), want lamps %s", subj, r.Data, err, id)
			}
		}
	}
	select {
	case err := <-violations:
		t.Errorf("the micro service got %v, want no permissions violation", err)
	default:
	}

	// Another service's name: not this program's to answer.
	refused := func(errs chan error, subject string) {
		t.Helper()
		select {
		case err := <-errs:
			if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), `"`+subject+`"`) {
				t.Fatalf("got %v, want the permissions violation for %s", err, subject)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no permissions violation within 10s", subject)
		}
	}
	for _, subj := range []string{"$SRV.PING.billing", "$SRV.INFO.billing.x", "$SRV.>"} {
		if _, err := nc.Subscribe(subj, func(*nats.Msg) {}); err != nil {
			t.Fatal(err)
		}
		refused(violations, subj)
	}

	// Hosting lamp without the service right: no $SRV subject at all.
	plain := programs.Program{Name: "lamp-plain", Host: []string{"lamp"}}
	plainViolations := make(chan error, 32)
	pc := meshtest.ProgramConn(t, p.NATSURL(), meshtest.AddProgram(t, p.NATSURL(), p.DataDir(), plain), plain, nats.NoReconnect(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case plainViolations <- err:
			default:
			}
		}))
	for _, subj := range []string{"$SRV.PING", "$SRV.INFO", "$SRV.STATS", "$SRV.PING.lamps", "$SRV.INFO.lamps", "$SRV.STATS.lamps." + id} {
		if _, err := pc.Subscribe(subj, func(m *nats.Msg) { _ = m.Respond([]byte(`{"name":"lamps"}`)) }); err != nil {
			t.Fatal(err)
		}
		refused(plainViolations, subj)
	}
}
