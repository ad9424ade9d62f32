// Package wait is the tests' one poller: a test waits for a state it
// cannot be told of by calling a check until it holds, at a pace that sees
// a state reached soon within milliseconds and does not keep a busy
// machine busier during a long wait.
//
// The rules: a wait always has a bound; a test that fails when the bound
// passes uses For or Eventually (the failure names the state), a test that
// decides itself what a state not reached means uses Poll. A wait is for a
// state the code cannot signal; where it can (a channel, a callback), the
// test waits on that instead.
//
// It imports only the standard library, so that every package's own tests
// can use it (testing/meshtest builds on it).
package wait

import (
	"errors"
	"testing"
	"time"
)

// The pace of a wait: every pollFast during its first pollFastFor, so that
// a state reached soon is seen soon (and a test that times a state reads
// it to within pollFast), then every pollSlow, so that a long wait (a
// broker restart, an outbox draining) does not keep a busy machine busier
// asking. A check that takes longer than its pause (a CLI run, a call
// through the broker) pauses as long as it took: waits keep their checks
// to half the time at most.
const (
	pollFast    = 20 * time.Millisecond
	pollFastFor = 5 * time.Second
	pollSlow    = 100 * time.Millisecond
)

// errNotYet is what a condition that does not hold yet reports to poll.
var errNotYet = errors.New("not yet")

// poll calls check until it returns nil or d has passed; check runs at
// least once, and once more after d. It returns how long it waited and
// check's last error (nil once it held).
func poll(d time.Duration, check func() error) (time.Duration, error) {
	start := time.Now()
	for {
		began := time.Now()
		err := check()
		waited := time.Since(start)
		if err == nil || waited > d {
			return waited, err
		}
		pause := pollSlow
		if waited < pollFastFor {
			pause = pollFast
		}
		time.Sleep(max(pause, time.Since(began)))
	}
}

// Poll calls cond until it returns true or d has passed, and reports
// whether it held. It is for a test that decides itself what a state not
// reached means (a t.Errorf with figures, say); For fails the test.
// Poll may be called from any goroutine.
func Poll(d time.Duration, cond func() bool) bool {
	_, err := poll(d, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	})
	return err == nil
}

// For calls cond until it returns true and returns how long that took;
// when cond does not hold within d, the test fails with "<what>: not
// within <d>". what names the state waited for ("alpha connected").
func For(tb testing.TB, d time.Duration, what string, cond func() bool) time.Duration {
	tb.Helper()
	waited, err := poll(d, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	})
	if err != nil {
		tb.Fatalf("%s: not within %v", what, d)
	}
	return waited
}

// Eventually is For for a check that says why the state is not
// reached yet: it calls check until it returns nil and returns how long
// that took; when it does not within d, the test fails with check's last
// error.
func Eventually(tb testing.TB, d time.Duration, what string, check func() error) time.Duration {
	tb.Helper()
	waited, err := poll(d, check)
	if err != nil {
		tb.Fatalf("%s: not within %v: %v", what, d, err)
	}
	return waited
}
