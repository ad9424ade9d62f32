package e2e

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// The tables of rows on the node's broker link: over TLS with a private
// CA, with a client certificate's login, and across a failover between
// the brokers of a cluster. Each node writes rows of its own; every node
// must end with every row acknowledged, and none that no write made.

// linkedNode is a node of these tests and a client of its NATS server.
type linkedNode struct {
	p  *meshtest.Process
	nc *nats.Conn
}

// linkConfigFile writes a configuration file with the bridge settings
// given and returns its path.
func linkConfigFile(t *testing.T, settings map[string]string) string {
	t.Helper()
	data, err := json.Marshal(map[string]any{"bridge": settings})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "meshbox.json")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// startLinked starts a node per name with args(name), and waits until
// each is connected to the broker, holds the mesh's keys and reads
// table's log through an extra connection of its link (role rows, on the
// link's broker, as user(name) when user is not nil).
func startLinked(t *testing.T, names []string, table string, args func(name string) []string, user func(name string) string) map[string]*linkedNode {
	t.Helper()
	nodes := map[string]*linkedNode{}
	for _, n := range names {
		nodes[n] = &linkedNode{p: meshtest.StartProcess(t, append([]string{"--node", n}, args(n)...)...)}
	}
	for _, n := range names {
		nd := nodes[n]
		meshtest.WaitStatus(t, nd.p.HTTPURL(), 30*time.Second, n+" connected to the broker", func(s appliance.Status) bool { return s.Broker.State == "connected" })
		waitKeysInStep(t, nd.p)
		waitTable(t, nd.p, table, 30*time.Second, "reading its log", func(ts rows.TableStatus) bool { return ts.Synced })
		var want string
		if user != nil {
			want = user(n)
		}
		meshtest.WaitStatus(t, nd.p.HTTPURL(), 10*time.Second, n+": the tables' connection in the link's status", func(s appliance.Status) bool {
			return rowsConnOn(s, s.Broker.Broker, want)
		})
		nd.nc = natsConn(t, nd.p)
	}
	return nodes
}

// rowsConnOn reports whether s lists the tables' connection on broker
// (and logged in as user, unless "").
func rowsConnOn(s appliance.Status, broker, user string) bool {
	for _, x := range s.Broker.Extra {
		if x.Role == "rows" && x.Broker == broker && (user == "" || x.User == user) {
			return true
		}
	}
	return false
}

// rowLedger records the rows written: each row once, by one node.
type rowLedger struct {
	mu         sync.Mutex
	acked      map[string]rows.Written // row -> the answer
	unanswered map[string]bool         // no answer: written or not
	refused    int
}

func newRowLedger() *rowLedger {
	return &rowLedger{acked: map[string]rows.Written{}, unanswered: map[string]bool{}}
}

// write puts row on nc, its value the row's name, and records the outcome.
func (l *rowLedger) write(nc *nats.Conn, table, row string) {
	var ans rows.Written
	code, err := rowsCall(nc, table, rows.OpPut, rows.Request{Row: row, Set: map[string]string{"v": row}}, &ans, 5*time.Second)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case err == nil:
		l.acked[row] = ans
	case code != 0:
		l.refused++
	default:
		l.unanswered[row] = true
	}
}

func (l *rowLedger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked)
}

// writeRows has every node write n rows of its own, named
// <prefix><node>-NNNN.
func writeRows(t *testing.T, nodes map[string]*linkedNode, l *rowLedger, table, prefix string, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for name, nd := range nodes {
		wg.Go(func() { // writer: exits after its n rows
			for i := range n {
				l.write(nd.nc, table, fmt.Sprintf("%s%s-%04d", prefix, name, i))
			}
		})
	}
	wg.Wait()
}

// checkConverged waits until every node holds every acknowledged row as
// written, with nothing pending and the whole log read, and fails the
// test with the count of rows lost (acknowledged, not held) and
// unexpected (held, written by no write) on any node.
func checkConverged(t *testing.T, nodes map[string]*linkedNode, l *rowLedger, table string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	lost, unexpected, wrong := map[string]int{}, map[string]int{}, map[string]int{}
	var last string
	ok := meshtest.Poll(60*time.Second, func() bool {
		clear(lost)
		clear(unexpected)
		clear(wrong)
		last = ""
		for name, nd := range nodes {
			ts, listed := tableStatus(t, nd.p.HTTPURL(), table)
			if !listed || ts.Pending != 0 || !ts.Synced || ts.Behind != 0 {
				last = fmt.Sprintf("%s: %+v", name, ts)
				return false
			}
			held, err := listTable(nd.nc, table, "")
			if err != nil {
				last = err.Error()
				return false
			}
			for row, a := range l.acked {
				v, ok := held[row]["v"]
				switch {
				case !ok:
					lost[name]++
				case v.Value != row || v.Stamp != a.Stamp || v.Node != a.Node:
					wrong[name]++
				}
			}
			for row := range held {
				if _, ok := l.acked[row]; !ok && !l.unanswered[row] {
					unexpected[name]++
				}
			}
		}
		return len(lost) == 0 && len(unexpected) == 0 && len(wrong) == 0
	})
	t.Logf("rows: %d acknowledged, %d unanswered, %d refused; per node lost %v, unexpected %v, changed %v",
		len(l.acked), len(l.unanswered), l.refused, lost, unexpected, wrong)
	if !ok {
		t.Errorf("the nodes' tables did not converge in 60s: lost %v, unexpected %v, changed %v; %s", lost, unexpected, wrong, last)
	}
	if l.refused != 0 {
		t.Errorf("%d writes refused, want none (a write is local)", l.refused)
	}
}

