package e2e

import (
	"net"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/testing/meshtest"
)

// TestNotifiesSystemd: run as a Type=notify service (NOTIFY_SOCKET set),
// the node says READY=1 once it serves (its NATS server answers) and
// STOPPING=1 when it is told to stop.
func TestNotifiesSystemd(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "notify")
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan string, 8)
	go func() {
		buf := make([]byte, 256)
		for {
			n, err := l.Read(buf)
			if err != nil {
				return
			}
			got <- string(buf[:n])
		}
	}()
	p := meshtest.StartProcessEnv(t, []string{"NOTIFY_SOCKET=" + sock}, "--node", "solo")
	select {
	case s := <-got:
		if s != "READY=1" {
			t.Fatalf("first notification: %q, want READY=1", s)
		}
		nc, err := nats.Connect(p.NATSURL(), nats.Timeout(2*time.Second))
		if err != nil {
			t.Fatalf("READY=1 came, but the node's NATS server does not answer: %v", err)
		}
		nc.Close()
	case <-time.After(20 * time.Second):
		t.Fatal("no READY=1 from the node")
	}
	p.Signal(syscall.SIGTERM)
	select {
	case s := <-got:
		if s != "STOPPING=1" {
			t.Errorf("notification on SIGTERM: %q, want STOPPING=1", s)
		}
	case <-time.After(20 * time.Second):
		t.Error("no STOPPING=1 from the node")
	}
	if code := p.Wait(); code != 0 {
		t.Errorf("node exited with %d", code)
	}
}
