package e2e

import (
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// withHost returns amqpURL pointing at host (host:port).
func withHost(t *testing.T, amqpURL, host string) string {
	t.Helper()
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = host
	return u.String()
}

func hostOf(t *testing.T, amqpURL string) string {
	t.Helper()
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// vhostBehindProxy makes a vhost on the shared broker and a proxy to the
// broker: direct is the vhost's URL, viaProxy the same through the proxy.
// A node on viaProxy loses the broker (connections refused) while the
// proxy is cut, and finds it again once it is restored; the broker
// itself stays up for everyone else.
func vhostBehindProxy(t *testing.T) (rmq *meshtest.Rabbit, direct, viaProxy string, px *meshtest.Proxy) {
	t.Helper()
	rmq = meshtest.RabbitMQ(t)
	direct = rmq.Vhost(t)
	upstream := hostOf(t, direct)
	px = meshtest.NewProxy(t, upstream)
	return rmq, direct, px.Rewrite(direct, upstream), px
}

// TestThreeBrokerURLsTwoDown: `meshbox run --broker a,b,c` where a and b
// are closed ports connects to c, and its status says so: the broker in
// use and all three URLs, passwords redacted.
func TestThreeBrokerURLsTwoDown(t *testing.T) {
	t.Parallel()
	vhost := meshtest.RabbitMQ(t).Vhost(t)
	live := hostOf(t, vhost)
	down1 := withHost(t, vhost, fmt.Sprintf("127.0.0.1:%d", meshtest.ClosedPort(t)))
	down2 := withHost(t, vhost, fmt.Sprintf("127.0.0.1:%d", meshtest.ClosedPort(t)))
	p := startMeshNode(t, "alpha", down1+","+down2+","+vhost, bridgeConfig{})
	st := meshtest.WaitStatus(t, p.HTTPURL(), 5*time.Second, "the status naming the broker in use", func(s appliance.Status) bool {
		return s.Broker.State == "connected" && s.Broker.Broker == live
	})
	if !strings.Contains(st.Broker.URL, live) || strings.Contains(st.Broker.URL, ",") {
		t.Errorf("status url %q, want the one URL of %s", st.Broker.URL, live)
	}
	if len(st.Broker.URLs) != 3 {
		t.Errorf("status lists %q, want the three broker URLs", st.Broker.URLs)
	}
	if strings.Contains(fmt.Sprint(st.Broker.URLs), "guest:guest") {
		t.Errorf("status URLs %q show the password", st.Broker.URLs)
	}
}

// TestBrokerFailoverToSecondURL: one broker reached through two proxies
// stands for two broker nodes. The node is started with both URLs;
// cutting the proxy it is on moves it to the other, and its status and
// log say so.
func TestBrokerFailoverToSecondURL(t *testing.T) {
	t.Parallel()
	vhost := meshtest.RabbitMQ(t).Vhost(t)
	upstream := hostOf(t, vhost)
	px1, px2 := meshtest.NewProxy(t, upstream), meshtest.NewProxy(t, upstream)
	proxies := map[string]*meshtest.Proxy{px1.Addr(): px1, px2.Addr(): px2}
	p := startMeshNode(t, "alpha", px1.Rewrite(vhost, upstream)+","+px2.Rewrite(vhost, upstream), bridgeConfig{})
	st := meshtest.WaitStatus(t, p.HTTPURL(), 5*time.Second, "the status naming the broker in use", func(s appliance.Status) bool {
		return s.Broker.State == "connected" && proxies[s.Broker.Broker] != nil
	})
	first := st.Broker.Broker
	other := px1.Addr()
	if first == other {
		other = px2.Addr()
	}
	proxies[first].Cut(t)
	st = meshtest.WaitStatus(t, p.HTTPURL(), 30*time.Second, "the node on the other broker URL", func(s appliance.Status) bool {
		return s.Broker.State == "connected" && s.Broker.Broker == other
	})
	n := len(st.Broker.Failovers)
	if n == 0 || st.Broker.Failovers[n-1].From != first || st.Broker.Failovers[n-1].To != other {
		t.Fatalf("failovers %+v, want the last from %s to %s", st.Broker.Failovers, first, other)
	}
	// The log line is written with the status; it reaches the test
	// through the process's output pipe, which may lag behind.
	if !meshtest.Poll(5*time.Second, func() bool { return strings.Contains(p.Output(), "broker failover") }) {
		t.Errorf("the log does not say the node failed over:\n%s", p.Output())
	}
}

// TestDoctorSeveralBrokers: doctor checks each broker of a list; one that
// does not answer is a warning while another does, a failure when none
// does.
func TestDoctorSeveralBrokers(t *testing.T) {
	t.Parallel()
	vhost := meshtest.RabbitMQ(t).Vhost(t)
	down := withHost(t, vhost, fmt.Sprintf("127.0.0.1:%d", meshtest.ClosedPort(t)))
	data := filepath.Join(t.TempDir(), "data")

	code, rep := doctor(t, "--node", "alpha", "--data", data, "--broker", vhost+","+down)
	if code != 0 {
		t.Fatalf("one broker of two up: exit %d, failed: %v", code, rep.failed())
	}
	wantCheck(t, rep, "broker", "warn", "1 of 2 brokers do not answer", hostOf(t, down))
	if _, msg := rep.check(t, "broker"); strings.Contains(msg, "guest:guest") {
		t.Errorf("broker check shows the password: %q", msg)
	}

	code, rep = doctor(t, "--node", "alpha", "--data", data, "--broker", down+","+down)
	if code == 0 {
		t.Errorf("no broker up: exit 0, want non-zero")
	}
	wantCheck(t, rep, "broker", "fail", "none of 2 brokers answers")
}

// TestBrokerListSetting: the broker.url mesh setting names two brokers,
// one down; a node run with only --db connects to the other one with the
// credential its bindings give it, and its status lists both.
func TestBrokerListSetting(t *testing.T) {
	t.Parallel()
	vhost := meshtest.RabbitMQ(t).Vhost(t)
	down := withHost(t, vhost, fmt.Sprintf("127.0.0.1:%d", meshtest.ClosedPort(t)))
	db := meshtest.Postgres(t).Database(t)
	list := meshtest.NoCredential(down) + "," + meshtest.NoCredential(vhost)
	if code, _, errOut := cli(t, "init", "--db", db, "--node", "alpha", "--broker", list); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	p := meshtest.StartProcess(t, "--node", "alpha", "--db", db)
	st := meshtest.WaitStatus(t, p.HTTPURL(), 30*time.Second, "broker connected", func(s appliance.Status) bool {
		return s.Broker.State == "connected"
	})
	if st.Broker.Broker != hostOf(t, vhost) || len(st.Broker.URLs) != 2 {
		t.Errorf("status broker %q urls %q, want %s of 2", st.Broker.Broker, st.Broker.URLs, hostOf(t, vhost))
	}
}
