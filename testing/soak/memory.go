package soak

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Memory is one reading of a process's memory, in kB as /proc reports it.
type Memory struct {
	At   time.Time
	RSS  int64 // VmRSS
	Anon int64 // RssAnon: the heap and stacks, without mapped files
}

// ReadMemory reads the memory of process pid from /proc/<pid>/status.
func ReadMemory(pid int) (Memory, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Memory{}, fmt.Errorf("read memory: %w", err)
	}
	defer f.Close()
	m := Memory{At: time.Now()}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var dst *int64
		switch key {
		case "VmRSS":
			dst = &m.RSS
		case "RssAnon":
			dst = &m.Anon
		default:
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(val), " kB"), 10, 64)
		if err != nil {
			return Memory{}, fmt.Errorf("read memory: %s: %q", key, val)
		}
		*dst = n
	}
	if err := sc.Err(); err != nil {
		return Memory{}, fmt.Errorf("read memory: %w", err)
	}
	return m, nil
}

// Slope is the least-squares slope of y over x; 0 with fewer than two
// points.
func Slope(x, y []float64) float64 {
	n := float64(len(x))
	if len(x) < 2 || len(x) != len(y) {
		return 0
	}
	var sx, sy, sxx, sxy float64
	for i := range x {
		sx += x[i]
		sy += y[i]
		sxx += x[i] * x[i]
		sxy += x[i] * y[i]
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / d
}

// AnonSlope is the growth of anonymous memory in MB per minute over the
// samples taken at or after from.
func AnonSlope(samples []Memory, from time.Time) (slope float64, n int) {
	var x, y []float64
	for _, s := range samples {
		if s.At.Before(from) {
			continue
		}
		x = append(x, s.At.Sub(from).Minutes())
		y = append(y, float64(s.Anon)/1024)
	}
	return Slope(x, y), len(x)
}
