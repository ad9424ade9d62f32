package main

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
	"github.com/nats-io/nats.go"
)

// standaloneNode runs a NATS server on loopback TCP and a bridge without a
// broker, and returns the server's URL, a connection for local programs
// and the bridge (tell it what the programs host with SetLocalInterest, as
// the appliance's watcher does).
func standaloneNode(t *testing.T) (string, *nats.Conn, *bridge.Bridge) {
	t.Helper()
	srv := natstest.Start(t)
	dial := natstest.Dialer(srv)
	nc := natstest.Connect(t, srv)
	b, err := bridge.New(bridge.Config{
		Node: "solo", OutboxPath: filepath.Join(t.TempDir(), "outbox.db"),
		Dial:           dial,
		RequestTimeout: 2 * time.Second,
	}, nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return srv.ClientURL(), natstest.ConnectTCP(t, srv), b
}

func TestMessageCommands(t *testing.T) {
	url, prog, b := standaloneNode(t)
	c := cli{env: map[string]string{"MESHBOX_SERVER": url}}

	// A local program hosts cap.echo and the stage "print".
	if _, err := prog.Subscribe("cap.echo", func(m *nats.Msg) {
		r := nats.NewMsg(m.Reply)
		r.Data = append([]byte("echo:"), m.Data...)
		r.Header.Set("X-Timeout-Seen", m.Header.Get(bridge.HeaderTimeout))
		_ = m.RespondMsg(r)
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := prog.Subscribe("cap.broken", func(m *nats.Msg) {
		r := nats.NewMsg(m.Reply)
		r.Header.Set("Nats-Service-Error", "it broke")
		r.Header.Set("Nats-Service-Error-Code", "500")
		_ = m.RespondMsg(r)
	}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var work []string
	if _, err := prog.QueueSubscribe("work.print", "meshbox", func(m *nats.Msg) {
		mu.Lock()
		work = append(work, string(m.Data))
		mu.Unlock()
		_ = m.Respond(nil)
	}); err != nil {
		t.Fatal(err)
	}
	_ = prog.Flush()
	if err := b.SetLocalInterest(context.Background(), []string{"cap.broken", "cap.echo", "work.print"}); err != nil {
		t.Fatal(err)
	}

	if out := c.ok(t, "call", "echo", "hi"); out != "echo:hi" {
		t.Errorf("call echo hi: got %q", out)
	}
	if out := (cli{env: c.env, stdin: "from stdin"}).ok(t, "call", "echo", "--timeout", "3s"); out != "echo:from stdin" {
		t.Errorf("call with stdin: got %q", out)
	}
	_, errOut, err := c.run(t, "call", "echo", "x", "--timeout", "1500ms", "-v")
	if err != nil || !strings.Contains(errOut, "X-Timeout-Seen: 1.5s") {
		t.Errorf("call --timeout: got %v, headers %q; want the deadline passed on", err, errOut)
	}
	c.fails(t, "error 500: it broke", "call", "broken")
	c.fails(t, "no host for nothing", "call", "nothing")
	c.fails(t, "not hosted on node solo", "call", "nothing", "--to", "solo")

	meshtest.WaitFor(t, 10*time.Second, "send print accepted", func() bool {
		out, _, err := c.run(t, "send", "print", "job-1")
		return err == nil && strings.HasPrefix(out, "accepted (local) ")
	})
	out := c.ok(t, "send", "print", "job-2", "--id", "my-id")
	if out != "accepted (local) my-id\n" {
		t.Errorf("send --id: got %q", out)
	}
	meshtest.WaitFor(t, 10*time.Second, "both jobs at the handler", func() bool { mu.Lock(); defer mu.Unlock(); return len(work) >= 2 })
	c.fails(t, "503", "send", "nobody-hosts-this", "x")
	c.fails(t, "400", "send", "print", "x", "--header", "CC=evt.x")

	// listen gets what emit publishes.
	done := make(chan string, 1)
	go func() {
		out, _, err := c.run(t, "listen", "evt.>", "--count", "1")
		if err != nil {
			out = err.Error()
		}
		done <- out
	}()
	meshtest.WaitFor(t, 10*time.Second, "an emitted event listened to", func() bool {
		out, _, err := c.run(t, "emit", "door.open", "front")
		if err != nil || !strings.HasPrefix(out, "accepted (local) ") {
			return false
		}
		select {
		case got := <-done:
			if got != "evt.door.open: front\n" {
				t.Errorf("listen: got %q", got)
			}
			return true
		case <-time.After(200 * time.Millisecond):
			return false
		}
	})

	var ue *usageError
	if _, _, err := c.run(t, "call"); !errors.As(err, &ue) {
		t.Errorf("call without a capability: got %v, want a usage error", err)
	}
	c.fails(t, "cannot reach the node", "call", "echo", "--server", "nats://127.0.0.1:1")
}
