package bridge_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
	"github.com/nats-io/nats.go"
)

// hostEcho makes n's local program host cap.<name>: it answers with the
// request's body, echoes X-Trace and Content-Type, and adds X-Served-By.
func hostEcho(t *testing.T, n *node, name string) {
	t.Helper()
	sub, err := n.client.QueueSubscribe("cap."+name, "svc", func(m *nats.Msg) {
		r := nats.NewMsg(m.Reply)
		r.Data = append([]byte("echo:"), m.Data...)
		r.Header.Set("X-Trace", m.Header.Get("X-Trace"))
		r.Header.Set("Content-Type", m.Header.Get("Content-Type"))
		r.Header.Set("X-Origin-Seen", m.Header.Get(codec.HeaderOrigin))
		r.Header.Set("X-Served-By", n.name)
		_ = m.RespondMsg(r)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := n.client.Flush(); err != nil {
		t.Fatal(err)
	}
}

// waitStandIn waits until cap.<name> on n answers something other than "no
// responders" (the stand-in exists).
func waitStandIn(t *testing.T, n *node, name string) {
	t.Helper()
	meshtest.WaitFor(t, 10*time.Second, "stand-in for "+name+" on "+n.name, func() bool {
		_, err := n.request(t, "cap."+name, nil, nats.Header{codec.HeaderTimeout: {"1s"}}, 2*time.Second)
		return !isNoResponders(err)
	})
}

func TestRequestReplyAcrossNodes(t *testing.T) {
	vhost := testVhost(t)
	a := newNode(t, "alpha", vhost, func(c *bridge.Config) { c.Routes = map[string]string{"echo": "beta"} })
	b := newNode(t, "beta", vhost, nil)
	a.waitConnected(t)
	b.waitConnected(t)
	hostEcho(t, b, "echo")
	waitStandIn(t, a, "echo")

	hdr := nats.Header{"X-Trace": {"trace-1"}, "Content-Type": {"application/json"}}
	for _, subj := range []string{"cap.echo", "node.beta.cap.echo"} {
		m, err := a.request(t, subj, []byte(`{"n":1}`), hdr, 5*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", subj, err)
		}
		if code, text := natstest.ServiceError(m); code != 0 {
			t.Fatalf("%s: error %d %s", subj, code, text)
		}
		if got := string(m.Data); got != `echo:{"n":1}` {
			t.Errorf("%s body: got %q, want %q", subj, got, `echo:{"n":1}`)
		}
		for k, want := range map[string]string{"X-Trace": "trace-1", "Content-Type": "application/json", "X-Served-By": "beta", "X-Origin-Seen": "alpha"} {
			if got := m.Header.Get(k); got != want {
				t.Errorf("%s reply header %s: got %q, want %q", subj, k, got, want)
			}
		}
	}

	// A local host wins over the route: alpha hosts echo too.
	hostEcho(t, a, "echo")
	// The bridge counts echo as local (and has withdrawn its stand-in in
	// the same step) once the interest feed reported the new host.
	meshtest.WaitFor(t, 10*time.Second, "echo hosted on alpha", func() bool {
		return slices.Contains(a.b.LocalCapabilities(), "echo")
	})
	for i := 0; i < 20; i++ {
		m, err := a.request(t, "cap.echo", nil, nil, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Header.Get("X-Served-By"); got != "alpha" {
			t.Fatalf("call %d with a local host: served by %q, want alpha", i, got)
		}
	}
	// ...and a caller can still name the target.
	m, err := a.request(t, "node.beta.cap.echo", nil, nil, 5*time.Second)
	if err != nil || m.Header.Get("X-Served-By") != "beta" {
		t.Fatalf("node.beta.cap.echo: got %v %v, want served by beta", m, err)
	}
	// node.<self>.cap.<name> is the local host.
	m, err = a.request(t, "node.alpha.cap.echo", nil, nil, 5*time.Second)
	if err != nil || m.Header.Get("X-Served-By") != "alpha" {
		t.Fatalf("node.alpha.cap.echo: got %v %v, want served by alpha", m, err)
	}
}

func TestRequestFailsAtOnce(t *testing.T) {
	vhost := testVhost(t)
	a := newNode(t, "alpha", vhost, func(c *bridge.Config) {
		c.Routes = map[string]string{"ghost": "nobody", "echo": "beta"}
	})
	b := newNode(t, "beta", vhost, nil)
	a.waitConnected(t)
	b.waitConnected(t)
	waitStandIn(t, a, "ghost")

	tests := []struct {
		name, subject string
		wantCode      int
		wantText      string
	}{
		{"routed to a node that is not connected", "cap.ghost", 503, "node nobody is not connected"},
		{"named node not connected", "node.nobody.cap.echo", 503, "node nobody is not connected"},
		{"capability not hosted on the named node", "node.beta.cap.nothing", 503, "not hosted on node beta"},
		{"not hosted here", "node.alpha.cap.nothing", 503, "not hosted on node alpha"},
		{"bad timeout header", "cap.ghost", 400, "Meshbox-Timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hdr := nats.Header{}
			if tt.wantCode == 400 {
				hdr.Set(codec.HeaderTimeout, "later")
			}
			start := time.Now()
			m, err := a.request(t, tt.subject, []byte("x"), hdr, 5*time.Second)
			took := time.Since(start)
			if err != nil {
				t.Fatalf("got %v, want an error reply", err)
			}
			code, text := natstest.ServiceError(m)
			if code != tt.wantCode || !strings.Contains(text, tt.wantText) {
				t.Errorf("got %d %q, want %d with %q", code, text, tt.wantCode, tt.wantText)
			}
			if took > time.Second {
				t.Errorf("took %v, want an answer at once", took)
			}
		})
	}

	// Discovery marks beta gone: calls fail at once naming it.
	a.b.SetRoutes(map[string][]string{"echo": {"beta"}})
	a.b.MarkGone("beta", time.Now().Add(-time.Minute))
	waitStandIn(t, a, "echo")
	m, err := a.request(t, "cap.echo", nil, nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code, text := natstest.ServiceError(m); code != 503 || !strings.Contains(text, "node beta is gone") {
		t.Errorf("gone node: got %d %q, want 503 naming beta", code, text)
	}
	// Nobody hosts it and there is no route: plain NATS has no responders.
	if _, err := a.request(t, "cap.unknown", nil, nil, 2*time.Second); !isNoResponders(err) {
		t.Errorf("unrouted capability: got %v, want no responders", err)
	}
}

func TestRequestDeadline(t *testing.T) {
	vhost := testVhost(t)
	a := newNode(t, "alpha", vhost, func(c *bridge.Config) {
		c.Routes = map[string]string{"slow": "beta"}
		c.RequestTimeout = 1500 * time.Millisecond
	})
	b := newNode(t, "beta", vhost, nil)
	a.waitConnected(t)
	b.waitConnected(t)
	told := make(chan string, 8)                                   // the deadline the host is told
	sub, err := b.client.Subscribe("cap.slow", func(m *nats.Msg) { // never answers
		select {
		case told <- m.Header.Get(codec.HeaderTimeout):
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	waitStandIn(t, a, "slow")
	for len(told) > 0 {
		<-told // the stand-in's probes
	}

	const margin = 300 * time.Millisecond
	for _, tt := range []struct {
		header string
		want   time.Duration
	}{
		{"", 1500 * time.Millisecond},       // the default
		{"700ms", 700 * time.Millisecond},   // the caller shortens it
		{"2500ms", 2500 * time.Millisecond}, // or lengthens it (up to wire.MaxTimeout)
	} {
		hdr := nats.Header{}
		if tt.header != "" {
			hdr.Set(codec.HeaderTimeout, tt.header)
		}
		start := time.Now()
		m, err := a.request(t, "cap.slow", nil, hdr, 10*time.Second)
		took := time.Since(start)
		if err != nil {
			t.Fatalf("timeout %q: got %v, want a 504 reply", tt.header, err)
		}
		// The 504 comes from whichever side's clock runs out first: the
		// caller's node ("deadline of ... passed") or the host's, which
		// calls its program with the time the caller had left ("did not
		// answer within ...").
		if code, text := natstest.ServiceError(m); code != 504 || !strings.Contains(text, "slow") {
			t.Errorf("timeout %q: got %d %q, want 504 naming capability slow", tt.header, code, text)
		}
		if took < tt.want-50*time.Millisecond || took > tt.want+margin {
			t.Errorf("timeout %q: answered after %v, want %v (+%v)", tt.header, took, tt.want, margin)
		}
		select {
		case got := <-told:
			if d, err := time.ParseDuration(got); err != nil || d != tt.want {
				t.Errorf("timeout %q: the host was told %q, want %s", tt.header, got, tt.want)
			}
		default:
			t.Errorf("timeout %q: the host was not asked", tt.header)
		}
	}
}
