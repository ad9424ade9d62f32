package e2e

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshbox/meshbox/testing/meshtest"
	bolt "go.etcd.io/bbolt"
)

// TestOlderBinaryRefusesNewerCache: a node's data directory holds a cache
// written by a newer meshbox (a downgrade). The node does not start on it
// and says why: the file, its format and the formats this binary reads.
func TestOlderBinaryRefusesNewerCache(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	data := t.TempDir()
	p := meshtest.StartProcess(t, "--node", "attic", "--data", data)
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(); code != 0 {
		t.Fatalf("first run: exit code %d, want 0", code)
	}
	path := filepath.Join(data, "cache.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("meta")).Put([]byte("format"), []byte("99")) })
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	code, out := meshtest.StartProcessExpectFailure(t, "--node", "attic", "--data", data)
	if code == 0 {
		t.Fatalf("start on a newer cache: exit code 0, want a refusal:\n%s", out)
	}
	for _, want := range []string{path, "format 99", "newer meshbox", "up to 1"} {
		if !strings.Contains(out, want) {
			t.Errorf("refusal lacks %q:\n%s", want, out)
		}
	}
	if m, _ := filepath.Glob(path + ".corrupt-*"); len(m) > 0 {
		t.Errorf("the newer cache was set aside as damaged: %v", m)
	}
}
