package bridge_test

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
)

// closedBrokerURL returns brokerURL moved to a loopback port nothing
// listens on: a broker node that is down.
func closedBrokerURL(t *testing.T, brokerURL string) string {
	t.Helper()
	u, err := url.Parse(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = fmt.Sprintf("127.0.0.1:%d", meshtest.ClosedPort(t))
	return u.String()
}

// hostPort is the host:port of a broker URL.
func hostPort(t *testing.T, brokerURL string) string {
	t.Helper()
	u, err := url.Parse(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// TestSeveralBrokersTwoUnreachable: of three broker URLs two are closed
// ports; each node connects to the third and its status says so, whichever
// one it picked first.
func TestSeveralBrokersTwoUnreachable(t *testing.T) {
	vhost := testVhost(t)
	live := hostPort(t, vhost)
	list := strings.Join([]string{closedBrokerURL(t, vhost), closedBrokerURL(t, vhost), vhost}, ",")
	for _, name := range []string{"alpha", "beta", "gamma"} {
		n := newNode(t, name, list, nil)
		n.waitConnected(t)
		st := n.b.Status().Broker
		if st.Broker != live {
			t.Errorf("%s: status broker %q, want %q", name, st.Broker, live)
		}
		if !strings.Contains(st.URL, live) || strings.Contains(st.URL, ",") {
			t.Errorf("%s: status url %q, want the one URL of %s", name, st.URL, live)
		}
		if len(st.URLs) != 3 {
			t.Errorf("%s: status lists %d broker URLs, want 3", name, len(st.URLs))
		}
		for _, u := range st.URLs {
			if strings.Contains(u, ":guest@") {
				t.Errorf("%s: status URL %q shows the password", name, u)
			}
		}
		if last := st.History[len(st.History)-1]; last.State != bridge.StateConnected || last.Broker != live {
			t.Errorf("%s: last history entry %+v, want connected on %s", name, last, live)
		}
	}
}

// TestFailoverToAnotherBrokerURL: one broker reached through two proxies
// stands for two broker nodes. Cutting the proxy the node is on moves it
// to the other URL; the status names the new broker and records the
// failover, and the node's queues are there again: a request reaches it.
func TestFailoverToAnotherBrokerURL(t *testing.T) {
	vhost := testVhost(t)
	px1, u1 := brokerProxy(t, vhost)
	px2, u2 := brokerProxy(t, vhost)
	proxies := map[string]*meshtest.Proxy{px1.Addr(): px1, px2.Addr(): px2}
	a := newNode(t, "alpha", u1+","+u2, nil)
	b := newNode(t, "beta", vhost, func(c *bridge.Config) { c.Routes = map[string]string{"echo": "alpha"} })
	a.waitConnected(t)
	b.waitConnected(t)
	hostEcho(t, a, "echo")
	waitStandIn(t, b, "echo")

	first := a.b.Status().Broker.Broker
	px, ok := proxies[first]
	if !ok {
		t.Fatalf("status broker %q, want one of %s, %s", first, px1.Addr(), px2.Addr())
	}
	other := px1.Addr()
	if first == other {
		other = px2.Addr()
	}
	cut := time.Now()
	px.Cut(t)
	meshtest.WaitFor(t, 20*time.Second, "alpha connected on "+other, func() bool {
		st := a.b.Status().Broker
		return st.State == bridge.StateConnected && st.Broker == other
	})
	t.Logf("failover from %s to %s took %v", first, other, time.Since(cut).Round(time.Millisecond))
	st := a.b.Status().Broker
	i := slices.IndexFunc(st.Failovers, func(f bridge.Failover) bool { return f.From == first && f.To == other })
	if i < 0 {
		t.Fatalf("failovers %+v, want one from %s to %s", st.Failovers, first, other)
	}
	if st.Failovers[i].Reason == "" {
		t.Errorf("failover %+v has no reason", st.Failovers[i])
	}
	meshtest.WaitFor(t, 20*time.Second, "a request from beta answered by alpha", func() bool {
		m, err := b.request(t, "node.alpha.cap.echo", []byte("x"), nil, 3*time.Second)
		if err != nil {
			return false
		}
		code, _ := natstest.ServiceError(m)
		return code == 0 && string(m.Data) == "echo:x"
	})
}

// TestCredentialSwitchWithSeveralBrokers: a node on a list of broker URLs
// gets the list with a new credential; it switches make before break on
// the broker it is on (no offline state, no failover) and uses the new
// user.
func TestCredentialSwitchWithSeveralBrokers(t *testing.T) {
	a, urlOf := perNodeMesh(t)
	g1 := urlOf(generation(t, a, "alpha", 1))
	down := closedBrokerURL(t, g1) // the same credential on a broker node that is down
	alpha := newNode(t, "alpha", down+","+g1, nil)
	alpha.waitConnected(t)
	live := hostPort(t, g1)
	if got := alpha.b.Status().Broker.Broker; got != live {
		t.Fatalf("status broker %q, want %q", got, live)
	}
	before := len(alpha.b.Status().Broker.History)

	cred2 := generation(t, a, "alpha", 2)
	g2 := urlOf(cred2)
	u, err := url.Parse(down)
	if err != nil {
		t.Fatal(err)
	}
	down2 := strings.Replace(g2, hostPort(t, g2), u.Host, 1)
	if err := alpha.b.SetURL(down2 + "," + g2); err != nil {
		t.Fatal(err)
	}
	meshtest.WaitFor(t, 20*time.Second, "alpha on its new user", func() bool {
		c := alpha.b.Status().Broker.Credential
		return c != nil && c.User == cred2.User && c.State == bridge.CredentialInUse
	})
	st := alpha.b.Status().Broker
	if st.State != bridge.StateConnected || st.Broker != live {
		t.Errorf("after the switch: state %s on %q, want connected on %s", st.State, st.Broker, live)
	}
	for _, h := range st.History[min(before, len(st.History)):] {
		if h.State != bridge.StateConnected {
			t.Errorf("the switch went through state %s (%s): want make before break", h.State, h.Reason)
		}
	}
	if len(st.Failovers) != 0 {
		t.Errorf("failovers %+v, want none", st.Failovers)
	}
	if st.Credential.SwitchedAt.IsZero() {
		t.Error("credential status has no switched_at after the switch")
	}
}
