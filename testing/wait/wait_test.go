package wait

import (
	"errors"
	"testing"
	"time"
)

func TestPoll(t *testing.T) {
	calls := 0
	if !Poll(time.Second, func() bool { calls++; return calls == 3 }) {
		t.Fatalf("Poll of a condition true at the third check: got false after %d checks, want true", calls)
	}
	if calls != 3 {
		t.Errorf("checks: got %d, want 3 (none after the condition held)", calls)
	}

	calls = 0
	start := time.Now()
	if Poll(100*time.Millisecond, func() bool { calls++; return false }) {
		t.Fatal("Poll of a condition never true: got true, want false")
	}
	if took := time.Since(start); took < 100*time.Millisecond || took > time.Second {
		t.Errorf("Poll of a condition never true for 100ms: returned after %v, want soon after 100ms", took)
	}
	if calls < 2 {
		t.Errorf("checks of a condition never true: got %d, want one at least before and one after the deadline", calls)
	}
}

func TestPollErrorAndPace(t *testing.T) {
	last := errors.New("still 2 behind")
	waited, err := poll(50*time.Millisecond, func() error { return last })
	if err != last {
		t.Errorf("poll of a check that fails: got %v, want its last error", err)
	}
	if waited < 50*time.Millisecond {
		t.Errorf("poll of a check that fails for 50ms: waited %v, want 50ms at least", waited)
	}

	// A check that costs more than the pause is not run back to back.
	var starts []time.Time
	_, _ = poll(300*time.Millisecond, func() error {
		starts = append(starts, time.Now())
		time.Sleep(3 * pollFast)
		return last
	})
	for i := 1; i < len(starts); i++ {
		if gap := starts[i].Sub(starts[i-1]); gap < 6*pollFast {
			t.Errorf("checks %d and %d of a %v check: %v apart, want the check's own time as the pause (%v at least)", i-1, i, 3*pollFast, gap, 6*pollFast)
		}
	}
}

func TestEventuallyTakesTime(t *testing.T) {
	start := time.Now()
	calls := 0
	waited := Eventually(t, time.Second, "the third check", func() error {
		calls++
		if calls < 3 {
			return errors.New("not the third")
		}
		return nil
	})
	if waited <= 0 || waited > time.Since(start) {
		t.Errorf("Eventually: returned %v, want the time it waited (0 < d <= %v)", waited, time.Since(start))
	}
}