// TestRowsOverTLSAndClientCertificate: tables of two nodes converge on a
// broker whose certificate a private CA signed (bridge.ca_file), and on
// one where the nodes log in with client certificates (SASL EXTERNAL):
// the tables' connection is the link's, with its CA and certificate.
func TestRowsOverTLSAndClientCertificate(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	const table = "jobs"
	rmq := meshtest.RabbitMQTLS(t)
	names := []string{"alpha", "beta"}

	t.Run("private CA", func(t *testing.T) {
		_, broker := tlsVhost(t, rmq)
		db := rowsMesh(t, broker, names, map[string]string{"table." + table: "{}"})
		config := linkConfigFile(t, map[string]string{"ca_file": rmq.CAFile()})
		nodes := startLinked(t, names, table, func(string) []string {
			return []string{"--db", db, "--broker", broker, "--config", config, "--data", t.TempDir()}
		}, func(string) string { return "guest" })
		l := newRowLedger()
		writeRows(t, nodes, l, table, "tls-", 100)
		checkConverged(t, nodes, l, table)
	})

	t.Run("client certificate", func(t *testing.T) {
		vhost, _ := tlsVhost(t, rmq)
		broker := fmt.Sprintf("amqps://localhost:%d/%s", rmq.TLSPort(), url.PathEscape(vhost)) // no user: the certificate's
		db := rowsMesh(t, broker, names, map[string]string{"table." + table: "{}"})
		configs := map[string]string{}
		for _, n := range names {
			cert, key := rmq.ClientCert(t, n, vhost)
			configs[n] = linkConfigFile(t, map[string]string{"ca_file": rmq.CAFile(), "cert_file": cert, "key_file": key})
		}
		nodes := startLinked(t, names, table, func(n string) []string {
			return []string{"--db", db, "--broker", broker, "--config", configs[n], "--data", t.TempDir()}
		}, func(n string) string { return n })
		l := newRowLedger()
		writeRows(t, nodes, l, table, "cert-", 100)
		checkConverged(t, nodes, l, table)
	})
}

// TestRowsAcrossBrokerFailover: two nodes list the three brokers of a
// RabbitMQ cluster and write rows without a pause while the broker that
// alpha's link is on stops. Both links fail over, the tables' connections
// follow them (the status shows them on the new broker), and every
// node's tables converge: no acknowledged row lost, none unexpected.
func TestRowsAcrossBrokerFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel() // a cluster of its own
	const table = "jobs"
	c := meshtest.NewRabbitCluster(t)
	vhost := c.Vhost(t)
	urls := c.URLs(vhost)
	names := []string{"alpha", "beta"}
	db := rowsMesh(t, urls[0], names, map[string]string{"table." + table: "{}"})
	nodes := startLinked(t, names, table, func(string) []string {
		return []string{"--db", db, "--broker", strings.Join(urls, ","), "--data", t.TempDir()}
	}, nil)
	indexOf := func(broker string) int {
		return slices.IndexFunc(urls, func(u string) bool { return hostOf(t, u) == broker })
	}
	alpha := nodes["alpha"]
	on := indexOf(meshtest.Status(t, alpha.p.HTTPURL()).Broker.Broker)
	if on < 0 {
		t.Fatalf("alpha's link is on %q, none of the cluster's brokers", meshtest.Status(t, alpha.p.HTTPURL()).Broker.Broker)
	}

	l := newRowLedger()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for name, nd := range nodes {
		wg.Go(func() { // writer: exits when stop is closed
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				l.write(nd.nc, table, fmt.Sprintf("%s-%05d", name, i))
			}
		})
	}
	stopWriters := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopWriters)
	meshtest.WaitFor(t, 30*time.Second, "the first 100 rows written", func() bool { return l.count() >= 100 })

	stopped := time.Now()
	c.Stop(t, on)
	for _, n := range names {
		nd := nodes[n]
		st := meshtest.WaitStatus(t, nd.p.HTTPURL(), 60*time.Second, n+"'s link and tables' connection on a broker that runs", func(s appliance.Status) bool {
			i := indexOf(s.Broker.Broker)
			return s.Broker.State == "connected" && i >= 0 && i != on && rowsConnOn(s, s.Broker.Broker, "")
		})
		t.Logf("%s on broker %s %s after the stop", n, st.Broker.Broker, time.Since(stopped).Round(100*time.Millisecond))
	}
	for _, n := range names {
		waitTable(t, nodes[n].p, table, 60*time.Second, "reading its log again", func(ts rows.TableStatus) bool { return ts.Synced })
	}
	if fo := meshtest.Status(t, alpha.p.HTTPURL()).Broker.Failovers; len(fo) == 0 {
		t.Errorf("alpha's status records no failover")
	}
	atStop := l.count()
	meshtest.WaitFor(t, 30*time.Second, "100 more rows written after the failover", func() bool { return l.count() >= atStop+100 })
	stopWriters()
	checkConverged(t, nodes, l, table)
}
