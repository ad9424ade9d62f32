package bench

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/meshbox/meshbox/testing/meshtest"
)

// idleWindow is how long the idle processes are measured, after
// idleSettle for their start to be over.
const (
	idleWindow = time.Minute
	idleSettle = 5 * time.Second
)

// plainNATSChildEnv makes this test binary a plain embedded NATS server
// (TestPlainNATSChild), the baseline of the idle benchmark.
const plainNATSChildEnv = "MESHBOX_BENCH_PLAIN_NATS_CHILD"

// BenchmarkIdleCPU measures the CPU an idle standalone node uses (nothing
// connected, no database, no broker) against a plain embedded NATS server,
// each a process of its own, measured side by side over a minute. It
// prints
//
//	BENCH idle-cpu ours=<% of a core> baseline=<% of a core> ratio=<ours/baseline>
//
// Lower is better; target: ours under 0.05 % of a core.
func BenchmarkIdleCPU(b *testing.B) {
	for range b.N {
		node := meshtest.StartProcess(b, "--node", "idle")
		plain := startPlainNATS(b)
		time.Sleep(idleSettle) // real time is the thing under test here
		nodeStart, plainStart := cpuTime(b, node.Pid()), cpuTime(b, plain.Process.Pid)
		start := time.Now()
		time.Sleep(idleWindow)
		wall := time.Since(start)
		ours := percentOfCore(cpuTime(b, node.Pid())-nodeStart, wall)
		baseline := percentOfCore(cpuTime(b, plain.Process.Pid)-plainStart, wall)
		b.Logf("idle over %s: node %.3f%% of a core, plain NATS %.3f%%", wall.Round(time.Second), ours, baseline)
		fmt.Printf("BENCH idle-cpu ours=%.3f baseline=%.3f ratio=%.2f unit=%%core (CPU of an idle standalone node, lower is better; target ours < 0.05)\n",
			ours, baseline, idleRatio(ours, baseline))
	}
}

func idleRatio(ours, baseline float64) float64 {
	if baseline == 0 {
		return 0
	}
	return ours / baseline
}

func percentOfCore(cpu, wall time.Duration) float64 {
	return 100 * float64(cpu) / float64(wall)
}

// cpuTime is the CPU time (user and system) process pid used so far: the
// sum of its threads' run times from /proc/<pid>/task/*/schedstat
// (nanoseconds; finer than the clock ticks of /proc/<pid>/stat).
func cpuTime(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(tasks) == 0 {
		tb.Fatalf("read the CPU time of process %d: no tasks (%v)", pid, err)
	}
	var total time.Duration
	for _, path := range tasks {
		data, err := os.ReadFile(path)
		if err != nil {
			continue // the thread ended
		}
		ns, err := strconv.ParseInt(strings.Fields(string(data))[0], 10, 64)
		if err != nil {
			tb.Fatalf("parse %s: %v", path, err)
		}
		total += time.Duration(ns)
	}
	return total
}

// startPlainNATS runs this test binary as a plain embedded NATS server
// (the same server version and options a node uses: loopback, random
// port) and stops it when the benchmark ends.
func startPlainNATS(b *testing.B) *exec.Cmd {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestPlainNATSChild$", "-test.bench=^$")
	cmd.Env = append(os.Environ(), plainNATSChildEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	// The child prints "ready" once it accepts clients.
	buf := make([]byte, 64)
	n, _ := out.Read(buf)
	if !strings.Contains(string(buf[:n]), "ready") {
		b.Fatalf("plain NATS child did not start: %q", buf[:n])
	}
	return cmd
}

// TestPlainNATSChild is the baseline process of BenchmarkIdleCPU: when
// started by it, it runs a plain embedded NATS server until SIGTERM.
// Otherwise it does nothing.
func TestPlainNATSChild(t *testing.T) {
	if os.Getenv(plainNATSChildEnv) == "" {
		t.Skip("only run by BenchmarkIdleCPU")
	}
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, MaxPayload: server.MAX_PAYLOAD_SIZE})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("not ready")
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM)
	fmt.Println("ready")
	<-stop
	srv.Shutdown()
	srv.WaitForShutdown()
}
