package meshtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	// processReadyTimeout bounds how long StartProcess waits for the ready
	// line, and StartProcessExpectFailure for the exit.
	processReadyTimeout = 20 * time.Second
	// processStopTimeout is how long a process has to exit after SIGTERM
	// before it is killed.
	processStopTimeout = 10 * time.Second
	// processWaitTimeout bounds Wait.
	processWaitTimeout = 30 * time.Second
)

// readyMsg is the log message a node prints once it serves.
const readyMsg = "node ready"

// Process is a `meshbox run` child process. Its methods other than Output,
// NATSURL, HTTPURL and Node must be called from the test goroutine.
type Process struct {
	tb    testing.TB
	cmd   *exec.Cmd
	out   *outputBuffer
	done  chan struct{} // closed when the process has exited and was reaped
	ready readyInfo
	// outputShown is set when a failure message already holds the output.
	outputShown bool
}

type readyInfo struct {
	nats, http, node string
}

// StartProcess runs `meshbox run args...` (the binary from Binary) and
// waits up to 20 s for its "node ready" log line. Unless args set them, it
// adds --data (a fresh t.TempDir()), --nats 127.0.0.1:0 and --http
// 127.0.0.1:0. MESHBOX_* variables of the test's environment are not passed
// on. Standard output and error are captured (Output) and logged if the test
// fails. In tb's Cleanup the process gets SIGTERM and, after 10 s, SIGKILL.
func StartProcess(tb testing.TB, args ...string) *Process {
	tb.Helper()
	return StartProcessEnv(tb, nil, args...)
}

// StartProcessEnv is StartProcess with extra environment variables
// ("KEY=value", e.g. MESHBOX_DB=...) for the process.
func StartProcessEnv(tb testing.TB, env []string, args ...string) *Process {
	tb.Helper()
	return startProcess(tb, Binary(tb), env, withDefaults(tb, args))
}

// StartBinary is StartProcessEnv for another build of meshbox: bin (from
// BinaryVersion, say) instead of Binary's.
func StartBinary(tb testing.TB, bin string, env []string, args ...string) *Process {
	tb.Helper()
	return startProcess(tb, bin, env, withDefaults(tb, args))
}

// StartProcessExpectFailure runs `meshbox run args...` (with the same
// defaults as StartProcess) for a start that must be refused: it waits up
// to 20 s for the process to exit and returns its exit code and combined
// output. The test fails if the node reports ready or does not exit in time.
func StartProcessExpectFailure(tb testing.TB, args ...string) (exitCode int, output string) {
	tb.Helper()
	return expectFailure(tb, Binary(tb), nil, withDefaults(tb, args))
}

// withDefaults prepends "run" and adds the --data, --nats and --http flags
// args do not set.
func withDefaults(tb testing.TB, args []string) []string {
	tb.Helper()
	out := append([]string{"run"}, args...)
	if !hasFlag(args, "data") {
		out = append(out, "--data", tb.TempDir())
	}
	if !hasFlag(args, "nats") {
		out = append(out, "--nats", "127.0.0.1:0")
	}
	if !hasFlag(args, "http") {
		out = append(out, "--http", "127.0.0.1:0")
	}
	return out
}

// hasFlag reports whether args set flag name in any form the flag package
// accepts: -name, --name, -name=v, --name=v.
func hasFlag(args []string, name string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if !strings.HasPrefix(a, "-") {
			continue // a flag's value or an argument
		}
		a = strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		if a == name || strings.HasPrefix(a, name+"=") {
			return true
		}
	}
	return false
}

