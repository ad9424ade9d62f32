package node

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// startServer runs an embedded NATS server on a random loopback port.
func startServer(t *testing.T) *server.Server {
	t.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	if !srv.ReadyForConnections(5 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	return srv
}

// connect opens a client connection named name; inProcess skips TCP.
func connect(t *testing.T, srv *server.Server, name string, inProcess bool) *nats.Conn {
	t.Helper()
	opts := []nats.Option{nats.Name(name)}
	url := srv.ClientURL()
	if inProcess {
		opts = append(opts, nats.InProcessServer(srv))
		url = ""
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// mustSub returns a function that fails t when a subscription fails.
func mustSub(t *testing.T) func(*nats.Subscription, error) *nats.Subscription {
	return func(sub *nats.Subscription, err error) *nats.Subscription {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return sub
	}
}

func TestServerSubjectsSeesEveryKindOfHost(t *testing.T) {
	srv := startServer(t)
	must := mustSub(t)
	prog := connect(t, srv, "prog", false)
	echo := func(m *nats.Msg) { _ = m.Respond(m.Data) }
	must(prog.Subscribe("cap.plain", echo))
	must(prog.QueueSubscribe("cap.queued", "workers", echo))
	must(prog.QueueSubscribe("work.thumb", "meshbox", echo))
	must(prog.Subscribe("cap.>", func(*nats.Msg) {})) // a listener, not a host
	must(prog.Subscribe("evt.x", func(*nats.Msg) {}))
	svcConn := connect(t, srv, "micro-prog", false)
	svc, err := micro.AddService(svcConn, micro.Config{
		Name:     "echo",
		Version:  "1.0.0",
		Endpoint: &micro.EndpointConfig{Subject: "cap.micro", Handler: micro.HandlerFunc(func(r micro.Request) { _ = r.Respond(r.Data()) })},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	// The node's own connections: a stand-in over TCP and one in-process.
	own := connect(t, srv, "meshbox-bridge", false)
	must(own.Subscribe("cap.standin", echo))
	ownIn := connect(t, srv, "meshbox-api", true)
	must(ownIn.QueueSubscribe("cap.standin2", "q", echo))
	for _, nc := range []*nats.Conn{prog, svcConn, own, ownIn} {
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}

	subjects, err := ServerSubjects(srv, "meshbox-")()
	if err != nil {
		t.Fatal(err)
	}
	caps, stages, _ := localNames(subjects)
	if want := []string{"micro", "plain", "queued"}; !slices.Equal(caps, want) {
		t.Fatalf("capabilities: got %v (from %v), want %v", caps, subjects, want)
	}
	if want := []string{"thumb"}; !slices.Equal(stages, want) {
		t.Fatalf("stages: got %v, want %v", stages, want)
	}

	// Without the exclusion the stand-ins would count.
	subjects, err = ServerSubjects(srv, "")()
	if err != nil {
		t.Fatal(err)
	}
	caps, _, _ = localNames(subjects)
	if !slices.Contains(caps, "standin") || !slices.Contains(caps, "standin2") {
		t.Fatalf("without exclusion: got %v, want the stand-ins too", caps)
	}
}

func TestLocalHostDetectedWithinASecond(t *testing.T) {
	srv := startServer(t)
	must := mustSub(t)
	mesh := newFakeMesh()
	link := &fakeLink{mesh: mesh, name: "A", gone: map[string]time.Time{}}
	api := connect(t, srv, "meshbox-api", true)
	n, err := New(Config{
		Name:          "A",
		Link:          link,
		LocalSubjects: ServerSubjects(srv, "meshbox-"),
		Conn:          api,
		Logger:        slog.New(slog.NewTextHandler(tbWriter{t}, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	mesh.nodes["A"] = n
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })

	waitLocal := func(want []string) time.Duration {
		t.Helper()
		start := time.Now()
		for !slices.Equal(n.Capabilities().Local, want) {
			if time.Since(start) > 3*time.Second {
				t.Fatalf("local capabilities: got %v, want %v", n.Capabilities().Local, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
		return time.Since(start)
	}
	prog := connect(t, srv, "prog", false)
	sub := must(prog.QueueSubscribe("cap.echo", "q", func(m *nats.Msg) { _ = m.Respond(m.Data) }))
	if err := prog.Flush(); err != nil {
		t.Fatal(err)
	}
	if took := waitLocal([]string{"echo"}); took > time.Second {
		t.Fatalf("new local host seen after %v, want within a second", took)
	}
	if err := sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := prog.Flush(); err != nil {
		t.Fatal(err)
	}
	if took := waitLocal(nil); took > time.Second {
		t.Fatalf("local host gone seen after %v, want within a second", took)
	}
	// Each change was announced to the mesh (by the node's effects
	// goroutine, which may run a moment after the view changed).
	updates := func() int {
		var n int
		for _, k := range link.sentKeys() {
			if k == "sys.update" {
				n++
			}
		}
		return n
	}
	for deadline := time.Now().Add(time.Second); updates() < 2 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if got := updates(); got != 2 {
		t.Fatalf("updates sent: got %d, want 2 (%v)", got, link.sentKeys())
	}

	// The NATS API answers from the in-process connection.
	must(prog.Subscribe("cap.api", func(*nats.Msg) {}))
	waitLocal([]string{"api"})
	n.SetExpected([]string{"D"})
	client := connect(t, srv, "client", false)
	msg, err := client.Request(SubjectPeers, nil, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var peers PeersReply
	if err := json.Unmarshal(msg.Data, &peers); err != nil {
		t.Fatal(err)
	}
	if peers.Node != "A" || len(peers.Peers) != 1 || peers.Peers[0].Name != "D" || peers.Peers[0].State != StateAbsent {
		t.Fatalf("%s: got %s, want node A with D expected-but-absent", SubjectPeers, msg.Data)
	}
	msg, err = client.Request(SubjectCaps, nil, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var caps CapsReply
	if err := json.Unmarshal(msg.Data, &caps); err != nil {
		t.Fatal(err)
	}
	if caps.Node != "A" || !slices.Equal(caps.Local, []string{"api"}) || caps.Remote == nil {
		t.Fatalf("%s: got %s, want node A with local [api]", SubjectCaps, msg.Data)
	}

	// After Close the API is withdrawn.
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Request(SubjectPeers, nil, time.Second); err == nil {
		t.Fatalf("%s answered after Close", SubjectPeers)
	}
}
