package bridge_test

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// waitMoved waits until moved (from LinkGeneration) is closed.
func waitMoved(t *testing.T, moved <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-moved:
	case <-time.After(20 * time.Second):
		t.Fatalf("the link's generation did not move on in 20s: %s", what)
	}
}

// dialExtra dials an extra connection of n for role rows, closed in
// Cleanup.
func dialExtra(t *testing.T, n *node) (*amqp.Connection, string) {
	t.Helper()
	conn, user, err := n.b.DialExtra(context.Background(), "rows")
	if err != nil {
		t.Fatalf("DialExtra: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn, user
}

// extraOn reports whether n's status lists an open extra connection of
// role rows on broker, as user.
func extraOn(n *node, broker, user string) bool {
	for _, x := range n.b.Status().Broker.Extra {
		if x.Role == "rows" && x.Broker == broker && x.User == user {
			return true
		}
	}
	return false
}

// TestDialExtraFollowsFailover: one broker reached through two proxies
// stands for two broker nodes. An extra connection goes to the broker the
// link is on and shows in the status; cutting that proxy moves the link
// to the other one, its generation moves on, the cut connection leaves
// the status, and DialExtra now dials the other broker.
func TestDialExtraFollowsFailover(t *testing.T) {
	vhost := testVhost(t)
	px1, u1 := brokerProxy(t, vhost)
	px2, u2 := brokerProxy(t, vhost)
	proxies := map[string]*meshtest.Proxy{px1.Addr(): px1, px2.Addr(): px2}
	a := newNode(t, "alpha", u1+","+u2, nil)
	a.waitConnected(t)

	gen, moved := a.b.LinkGeneration()
	conn, user := dialExtra(t, a)
	first := a.b.Status().Broker.Broker
	px, ok := proxies[first]
	if !ok {
		t.Fatalf("status broker %q, want one of %s, %s", first, px1.Addr(), px2.Addr())
	}
	if user != "guest" {
		t.Errorf("DialExtra logged in as %q, want guest (the URL's user)", user)
	}
	if !extraOn(a, first, "guest") {
		t.Errorf("status extra connections %+v, want rows on %s as guest", a.b.Status().Broker.Extra, first)
	}
	select {
	case <-moved:
		t.Fatal("the link's generation moved on without a new session")
	default:
	}

	other := px1.Addr()
	if first == other {
		other = px2.Addr()
	}
	px.Cut(t)
	waitMoved(t, moved, "failover to "+other)
	meshtest.WaitFor(t, 20*time.Second, "alpha connected on "+other, func() bool {
		st := a.b.Status().Broker
		return st.State == bridge.StateConnected && st.Broker == other
	})
	if g, _ := a.b.LinkGeneration(); g <= gen {
		t.Errorf("generation %d after the failover, want more than %d", g, gen)
	}
	meshtest.WaitFor(t, 20*time.Second, "the cut connection gone from the status", func() bool {
		return conn.IsClosed() && !extraOn(a, first, "guest")
	})
	conn2, _ := dialExtra(t, a)
	if !extraOn(a, other, "guest") {
		t.Errorf("status extra connections %+v, want rows on %s", a.b.Status().Broker.Extra, other)
	}
	_ = conn2.Close()
	if x := a.b.Status().Broker.Extra; len(x) != 0 {
		t.Errorf("status extra connections %+v after closing them, want none", x)
	}
}

// TestDialExtraFollowsCredentialHandover: a node switches to a new
// broker user make before break; the link's generation moves on, and
// DialExtra logs in as the new user.
func TestDialExtraFollowsCredentialHandover(t *testing.T) {
	a, urlOf := perNodeMesh(t)
	g1 := generation(t, a, "alpha", 1)
	alpha := newNode(t, "alpha", urlOf(g1), nil)
	alpha.waitConnected(t)
	_, moved := alpha.b.LinkGeneration()
	if _, user := dialExtra(t, alpha); user != g1.User {
		t.Errorf("DialExtra logged in as %q, want %q", user, g1.User)
	}

	g2 := generation(t, a, "alpha", 2)
	if err := alpha.b.SetURL(urlOf(g2)); err != nil {
		t.Fatal(err)
	}
	waitMoved(t, moved, "credential handover to "+g2.User)
	if _, user := dialExtra(t, alpha); user != g2.User {
		t.Errorf("DialExtra after the handover logged in as %q, want %q", user, g2.User)
	}
	broker := alpha.b.Status().Broker.Broker
	if !extraOn(alpha, broker, g1.User) || !extraOn(alpha, broker, g2.User) {
		t.Errorf("status extra connections %+v, want one as %s and one as %s", alpha.b.Status().Broker.Extra, g1.User, g2.User)
	}
}

// TestDialExtraWithoutLink: without a connected link DialExtra says so
// (ErrLinkDown), after Close ErrClosed, and Close moves the generation
// on.
func TestDialExtraWithoutLink(t *testing.T) {
	n := newNode(t, "alpha", "", nil)
	if _, _, err := n.b.DialExtra(context.Background(), "rows"); !errors.Is(err, bridge.ErrLinkDown) {
		t.Errorf("DialExtra without a broker: got %v, want ErrLinkDown", err)
	}
	_, moved := n.b.LinkGeneration()
	if err := n.b.Close(); err != nil {
		t.Fatal(err)
	}
	waitMoved(t, moved, "Close")
	if _, _, err := n.b.DialExtra(context.Background(), "rows"); !errors.Is(err, bridge.ErrClosed) {
		t.Errorf("DialExtra after Close: got %v, want ErrClosed", err)
	}
}
