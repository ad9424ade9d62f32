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

// BinaryEnv names an executable of meshbox built from this checkout for
// the tests to run instead of building their own: make test builds it
// once (make build) and every test binary shares it, where each would
// otherwise build and link its own, all at once.
const BinaryEnv = "MESHTEST_MESHBOX"

// Binary returns the path of the meshbox executable the tests run: the one
// BinaryEnv names, or else ./cmd/meshbox of this module built once per
// test process. The module root is found by walking up from the working
// directory to go.mod. If the build failed, every caller fails with its
// output.
func Binary(tb testing.TB) string {
	tb.Helper()
	binary.mu.Lock()
	defer binary.mu.Unlock()
	if binary.path == "" && binary.err == nil {
		if p := os.Getenv(BinaryEnv); p != "" {
			binary.path, binary.err = sharedBinary(p)
		} else {
			start := time.Now()
			binary.path, binary.err = buildBinary()
			if binary.err == nil {
				tb.Logf("meshtest: built meshbox in %v", time.Since(start).Round(time.Millisecond))
			}
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

// sharedBinary checks that p, from BinaryEnv, is an executable file.
func sharedBinary(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("%s=%s: %w", BinaryEnv, p, err)
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return "", fmt.Errorf("%s=%s: %w (make build makes it; unset %s and the tests build their own)", BinaryEnv, p, err, BinaryEnv)
	}
	if !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%s=%s: not an executable file", BinaryEnv, p)
	}
	return abs, nil
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

// goBuild runs go build [flags] -o path ./cmd/meshbox in the module root,
// as make build and make dist build it (static, -trimpath): the packages
// compiled for one are the others' too, whichever builds first.
func goBuild(root, path string, flags ...string) error {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goroot := os.Getenv("GOROOT")
		if goroot == "" {
			return errors.New("go tool not found on PATH and GOROOT not set")
		}
		goTool = filepath.Join(goroot, "bin", "go")
	}
	args := append(append([]string{"build", "-trimpath"}, flags...), "-o", path, "./cmd/meshbox")
	cmd := exec.Command(goTool, args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
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
