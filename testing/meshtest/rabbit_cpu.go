package meshtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// clockTick is the kernel's USER_HZ, the unit of /proc/<pid>/stat's CPU
// times (100 on every Linux architecture meshbox builds for).
const clockTick = 100

// CPUTime returns the user and system CPU time the broker's Erlang VM has
// used so far (from /proc), for benchmarks that compare the broker's work
// per message of two workloads.
func (r *Rabbit) CPUTime(tb testing.TB) time.Duration {
	tb.Helper()
	d, err := r.cpuTime()
	if err != nil {
		tb.Fatalf("broker CPU time: %v", err)
	}
	return d
}

func (r *Rabbit) cpuTime() (time.Duration, error) {
	raw, err := os.ReadFile(filepath.Join(r.dir, "rabbitmq.pid"))
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		return 0, fmt.Errorf("pid file: %w", err)
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces:
	// the fields counted from the last ')' are fixed.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad CPU times", pid)
	}
	return time.Duration(ut+st) * time.Second / clockTick, nil
}
