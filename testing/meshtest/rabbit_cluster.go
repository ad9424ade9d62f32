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
	tb.Logf("meshtest: RabbitMQ cluster of %d nodes (%s) ready in %v", len(c.nodes), strings.Join(c.names(), ", "), time.Since(start).Round(time.Millisecond))
	return c
}

// SharedRabbitCluster returns the cluster shared by the tests of this
// package, starting it on first use; Main destroys it. A test that stops
// or kills a node calls Restore (in its Cleanup, say) so that the next
// test finds every node running. If the first start failed, every caller
// fails with the same error.
func SharedRabbitCluster(tb testing.TB) *RabbitCluster {
	tb.Helper()
	shared.clusterMu.Lock()
	defer shared.clusterMu.Unlock()
	if shared.cluster == nil && shared.clusterE == nil {
		start := time.Now()
		c, err := newRabbitCluster()
		if err != nil {
			shared.clusterE = err
		} else {
			shared.cluster = c
			tb.Logf("meshtest: shared RabbitMQ cluster of %d nodes (%s) ready in %v", len(c.nodes), strings.Join(c.names(), ", "), time.Since(start).Round(time.Millisecond))
		}
	}
	if shared.clusterE != nil {
		tb.Fatalf("meshtest: shared RabbitMQ cluster failed to start: %v", shared.clusterE)
	}
	return shared.cluster
}

// Restore starts every node that was stopped or killed and waits until
// the cluster lists them all as running.
func (c *RabbitCluster) Restore(tb testing.TB) {
	tb.Helper()
	for i, r := range c.nodes {
		if !r.running() {
			c.Start(tb, i)
		}
	}
	if err := c.waitMembers(); err != nil {
		tb.Fatalf("meshtest: restore RabbitMQ cluster: %v", err)
	}
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
	// The others join the first one: their application stops, they
	// reset and join, and their application starts again.
	first := c.nodes[0]
	for _, r := range c.nodes[1:] {
		if err := r.join(first.node); err != nil {
			c.destroy()
			return nil, fmt.Errorf("join %s to %s: %w", r.node, first.node, err)
		}
	}
	if err := c.waitMembers(); err != nil {
		c.destroy()
		return nil, err
	}
	return c, nil
}

// join makes r a member of the cluster of node seed.
func (r *Rabbit) join(seed string) error {
	for _, args := range [][]string{{"stop_app"}, {"join_cluster", seed}, {"start_app"}} {
		if err := r.ctl(args...); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(rabbitReadyTimeout)
	for {
		err := r.probe()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after joining: %w", err)
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
	Type     string   `json:"type"`     // classic, quorum
	Node     string   `json:"node"`     // the leader (quorum) or home node (classic)
	Leader   string   `json:"leader"`   // quorum queues only
	Members  []string `json:"members"`  // quorum queues only
	Online   []string `json:"online"`   // quorum queues only: members that run
	Messages int      `json:"messages"` // ready and unacknowledged
	// Arguments are the queue's declared x-arguments.
	Arguments map[string]any `json:"arguments"`
}

// Queue returns what a running node's management API knows of a queue.
func (c *RabbitCluster) Queue(tb testing.TB, vhost, queue string) QueueInfo {
	tb.Helper()
	r, err := c.running()
	if err != nil {
		tb.Fatalf("meshtest: queue %s: %v", queue, err)
	}
	var q QueueInfo
	if err := r.apiInto(http.MethodGet, "/api/queues/"+url.PathEscape(vhost)+"/"+url.PathEscape(queue), nil, &q); err != nil {
		tb.Fatalf("meshtest: queue %s: %v", queue, err)
	}
	return q
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
