package localnats

import (
	"runtime"
	"testing"

	"github.com/meshbox/meshbox/appliance/blobs"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// A client that opens a connection per request must not grow the node: the
// embedded server remembers only a few closed connections (by default it
// keeps 10,000, about 1 KB each).
func TestClosedConnectionsAreBounded(t *testing.T) {
	n, err := Start(Options{Addr: "127.0.0.1:0", Node: "alpha", DataDir: t.TempDir(), Anonymous: true, BlobMaxBytes: blobs.DefaultMaxBytes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	srv := n.NATS()
	own := srv.NumClients() // the node's own connections
	const conns = 3 * maxClosedClients
	for range conns {
		nc, err := nats.Connect(n.URL())
		if err != nil {
			t.Fatal(err)
		}
		nc.Close()
	}
	// Closing is asynchronous on the server: wait until every connection
	// the test opened is gone, then count what is remembered.
	for srv.NumClients() > own {
		runtime.Gosched()
	}
	cz, err := srv.Connz(&server.ConnzOptions{State: server.ConnClosed, Limit: conns})
	if err != nil {
		t.Fatal(err)
	}
	if cz.Total > maxClosedClients {
		t.Errorf("closed connections remembered: got %d, want at most %d", cz.Total, maxClosedClients)
	}
}
