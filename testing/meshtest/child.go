package meshtest

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// account is the system user a service runs as. A nil *account means the
// current user.
type account struct {
	name     string
	uid, gid uint32
}

// serviceAccount returns the account a service must run as: the named system
// user when this process runs as root (PostgreSQL refuses to run as root, and
// RabbitMQ's files should not belong to root), otherwise the current user.
func serviceAccount(name string) (*account, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("running as root needs system user %q (install the service with testing/services.sh): %w", name, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s: uid %q: %w", name, u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s: gid %q: %w", name, u.Gid, err)
	}
	return &account{name: name, uid: uint32(uid), gid: uint32(gid)}, nil
}

// dirPrefix is the prefix of every directory the harness creates under
// os.TempDir(); the creator's pid follows it, so that stale directories of
// dead test processes can be found and removed.
const dirPrefix = "meshtest-"

// instanceDir creates a fresh directory for one service instance directly
// under os.TempDir() (t.TempDir()'s parents are private to the test user, so
// a service running as another user could not reach it) and hands it to acc.
func instanceDir(kind string, acc *account) (string, error) {
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%s-%d-", dirPrefix, kind, os.Getpid()))
	if err != nil {
		return "", fmt.Errorf("instance dir: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("instance dir: %w", err)
	}
	if err := chownTree(dir, acc); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// chownTree gives dir and everything below it to acc (nil: nothing to do).
func chownTree(dir string, acc *account) error {
	if acc == nil {
		return nil
	}
	err := filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, int(acc.uid), int(acc.gid))
	})
	if err != nil {
		return fmt.Errorf("chown %s to %s: %w", dir, acc.name, err)
	}
	return nil
}

// writeOwned writes a file and hands it to acc.
func writeOwned(path string, data []byte, acc *account) error {
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return err
	}
	if acc != nil {
		return os.Chown(path, int(acc.uid), int(acc.gid))
	}
	return nil
}

// removeStaleDirs removes instance directories left behind by test processes
// that no longer run (a test binary that panicked or timed out never gets
// to its cleanup). Best effort: errors are ignored.
func removeStaleDirs() {
	entries, err := os.ReadDir(os.TempDir())
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || !strings.HasPrefix(name, dirPrefix) {
			continue
		}
		// meshtest-<kind>-<pid>-<random>
		parts := strings.Split(name, "-")
		if len(parts) < 4 {
			continue
		}
		pid, err := strconv.Atoi(parts[2])
		if err != nil || pid <= 0 || pid == os.Getpid() || processAlive(pid) {
			continue
		}
		os.RemoveAll(filepath.Join(os.TempDir(), name))
	}
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// child is one run of a service's server process. The process leads its own
// process group, so that Kill takes its helpers with it.
type child struct {
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{} // closed when the process has exited and was reaped
	err  error         // the result of Wait; read only after done is closed
}

// startChild starts a service process as acc with dir as working directory,
// appending its stdout and stderr to logPath.
func startChild(path string, args []string, dir string, env []string, acc *account, logPath string) (*child, error) {
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	cmd := exec.Command(path, args...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = childAttr(acc)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", filepath.Base(path), err)
	}
	c := &child{cmd: cmd, log: logf, done: make(chan struct{})}
	// Reaper: exits when the process exits.
	go func() {
		c.err = cmd.Wait()
		logf.Close()
		close(c.done)
	}()
	return c, nil
}

// exited reports whether the process has exited.
func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the process itself.
func (c *child) signal(sig syscall.Signal) {
	if !c.exited() {
		_ = c.cmd.Process.Signal(sig)
	}
}

// killGroup sends SIGKILL to the whole process group, waits for the leader
// to be reaped and, briefly, for the rest of the group to disappear.
func (c *child) killGroup() {
	pgid := c.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-c.done
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) && syscall.Kill(-pgid, 0) == nil {
		time.Sleep(10 * time.Millisecond)
	}
}

// wait waits up to d for the process to exit and reports whether it did.
func (c *child) wait(d time.Duration) bool {
	select {
	case <-c.done:
		return true
	case <-time.After(d):
		return false
	}
}

// tailFile returns the last n lines of a file, for failure messages.
func tailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	data = bytes.TrimRight(data, "\n")
	lines := bytes.Split(data, []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// cleanEnv returns this process's environment without variables that start
// with any of the given prefixes, plus extra.
func cleanEnv(dropPrefixes []string, extra ...string) []string {
	var env []string
next:
	for _, kv := range os.Environ() {
		for _, p := range dropPrefixes {
			if strings.HasPrefix(kv, p) {
				continue next
			}
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

var nameMu sync.Mutex
var nameSeq = map[string]int{}

// uniqueName turns a test name into an identifier made of [a-z0-9_-] (with
// sep as the only separator) of at most max bytes, unique within this
// process.
func uniqueName(testName string, sep byte, max int) string {
	var b strings.Builder
	lastSep := true
	for _, r := range strings.ToLower(testName) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
			lastSep = false
		default:
			if !lastSep {
				b.WriteByte(sep)
				lastSep = true
			}
		}
	}
	base := strings.TrimRight(b.String(), string(sep))
	if base == "" || base[0] < 'a' || base[0] > 'z' {
		base = "t" + string(sep) + base
	}
	nameMu.Lock()
	nameSeq[base]++
	n := nameSeq[base]
	nameMu.Unlock()
	suffix := fmt.Sprintf("%c%d%c%d", sep, os.Getpid(), sep, n)
	if len(base)+len(suffix) > max {
		base = strings.TrimRight(base[:max-len(suffix)], string(sep))
	}
	return base + suffix
}