// launch starts bin with args and a cleaned environment plus env.
func launch(tb testing.TB, bin string, env, args []string) *Process {
	tb.Helper()
	p := &Process{tb: tb, out: newOutputBuffer(), done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = cleanEnv([]string{"MESHBOX_"}, env...)
	p.cmd.Stdout = p.out
	p.cmd.Stderr = p.out
	p.cmd.SysProcAttr = processAttr()
	// A grandchild holding the output pipes must not block the reaper.
	p.cmd.WaitDelay = 5 * time.Second
	if err := p.cmd.Start(); err != nil {
		tb.Fatalf("meshtest: start %s: %v", bin, err)
	}
	// Reaper: exits when the process exits (Cleanup makes sure it does).
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	return p
}

func startProcess(tb testing.TB, bin string, env, args []string) *Process {
	tb.Helper()
	start := time.Now()
	p := launch(tb, bin, env, args)
	tb.Cleanup(func() {
		p.stop()
		if tb.Failed() && !p.outputShown {
			tb.Logf("meshtest: output of %s:\n%s", p.describe(), p.Output())
		}
	})
	timer := time.NewTimer(processReadyTimeout)
	defer timer.Stop()
	select {
	case p.ready = <-p.out.readyc:
		tb.Logf("meshtest: %s ready in %v: nats %s http %s", p.describe(), time.Since(start).Round(time.Millisecond), p.ready.nats, p.ready.http)
		return p
	case <-p.done:
		select {
		case p.ready = <-p.out.readyc: // ready, then exited at once: the test sees it
			return p
		default:
		}
		p.outputShown = true
		tb.Fatalf("meshtest: %s exited with %s before it was ready; output:\n%s", p.describe(), p.cmd.ProcessState, p.Output())
	case <-timer.C:
		p.outputShown = true
		tb.Fatalf("meshtest: %s not ready after %v; output:\n%s", p.describe(), processReadyTimeout, p.Output())
	}
	return nil
}

func expectFailure(tb testing.TB, bin string, env, args []string) (int, string) {
	tb.Helper()
	p := launch(tb, bin, env, args)
	defer p.stop()
	timer := time.NewTimer(processReadyTimeout)
	defer timer.Stop()
	select {
	case <-p.out.readyc:
		p.stop()
		tb.Fatalf("meshtest: %s started, want a refused start; output:\n%s", p.describe(), p.Output())
	case <-p.done:
		return p.cmd.ProcessState.ExitCode(), p.Output()
	case <-timer.C:
		p.stop()
		tb.Fatalf("meshtest: %s did not exit within %v, want a refused start; output:\n%s", p.describe(), processReadyTimeout, p.Output())
	}
	return 0, ""
}

func (p *Process) describe() string {
	return fmt.Sprintf("meshbox %s (pid %d)", strings.Join(p.cmd.Args[1:], " "), p.cmd.Process.Pid)
}

// NATSURL returns the node's NATS URL from its ready line.
func (p *Process) NATSURL() string { return p.ready.nats }

// HTTPURL returns the node's HTTP base URL from its ready line (empty if
// HTTP is off).
func (p *Process) HTTPURL() string { return p.ready.http }

// Node returns the node name from the ready line, if the line carries one.
func (p *Process) Node() string { return p.ready.node }

// Pid returns the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Output returns everything the process wrote to stdout and stderr so far.
func (p *Process) Output() string { return p.out.String() }

// Signal sends sig to the process (if it still runs).
func (p *Process) Signal(sig os.Signal) {
	p.tb.Helper()
	if p.exited() {
		return
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		p.tb.Fatalf("meshtest: signal %s: %v", p.describe(), err)
	}
}

// Kill sends SIGKILL to the process and waits for it to exit.
func (p *Process) Kill() {
	p.tb.Helper()
	p.Signal(syscall.SIGKILL)
	<-p.done
}

// Wait waits for the process to exit and returns its exit code (-1 if a
// signal ended it). The test fails if it has not exited within 30 s.
func (p *Process) Wait() int {
	p.tb.Helper()
	select {
	case <-p.done:
	case <-time.After(processWaitTimeout):
		p.stop()
		p.tb.Fatalf("meshtest: %s did not exit within %v; output:\n%s", p.describe(), processWaitTimeout, p.Output())
	}
	return p.cmd.ProcessState.ExitCode()
}

func (p *Process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, waits up to processStopTimeout, then sends SIGKILL,
// and returns once the process was reaped.
func (p *Process) stop() {
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(processStopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// outputBuffer collects a process's output and watches it, line by line,
// for the ready line.
type outputBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	scanned int  // bytes of buf already split into lines
	found   bool // ready line seen
	readyc  chan readyInfo
}

func newOutputBuffer() *outputBuffer {
	return &outputBuffer{readyc: make(chan readyInfo, 1)}
}

func (b *outputBuffer) Write(data []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(data)
	for !b.found {
		rest := b.buf.Bytes()[b.scanned:]
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			break
		}
		line := string(rest[:i])
		b.scanned += i + 1
		if info, ok := parseReady(line); ok {
			b.found = true
			b.readyc <- info
		}
	}
	return len(data), nil
}

func (b *outputBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// parseReady recognises the node's ready log line, in slog's text format
// (msg="node ready" nats=... http=...) or JSON format.
func parseReady(line string) (readyInfo, bool) {
	line = strings.TrimSpace(line)
	if strings.HasPrefix(line, "{") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil || rec["msg"] != readyMsg {
			return readyInfo{}, false
		}
		str := func(k string) string { s, _ := rec[k].(string); return s }
		return readyInfo{nats: str("nats"), http: str("http"), node: str("node")}, true
	}
	if !strings.Contains(line, readyMsg) {
		return readyInfo{}, false
	}
	kv := parseLogfmt(line)
	if kv["msg"] != readyMsg {
		return readyInfo{}, false
	}
	return readyInfo{nats: kv["nats"], http: kv["http"], node: kv["node"]}, true
}

// parseLogfmt splits a line of key=value pairs as slog's text handler
// writes them; quoted values are unquoted. Pairs it cannot read are skipped.
func parseLogfmt(line string) map[string]string {
	kv := map[string]string{}
	for line != "" {
		line = strings.TrimLeft(line, " ")
		eq := strings.IndexByte(line, '=')
		if eq <= 0 {
			break
		}
		key := line[:eq]
		if strings.ContainsAny(key, " \"") {
			// Not a key: skip to the next space.
			sp := strings.IndexByte(line, ' ')
			if sp < 0 {
				break
			}
			line = line[sp:]
			continue
		}
		line = line[eq+1:]
		var val string
		if strings.HasPrefix(line, `"`) {
			q, err := strconv.QuotedPrefix(line)
			if err != nil {
				break
			}
			val, _ = strconv.Unquote(q)
			line = line[len(q):]
		} else {
			sp := strings.IndexByte(line, ' ')
			if sp < 0 {
				sp = len(line)
			}
			val = line[:sp]
			line = line[sp:]
		}
		kv[key] = val
	}
	return kv
}
