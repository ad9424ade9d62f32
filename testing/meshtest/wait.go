package meshtest

import (
	"testing"
	"time"

	"github.com/meshbox/meshbox/testing/wait"
)

// Poll calls cond until it returns true or d has passed, and reports
// whether it held (wait.Poll).
func Poll(d time.Duration, cond func() bool) bool { return wait.Poll(d, cond) }

// WaitFor calls cond until it returns true and returns how long that took;
// when cond does not hold within d, the test fails with "<what>: not
// within <d>" (wait.For).
func WaitFor(tb testing.TB, d time.Duration, what string, cond func() bool) time.Duration {
	tb.Helper()
	return wait.For(tb, d, what, cond)
}

// Eventually calls check until it returns nil and returns how long that
// took; when it does not within d, the test fails with check's last error
// (wait.Eventually).
func Eventually(tb testing.TB, d time.Duration, what string, check func() error) time.Duration {
	tb.Helper()
	return wait.Eventually(tb, d, what, check)
}
