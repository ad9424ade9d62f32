// Package backoff is the one retry schedule of meshbox: exponential growth
// between a minimum and a maximum, with the upper half of each wait
// randomized, so that a mesh of nodes that lost the broker or the database
// at the same instant does not come back in lockstep.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Policy is an exponential backoff with jitter. The zero value is not
// useful; Min and Max must be positive and Min <= Max.
type Policy struct {
	Min time.Duration // the base wait before the first retry
	Max time.Duration // the cap on the base wait
}

// Base returns the wait before attempt n (1-based) without jitter: Min
// doubled n-1 times, at most Max.
func (p Policy) Base(n int) time.Duration {
	d := max(p.Min, 1)
	for i := 1; i < n && d < p.Max; i++ {
		d *= 2
	}
	if p.Max > 0 {
		d = min(d, p.Max)
	}
	return d
}

// Delay returns the wait before attempt n (1-based): Base(n) with its upper
// half randomized, so every wait lies in [Base(n)/2, Base(n)].
func (p Policy) Delay(n int) time.Duration {
	d := p.Base(n)
	return d/2 + rand.N(d/2+1)
}
