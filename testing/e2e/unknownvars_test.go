package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/meshbox/meshbox/testing/meshtest"
)

// TestRunWarnsUnknownVariables: a node started with a misspelt variable
// in its env file and another in its environment says so at start, one
// line each with the name meant, and runs on.
func TestRunWarnsUnknownVariables(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the meshbox binary")
	}
	t.Parallel()
	envFile := filepath.Join(t.TempDir(), "meshbox.env")
	if err := os.WriteFile(envFile, []byte("MESHBOX_NAT=127.0.0.1:4333\nMESHBOX_LOG_LEVEL=info\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := meshtest.StartProcessEnv(t, []string{"MESHBOX_LOGLEVEL=debug"}, "--node", "attic", "--env-file", envFile)
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(); code != 0 {
		t.Fatalf("stop: exit %d\n%s", code, p.Output())
	}
	log := p.Output()
	for _, want := range []string{
		"unknown variable MESHBOX_NAT in " + envFile + " is ignored; did you mean MESHBOX_NATS?",
		"unknown variable MESHBOX_LOGLEVEL in the environment is ignored; did you mean MESHBOX_LOG_LEVEL?",
	} {
		if n := strings.Count(log, want); n != 1 {
			t.Errorf("the log holds %q %d times, want once:\n%s", want, n, log)
		}
	}
	if n := strings.Count(log, "unknown variable"); n != 2 {
		t.Errorf("the log warns of %d unknown variables, want 2:\n%s", n, log)
	}
}
