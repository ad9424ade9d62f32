package meshtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

var binary struct {
	mu   sync.Mutex
	dir  string // temp dir holding the binary; removed by Main
	path string
	err  error
}

// Binary builds ./cmd/meshbox of this module once per test process and
// returns the path of the executable. The module root is found by walking
// up from the working directory to go.mod. If the build failed, every
// caller fails with its output.
func Binary(tb testing.TB) string {
	tb.Helper()
	binary.mu.Lock()
	defer binary.mu.Unlock()
	if binary.path == "" && binary.err == nil {
		start := time.Now()
		binary.path, binary.err = buildBinary()
		if binary.err == nil {
			tb.Logf("meshtest: built meshbox in %v", time.Since(start).Round(time.Millisecond))
		}
	}
	if binary.err != nil {
		tb.Fatalf("meshtest: build meshbox: %v", binary.err)
	}
	return binary.path
}

// BinaryVersion builds ./cmd/meshbox stamped with version (as make build
// stamps a release) into a directory removed in tb's Cleanup, and returns
// the executable's path: a second build for tests that replace a node's
// binary, an upgrade say. Run it with StartBinary.
func BinaryVersion(tb testing.TB, version string) string {
	tb.Helper()
	root, err := moduleRoot()
	if err != nil {
		tb.Fatalf("meshtest: build meshbox %s: %v", version, err)
	}
	path := filepath.Join(tb.TempDir(), "meshbox")
	start := time.Now()
	if err := goBuild(root, path, "-ldflags", "-X github.com/meshbox/meshbox/appliance.version="+version); err != nil {
		tb.Fatalf("meshtest: build meshbox %s: %v", version, err)
	}
	tb.Logf("meshtest: built meshbox %s in %v", version, time.Since(start).Round(time.Millisecond))
	return path
}

func buildBinary() (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", fmt.Sprintf("%sbin-%d-", dirPrefix, os.Getpid()))
	if err != nil {
		return "", err
	}
	binary.dir = dir
	path := filepath.Join(dir, "meshbox")
	if err := goBuild(root, path); err != nil {
		return "", err
	}
	return path, nil
}

// goBuild runs go build [flags] -o path ./cmd/meshbox in the module root.
func goBuild(root, path string, flags ...string) error {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goroot := os.Getenv("GOROOT")
		if goroot == "" {
			return errors.New("go tool not found on PATH and GOROOT not set")
		}
		goTool = filepath.Join(goroot, "bin", "go")
	}
	args := append(append([]string{"build"}, flags...), "-o", path, "./cmd/meshbox")
	cmd := exec.Command(goTool, args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/meshbox in %s: %w\n%s", root, err, out)
	}
	return nil
}

// moduleRoot walks up from the working directory to the directory holding
// go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// removeBinary removes the built binary, if any.
func removeBinary() {
	binary.mu.Lock()
	defer binary.mu.Unlock()
	if binary.dir != "" {
		os.RemoveAll(binary.dir)
	}
	binary.dir, binary.path, binary.err = "", "", nil
}
