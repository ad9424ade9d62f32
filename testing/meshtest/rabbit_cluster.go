package meshtest

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// clusterSize is the number of broker nodes of a RabbitCluster: the
// smallest cluster that keeps a quorum with one node down.
const clusterSize = 3

// RabbitCluster is a RabbitMQ cluster run by the harness on this machine:
// three rabbitmq-server instances, each a [Rabbit] with its own node name,
// ports (AMQP, management, Erlang distribution) and directory, sharing one
// Erlang cookie and joined with rabbitmqctl join_cluster. Users, vhosts,
// exchanges and queues are the cluster's: what one node's management API
// creates, every node has. Methods must be called from the test goroutine.
type RabbitCluster struct {
	nodes []*Rabbit
	// How long the start took: the nodes' parallel boot, then the joins.
	booted, joined time.Duration
}

// NewRabbitCluster starts a three-node cluster for tb and destroys it (every
// node killed, its data removed) in tb's Cleanup.
func NewRabbitCluster(tb testing.TB) *RabbitCluster {
	tb.Helper()
	start := time.Now()
	c, err := newRabbitCluster()
	if err != nil {
		tb.Fatalf("meshtest: start RabbitMQ cluster: %v", err)
	}
	tb.Cleanup(func() {
		if err := c.destroy(); err != nil {
			tb.Errorf("meshtest: stop RabbitMQ cluster: %v", err)
		}
	})
	tb.Logf("meshtest: RabbitMQ cluster of %d nodes (%s) ready in %v (boot %v, joins %v)", len(c.nodes), strings.Join(c.names(), ", "),
		time.Since(start).Round(time.Millisecond), c.booted.Round(time.Millisecond), c.joined.Round(time.Millisecond))
	return c
}

func newRabbitCluster() (*RabbitCluster, error) {
	cookie := rand.Text() // the nodes' shared Erlang cookie
	c := &RabbitCluster{}
	for range clusterSize {
		r, err := prepareRabbit(false, cookie)
		if err != nil {
			c.destroy()
			return nil, err
		}
		c.nodes = append(c.nodes, r)
	}
	// The nodes boot in parallel: a boot is mostly waiting on the VM.
	start := time.Now()
	errs := make([]error, len(c.nodes))
	var wg sync.WaitGroup
	for i, r := range c.nodes {
		// Starter: exits when its node is up or failed to start.
		wg.Go(func() { errs[i] = r.startFresh() })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.destroy()
		return nil, err
	}
	c.booted = time.Since(start)
	// The others stop their application and join the first one, one at
	// a time (each join changes the cluster's membership), then start
	// their application again together.
	first := c.nodes[0]
	for _, r := range c.nodes[1:] {
		for _, args := range [][]string{{"stop_app"}, {"join_cluster", first.node}} {
			if err := r.ctl(args...); err != nil {
				c.destroy()
				return nil, fmt.Errorf("join %s to %s: %w", r.node, first.node, err)
			}
		}
	}
	errs = make([]error, len(c.nodes)-1)
	for i, r := range c.nodes[1:] {
		// Starter: exits when its node's application is up or failed.
		wg.Go(func() { errs[i] = r.startApp() })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.destroy()
		return nil, err
	}
	if err := c.waitMembers(); err != nil {
		c.destroy()
		return nil, err
	}
	c.joined = time.Since(start) - c.booted
	return c, nil
}

