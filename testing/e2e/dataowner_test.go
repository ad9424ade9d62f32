package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshbox/meshbox/testing/meshtest"
)

// TestDataDirOwnedByAnotherUser: a node running as its own user (nobody
// here) in a data directory where root left a file (make run as root, a
// root node once) says which file, whose it is, and the chown that fixes
// it, instead of failing later on "permission denied". The control: once
// chowned, the same node starts. Runs as root, as make test does.
func TestDataDirOwnedByAnotherUser(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Fatal("needs root (as make test runs): it runs the node as another user")
	}
	top, err := os.MkdirTemp("", "meshbox-owner-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(top) })
	if err := os.Chmod(top, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(top, "meshbox")
	raw, err := os.ReadFile(meshtest.Binary(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, raw, 0o755); err != nil {
		t.Fatal(err)
	}
	const nobody = 65534
	data := filepath.Join(top, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(data, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	stray := filepath.Join(data, "cache.db")
	if err := os.WriteFile(stray, nil, 0o600); err != nil { // root's
		t.Fatal(err)
	}
	run := func() (string, error) {
		cmd := exec.Command(bin, "run", "--data", data, "--nats", "127.0.0.1:0", "--http", "127.0.0.1:0", "--node", "shed")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + top}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return "", err
		}
		cmd.Stderr = cmd.Stdout
		if err := cmd.Start(); err != nil {
			return "", err
		}
		done := make(chan error, 1)
		var buf strings.Builder
		go func() {
			b := make([]byte, 4096)
			for {
				n, err := out.Read(b)
				buf.Write(b[:n])
				if strings.Contains(buf.String(), "node ready") {
					_ = cmd.Process.Signal(syscall.SIGTERM)
				}
				if err != nil {
					done <- cmd.Wait()
					return
				}
			}
		}()
		select {
		case err := <-done:
			return buf.String(), err
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			return buf.String(), <-done
		}
	}
	out, err := run()
	if err == nil || !strings.Contains(out, stray+" belongs to root (uid 0)") || !strings.Contains(out, "chown -R nobody: "+data) {
		t.Fatalf("node as nobody with root's file in its data directory: %v\n%s\nwant it to name the file, root and the chown", err, out)
	}
	if err := os.Chown(stray, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	if out, err := run(); !strings.Contains(out, "node ready") {
		t.Errorf("after the chown the node does not start: %v\n%s", err, out)
	}
}
