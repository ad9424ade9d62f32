package cluster

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/nats-io/nats.go"
)

// placed is a meshbox node on a cluster: the broker URLs it lists go
// through proxies of its own, one per broker node, so that the test can
// place it on the broker node it wants (see startPlaced).
type placed struct {
	p       *meshtest.Process
	proxies []*meshtest.Proxy // by broker node
}

// on returns the index of the broker node p is connected to, -1 if none.
func (n *placed) on(st appliance.Status) int {
	if st.Broker.State != "connected" {
		return -1
	}
	for i, px := range n.proxies {
		if px.Addr() == st.Broker.Broker {
			return i
		}
	}
	return -1
}

// startPlaced runs meshbox node name with a broker setting naming every
// node of c (vhost), broker node home first, and keeps it on home to begin
// with: the other proxies refuse connections until the node is connected.
// The node picks a broker of its list at random; this is how a test
// spreads its nodes over the cluster. requestTimeout is its bridge's
// request deadline.
func startPlaced(t *testing.T, c *meshtest.RabbitCluster, vhost, name string, home int, requestTimeout time.Duration) *placed {
	t.Helper()
	n := &placed{}
	var urls []string
	for i := range c.Size() {
		r := c.Node(i)
		up := fmt.Sprintf("127.0.0.1:%d", r.Port())
		px := meshtest.NewProxy(t, up)
		n.proxies = append(n.proxies, px)
		urls = append(urls, px.Rewrite(r.AMQPAddr(vhost), up))
	}
	list := append(urls[home:], urls[:home]...)
	for i, px := range n.proxies {
		if i != home {
			px.Cut(t)
		}
	}
	// A config file of the one setting: the request timeout, nested by its key.
	var setting any = requestTimeout.String()
	key := strings.Split(appliance.SettingKey(func(c *appliance.Config) any { return &c.Bridge.RequestTimeout }), ".")
	for i := len(key) - 1; i >= 0; i-- {
		setting = map[string]any{key[i]: setting}
	}
	cfg, err := json.Marshal(setting)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), name+".json")
	if err := os.WriteFile(file, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	n.p = meshtest.StartProcess(t, "--node", name, "--broker", strings.Join(list, ","), "--config", file)
	meshtest.WaitStatus(t, n.p.HTTPURL(), 60*time.Second, name+" connected to broker node "+fmt.Sprint(home), func(st appliance.Status) bool { return n.on(st) == home })
	for i, px := range n.proxies {
		if i != home {
			px.Restore(t)
		}
	}
	return n
}

// natsConn connects a client with the node's administrative credential.
func natsConn(t *testing.T, p *meshtest.Process) *nats.Conn {
	t.Helper()
	return p.Connect(t, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
}
