package backoff

import (
	"testing"
	"time"
)

func TestBase(t *testing.T) {
	p := Policy{Min: 250 * time.Millisecond, Max: 10 * time.Second}
	for _, tc := range []struct {
		n    int
		want time.Duration
	}{
		{1, 250 * time.Millisecond},
		{2, 500 * time.Millisecond},
		{3, time.Second},
		{6, 8 * time.Second},
		{7, 10 * time.Second},
		{1000, 10 * time.Second},
	} {
		if got := p.Base(tc.n); got != tc.want {
			t.Errorf("Base(%d): got %v, want %v", tc.n, got, tc.want)
		}
	}
}

func TestDelayIsJitteredWithinBounds(t *testing.T) {
	p := Policy{Min: 100 * time.Millisecond, Max: time.Second}
	seen := map[time.Duration]bool{}
	for n := 1; n <= 6; n++ {
		base := p.Base(n)
		for range 200 {
			d := p.Delay(n)
			if d < base/2 || d > base {
				t.Fatalf("Delay(%d) = %v, want within [%v, %v]", n, d, base/2, base)
			}
			seen[d] = true
		}
	}
	// Nodes that failed together must not retry together: 1,200 draws from
	// ranges of tens of millions of nanoseconds are all but never equal.
	if len(seen) < 1000 {
		t.Fatalf("got %d distinct delays in 1200 draws, want jitter", len(seen))
	}
}
