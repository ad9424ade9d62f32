package rows

import (
	"testing"
	"time"
)

// The bound a run of stamps is checked against (sortChanges) accepts
// exactly what Observe accepts, at every sub-millisecond phase of the
// clock and on both sides of the drift's edge.
func TestClockBoundAgreesWithObserve(t *testing.T) {
	base := time.UnixMilli(1_764_000_000_000)
	for _, phase := range []time.Duration{0, time.Microsecond, 500 * time.Microsecond, 999_999 * time.Nanosecond} {
		now := base.Add(phase)
		c := NewClock(func() time.Time { return now }, time.Minute)
		bound, at := c.bound()
		if !at.Equal(now) {
			t.Fatalf("bound read the clock as %v, want %v", at, now)
		}
		edge := StampAt(now.Add(time.Minute))
		for _, s := range []Stamp{edge - 1, edge, edge + 1, edge | (1<<logicalBits - 1), edge + 1<<logicalBits, edge + 1<<logicalBits - 1} {
			byObserve := c.Observe(s) == nil
			if byBound := s <= bound; byBound != byObserve {
				t.Errorf("phase %v, stamp %s: bound says %v, Observe %v", phase, s, byBound, byObserve)
			}
		}
	}
}
