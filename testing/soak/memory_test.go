package soak

import (
	"math"
	"os"
	"testing"
	"time"
)

func TestSlope(t *testing.T) {
	tests := []struct {
		name string
		x, y []float64
		want float64
	}{
		{"flat", []float64{0, 1, 2, 3}, []float64{5, 5, 5, 5}, 0},
		{"growing", []float64{0, 1, 2, 3}, []float64{1, 1.5, 2, 2.5}, 0.5},
		{"noisy flat", []float64{0, 1, 2, 3}, []float64{5, 6, 5, 6}, 0.2},
		{"one point", []float64{0}, []float64{3}, 0},
	}
	for _, tt := range tests {
		if got := Slope(tt.x, tt.y); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestAnonSlopeSkipsWarmUp(t *testing.T) {
	t0 := time.Now()
	var samples []Memory
	for i := range 10 {
		anon := int64(50 * 1024) // flat after warm-up
		if i < 4 {
			anon = int64(i * 10 * 1024) // steep during warm-up
		}
		samples = append(samples, Memory{At: t0.Add(time.Duration(i) * time.Minute), Anon: anon})
	}
	slope, n := AnonSlope(samples, t0.Add(4*time.Minute))
	if n != 6 || slope != 0 {
		t.Errorf("got slope %v over %d samples, want 0 over 6", slope, n)
	}
}

func TestReadMemory(t *testing.T) {
	m, err := ReadMemory(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if m.RSS <= 0 || m.Anon <= 0 || m.Anon > m.RSS {
		t.Errorf("got rss %d kB anon %d kB, want 0 < anon <= rss", m.RSS, m.Anon)
	}
}