// startApp starts the RabbitMQ application on r's running VM and waits
// until the broker answers.
func (r *Rabbit) startApp() error {
	if err := r.ctl("start_app"); err != nil {
		return err
	}
	deadline := time.Now().Add(rabbitReadyTimeout)
	for {
		err := r.probe()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after start_app: %w", r.node, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitMembers waits until the first node's management API lists every node
// of the cluster as running.
func (c *RabbitCluster) waitMembers() error {
	deadline := time.Now().Add(rabbitReadyTimeout)
	for {
		running, err := c.nodes[0].runningNodes()
		if err == nil && len(running) == len(c.nodes) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster not formed after %v: running %v, err %v", rabbitReadyTimeout, running, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// runningNodes returns the names of the cluster's nodes this broker sees
// running.
func (r *Rabbit) runningNodes() ([]string, error) {
	var nodes []struct {
		Name    string `json:"name"`
		Running bool   `json:"running"`
	}
	if err := r.apiInto(http.MethodGet, "/api/nodes", nil, &nodes); err != nil {
		return nil, err
	}
	var running []string
	for _, n := range nodes {
		if n.Running {
			running = append(running, n.Name)
		}
	}
	return running, nil
}

// Size returns the number of broker nodes.
func (c *RabbitCluster) Size() int { return len(c.nodes) }

// Node returns broker node i (0-based): its URL, ports, management API and
// name. Its Stop, Kill and Start work on that node alone; the cluster's
// methods of the same names log which node they act on.
func (c *RabbitCluster) Node(i int) *Rabbit { return c.nodes[i] }

// Index returns the index of the broker node named name (an Erlang node
// name, as the management API reports it), or -1.
func (c *RabbitCluster) Index(name string) int {
	for i, r := range c.nodes {
		if r.node == name {
			return i
		}
	}
	return -1
}

func (c *RabbitCluster) names() []string {
	var names []string
	for _, r := range c.nodes {
		names = append(names, r.node)
	}
	return names
}

// AMQPAddrs returns the AMQP URL of vhost on every node, without a
// credential, in node order: what a broker.url setting listing the whole
// cluster holds.
func (c *RabbitCluster) AMQPAddrs(vhost string) []string {
	var urls []string
	for _, r := range c.nodes {
		urls = append(urls, r.AMQPAddr(vhost))
	}
	return urls
}

// URLs returns the guest AMQP URL of vhost on every node, in node order.
func (c *RabbitCluster) URLs(vhost string) []string {
	var urls []string
	for _, r := range c.nodes {
		urls = append(urls, fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/%s", r.port, url.PathEscape(vhost)))
	}
	return urls
}

// running returns a node that runs, for the cluster's management calls.
func (c *RabbitCluster) running() (*Rabbit, error) {
	for _, r := range c.nodes {
		if r.running() {
			return r, nil
		}
	}
	return nil, errors.New("no node of the cluster runs")
}

// AdminURL returns the management API URL (with the administrator's
// credential) of a node that runs: the --broker-admin form. Users and
// permissions made through it are the cluster's.
func (c *RabbitCluster) AdminURL(tb testing.TB) string {
	tb.Helper()
	r, err := c.running()
	if err != nil {
		tb.Fatalf("meshtest: cluster admin URL: %v", err)
	}
	return r.AdminURL()
}

// Vhost creates a fresh vhost named after the test on the cluster, grants
// guest full permissions on it, and returns its name. It is deleted in tb's
// Cleanup if a node runs then.
func (c *RabbitCluster) Vhost(tb testing.TB) string {
	tb.Helper()
	r, err := c.running()
	if err != nil {
		tb.Fatalf("meshtest: cluster vhost: %v", err)
	}
	name := uniqueName(tb.Name(), '-', 100)
	path := "/api/vhosts/" + url.PathEscape(name)
	if err := r.api(http.MethodPut, path, map[string]any{}); err != nil {
		tb.Fatalf("meshtest: create vhost %s: %v", name, err)
	}
	perm := map[string]string{"configure": ".*", "write": ".*", "read": ".*"}
	if err := r.api(http.MethodPut, "/api/permissions/"+url.PathEscape(name)+"/guest", perm); err != nil {
		tb.Fatalf("meshtest: grant guest on vhost %s: %v", name, err)
	}
	tb.Cleanup(func() {
		if r, err := c.running(); err == nil {
			_ = r.api(http.MethodDelete, path, nil) // the cluster is thrown away after the test anyway
		}
	})
	return name
}

// QueueInfo is what the management API tells of a queue in a cluster.
type QueueInfo struct {
	Type      string   `json:"type"`     // classic, quorum
	Node      string   `json:"node"`     // the leader (quorum) or home node (classic)
	Leader    string   `json:"leader"`   // quorum queues only
	Members   []string `json:"members"`  // quorum queues only
	Online    []string `json:"online"`   // quorum queues only: members that run
	Messages  int      `json:"messages"` // ready and unacknowledged
	Consumers int      `json:"consumers"`
	// Arguments are the queue's declared x-arguments.
	Arguments map[string]any `json:"arguments"`
}

// Queue returns what a running node's management API knows of a queue,
// failing the test if it cannot tell.
func (c *RabbitCluster) Queue(tb testing.TB, vhost, queue string) QueueInfo {
	tb.Helper()
	q, err := c.LookupQueue(vhost, queue)
	if err != nil {
		tb.Fatalf("meshtest: %v", err)
	}
	return q
}

// LookupQueue is Queue returning the error (for polling while nodes come
// and go).
func (c *RabbitCluster) LookupQueue(vhost, queue string) (QueueInfo, error) {
	var q QueueInfo
	r, err := c.running()
	if err != nil {
		return q, fmt.Errorf("queue %s: %w", queue, err)
	}
	if err := r.apiInto(http.MethodGet, "/api/queues/"+url.PathEscape(vhost)+"/"+url.PathEscape(queue), nil, &q); err != nil {
		return q, fmt.Errorf("queue %s: %w", queue, err)
	}
	return q, nil
}

// Leader returns the index of the node that leads a quorum queue (or is a
// classic queue's home).
func (c *RabbitCluster) Leader(tb testing.TB, vhost, queue string) int {
	tb.Helper()
	q := c.Queue(tb, vhost, queue)
	name := q.Leader
	if name == "" {
		name = q.Node
	}
	i := c.Index(name)
	if i < 0 {
		tb.Fatalf("meshtest: queue %s: leader %q is no node of the cluster", queue, name)
	}
	return i
}

// Stop stops node i gracefully; the others keep the cluster.
func (c *RabbitCluster) Stop(tb testing.TB, i int) {
	tb.Helper()
	tb.Logf("meshtest: stopping cluster node %d (%s)", i, c.nodes[i].node)
	c.nodes[i].Stop(tb)
}

// Kill kills node i's VM with SIGKILL.
func (c *RabbitCluster) Kill(tb testing.TB, i int) {
	tb.Helper()
	tb.Logf("meshtest: killing cluster node %d (%s)", i, c.nodes[i].node)
	c.nodes[i].Kill(tb)
}

// Start starts node i again after Stop or Kill; it rejoins the cluster
// (its data says which one) and waits until it accepts connections.
func (c *RabbitCluster) Start(tb testing.TB, i int) {
	tb.Helper()
	tb.Logf("meshtest: starting cluster node %d (%s)", i, c.nodes[i].node)
	c.nodes[i].Start(tb)
}

// destroy kills every node and removes their directories.
func (c *RabbitCluster) destroy() error {
	var errs []error
	for _, r := range c.nodes {
		if err := r.destroy(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
