package rows

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Focused benchmarks of the engine's hot paths, without a broker: the
// store's commits of writes and of a joiner's snapshot, and a snapshot
// part's decoding. BenchmarkRows (testing/bench) measures the whole.

// speedChange is row i of the benchmarks: two fields as the bench writes.
func speedChange(i int) Change {
	return Change{Table: "bench", Row: fmt.Sprintf("w-%07d", i), Cells: CellsOf(map[string]WireCell{
		"status":  {Stamp: Stamp(1<<50 + i), Node: "rows-w", Value: []byte("queued")},
		"payload": {Stamp: Stamp(1<<50 + i), Node: "rows-w", Value: []byte(strings.Repeat("x", 64))},
	})}
}

// cpuPerRow reports, when the benchmark ends, this process's CPU time
// (user and system, the garbage collector's too) a row of rows a loop:
// on a machine shared with other work, steadier than the elapsed time.
func cpuPerRow(b *testing.B, rows int) {
	b.Helper()
	start := processCPU()
	b.Cleanup(func() {
		b.ReportMetric(float64((processCPU()-start).Microseconds())/float64(b.N*rows), "cpu-µs/row")
	})
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func speedStore(b *testing.B) *Store {
	b.Helper()
	s, err := OpenStore(filepath.Join(b.TempDir(), "rows.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// BenchmarkStoreApplySnapshot applies a snapshot of 100,000 rows to an
// empty store as a joiner does: runs of parts of 256 KiB, one commit a run.
func BenchmarkStoreApplySnapshot(b *testing.B) {
	const n, perPart, partsPerRun = 100000, 1600, 16
	changes := make([]Change, n)
	for i := range changes {
		changes[i] = speedChange(i)
	}
	cpuPerRow(b, n)
	for range b.N {
		s := speedStore(b)
		for i := 0; i < n; i += perPart * partsPerRun {
			if _, err := s.Apply("bench", changes[i:min(n, i+perPart*partsPerRun)], uint64(i)); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkDecodePart decodes a snapshot part of 1,600 rows.
func BenchmarkDecodePart(b *testing.B) {
	var p batch
	p.V, p.Kind, p.Node = 1, kindSnapshot, "rows-w"
	for i := range 1600 {
		p.Changes = append(p.Changes, speedChange(i))
	}
	body, _ := json.Marshal(&p)
	b.SetBytes(int64(len(body)))
	cpuPerRow(b, 1600)
	for range b.N {
		var q batch
		if err := json.Unmarshal(body, &q); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStoreWriteMany writes 100,000 rows in batches of 100, a
// commit each, as batch puts do.
func BenchmarkStoreWriteMany(b *testing.B) {
	const n, per = 100000, 100
	changes := make([]Change, n)
	for i := range changes {
		changes[i] = speedChange(i)
	}
	cpuPerRow(b, n)
	for range b.N {
		s := speedStore(b)
		for i := 0; i < n; i += per {
			if err := s.WriteMany(changes[i : i+per]); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkDecodePartDirect is BenchmarkDecodePart by decodeBatch,
// without encoding/json's two passes before the hand-written reader.
func BenchmarkDecodePartDirect(b *testing.B) {
	var p batch
	p.V, p.Kind, p.Node = 1, kindSnapshot, "rows-w"
	for i := range 1600 {
		p.Changes = append(p.Changes, speedChange(i))
	}
	body, _ := json.Marshal(&p)
	b.SetBytes(int64(len(body)))
	cpuPerRow(b, 1600)
	for range b.N {
		var q batch
		if err := decodeBatch(body, &q); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStoreRows reads a table of 100,000 rows, as a snapshot does.
func BenchmarkStoreRows(b *testing.B) {
	const n = 100000
	changes := make([]Change, n)
	for i := range changes {
		changes[i] = speedChange(i)
	}
	s := speedStore(b)
	if _, err := s.Apply("bench", changes, 1); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	cpuPerRow(b, n)
	for range b.N {
		got := 0
		if err := s.Rows("bench", "", func(string, map[string]Cell) bool { got++; return true }); err != nil || got != n {
			b.Fatal(got, err)
		}
	}
}

// BenchmarkOpenPart opens a sealed snapshot part of 1,600 rows and
// checks what it carries, as a joiner's reader does (openBatch: the
// seal, the decoding, the names and bounds of every row and cell), in
// binary (version 2, what a node writes) and in JSON (version 1, from
// nodes of before).
func BenchmarkOpenPart(b *testing.B) {
	ring, s := binTestRing(b)
	for _, v := range []int{snapshotV, 1} {
		b.Run(fmt.Sprintf("v%d", v), func(b *testing.B) {
			p := batch{V: v, Kind: kindSnapshot, Node: "rows-w", Snap: "s-rows-w", Part: 1, Parts: 1}
			for i := range 1600 {
				p.Changes = append(p.Changes, speedChange(i))
			}
			body, err := sealBatch(s, "bench", &p)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(body)))
			cpuPerRow(b, 1600)
			for range b.N {
				if _, err := openBatch(nil, ring, "bench", s.ID(), body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
