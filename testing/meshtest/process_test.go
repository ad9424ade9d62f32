package meshtest_test

import (
	"net"
	"net/url"
	"syscall"
	"testing"
	"time"

	"github.com/meshbox/meshbox/testing/meshtest"
)

// TestStartProcessMeshbox builds the real binary, runs a standalone node,
// reaches its NATS port and stops it with SIGTERM.
func TestStartProcessMeshbox(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the meshbox binary")
	}
	p := meshtest.StartProcess(t, "--node", "harness")
	u, err := url.Parse(p.NATSURL())
	if err != nil || u.Scheme != "nats" || u.Port() == "0" || u.Port() == "" {
		t.Fatalf("NATSURL: got %q (%v), want nats://host:port with a real port", p.NATSURL(), err)
	}
	c, err := net.DialTimeout("tcp", u.Host, 2*time.Second)
	if err != nil {
		t.Fatalf("dial the node's NATS port: %v", err)
	}
	c.Close()
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(); code != 0 {
		t.Fatalf("exit code after SIGTERM: got %d, want 0\n%s", code, p.Output())
	}
}
