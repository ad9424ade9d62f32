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
// idleSettle for their start to be over: the node's start connects and
// subscribes, and the watcher of local interest looks often for ten
// seconds after that (appliance.interestBusyFor).
const (
	idleWindow = time.Minute
	idleSettle = 15 * time.Second
	// idleTarget is the most CPU an idle standalone node may use, in % of
	// a core.
	idleTarget = 0.05
)

// plainNATSChildEnv makes this test binary a plain embedded NATS server
// (see TestMain), the baseline of the idle benchmark.
const plainNATSChildEnv = "MESHBOX_BENCH_PLAIN_NATS_CHILD"

// BenchmarkIdleCPU measures the CPU an idle standalone node uses (nothing
// connected, no database, no broker) against a plain embedded NATS server,
// each a process of its own, started together and measured side by side
// over the same minute. It prints
//
//	BENCH idle-cpu ours=<% of a core> baseline=<% of a core> ratio=<ours/baseline> ... target=<% of a core>
//
// with the wake-ups per second of each process (voluntary context
// switches of all its threads: what an idle process's CPU is made of) and
// the machine's load average. Lower is better. CPU time is the threads'
// run time from schedstat (nanoseconds), not the 10 ms clock ticks of
// /proc/<pid>/stat, which would be 0.017 % of a core coarse over a minute.
// An idle process's CPU depends little on other load, but its wake-ups
// cost more on a busy machine (cold caches): the load is printed for that.
func BenchmarkIdleCPU(b *testing.B) {
	for range b.N {
		node := meshtest.StartProcess(b, "--node", "idle")
		plain := startPlainNATS(b)
		time.Sleep(idleSettle) // real time is the thing under test here
		nodeStart, plainStart := sampleProcess(b, node.Pid()), sampleProcess(b, plain.Process.Pid)
		start := time.Now()
		time.Sleep(idleWindow)
		wall := time.Since(start)
		nodeUse := sampleProcess(b, node.Pid()).since(nodeStart, wall)
		plainUse := sampleProcess(b, plain.Process.Pid).since(plainStart, wall)
		load := loadAverage()
		b.Logf("idle over %s: node %.4f%% of a core, %.1f wake-ups/s; plain NATS %.4f%%, %.1f wake-ups/s; load average %s",
			wall.Round(time.Second), nodeUse.percent, nodeUse.wakeups, plainUse.percent, plainUse.wakeups, load)
		fmt.Printf("BENCH idle-cpu ours=%.4f baseline=%.4f ratio=%.2f unit=%%core wakeups_ours=%.1f/s wakeups_baseline=%.1f/s window=%s load=%s target=ours<%.2f (CPU of an idle standalone node against a plain embedded NATS server, lower is better)\n",
			nodeUse.percent, plainUse.percent, idleRatio(nodeUse.percent, plainUse.percent),
			nodeUse.wakeups, plainUse.wakeups, wall.Round(time.Second), load, idleTarget)
	}
}

func idleRatio(ours, baseline float64) float64 {
	if baseline == 0 {
		return 0
	}
	return ours / baseline
}

// processSample is what a process's threads used so far.
type processSample struct {
	cpu      time.Duration // run time on a CPU, user and system
	switches int64         // voluntary context switches: each one a sleep, and so a wake-up
}

// idleUse is what a process used over a window.
type idleUse struct {
	percent float64 // of one core
	wakeups float64 // per second
}

func (s processSample) since(prev processSample, wall time.Duration) idleUse {
	return idleUse{
		percent: 100 * float64(s.cpu-prev.cpu) / float64(wall),
		wakeups: float64(s.switches-prev.switches) / wall.Seconds(),
	}
}

// sampleProcess sums, over the threads of process pid, their run time
// from /proc/<pid>/task/*/schedstat (nanoseconds) and their voluntary
// context switches from /proc/<pid>/task/*/status. (A Go process keeps
// its threads: one that ended within the window would be missed.)
func sampleProcess(tb testing.TB, pid int) processSample {
	tb.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	if err != nil || len(tasks) == 0 {
		tb.Fatalf("read the CPU time of process %d: no tasks (%v)", pid, err)
	}
	var total processSample
	for _, task := range tasks {
		data, err := os.ReadFile(filepath.Join(task, "schedstat"))
		if err != nil {
			continue // the thread ended
		}
		ns, err := strconv.ParseInt(strings.Fields(string(data))[0], 10, 64)
		if err != nil {
			tb.Fatalf("parse %s/schedstat: %v", task, err)
		}
		total.cpu += time.Duration(ns)
		status, err := os.ReadFile(filepath.Join(task, "status"))
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(status)) {
			if v, ok := strings.CutPrefix(line, "voluntary_ctxt_switches:"); ok {
				n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				if err != nil {
					tb.Fatalf("parse %s/status: %v", task, err)
				}
				total.switches += n
			}
		}
	}
	return total
}

// loadAverage is the machine's one-minute load average ("?" when it
// cannot be read).
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(data)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

// startPlainNATS runs this test binary as a plain embedded NATS server
// (the same server version and options a node uses: loopback, random
// port) and stops it when the benchmark ends.
func startPlainNATS(b *testing.B) *exec.Cmd {
	b.Helper()
	cmd := exec.Command(os.Args[0])
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

// TestMain runs the tests and benchmarks, or, when the idle benchmark
// started this binary as its baseline (plainNATSChildEnv set), a plain
// embedded NATS server until SIGTERM.
func TestMain(m *testing.M) {
	if os.Getenv(plainNATSChildEnv) != "" {
		os.Exit(runPlainNATSChild())
	}
	os.Exit(m.Run())
}

// runPlainNATSChild is the baseline process of BenchmarkIdleCPU.
func runPlainNATSChild() int {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, MaxPayload: server.MAX_PAYLOAD_SIZE})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		fmt.Fprintln(os.Stderr, "plain NATS server not ready after 10s")
		return 1
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM)
	fmt.Println("ready")
	<-stop
	srv.Shutdown()
	srv.WaitForShutdown()
	return 0
}
