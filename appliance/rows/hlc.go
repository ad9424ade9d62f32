package rows

import (
	"fmt"
	"strconv"
	"sync"
	"time"
)

// Stamp is a hybrid logical clock reading: milliseconds since the Unix
// epoch in the high 48 bits, a counter in the low 16. Stamps order the
// versions of a field across the mesh: a later write on any node, as far
// as clocks and causality can tell, has a larger stamp.
type Stamp uint64

const logicalBits = 16

// StampAt returns the first stamp of wall time t.
func StampAt(t time.Time) Stamp { return Stamp(uint64(t.UnixMilli()) << logicalBits) }

// Wall returns the stamp's wall time.
func (s Stamp) Wall() time.Time { return time.UnixMilli(int64(uint64(s) >> logicalBits)) }

// String is the stamp as <RFC 3339 wall time>+<counter>.
func (s Stamp) String() string {
	return s.Wall().UTC().Format("2006-01-02T15:04:05.000Z") + "+" + strconv.FormatUint(uint64(s)&(1<<logicalBits-1), 10)
}

// DefaultMaxDrift is how far ahead of this node's clock a change's stamp
// may be before it is held back (Clock.Observe).
const DefaultMaxDrift = time.Minute

// Clock is a node's hybrid logical clock. A node's clock never goes back,
// and a change observed from another node moves it forward, so that a
// write made after seeing a change has a larger stamp than the change, a
// second's clock skew notwithstanding. One node's clock far in the future
// must not drag every node's clock along (its stamps would win every
// field for as long): Observe refuses a stamp more than maxDrift ahead.
type Clock struct {
	mu       sync.Mutex
	last     Stamp
	now      func() time.Time
	maxDrift time.Duration
}

// NewClock returns a clock reading now (nil: time.Now) that refuses
// stamps more than maxDrift ahead (0: DefaultMaxDrift).
func NewClock(now func() time.Time, maxDrift time.Duration) *Clock {
	if now == nil {
		now = time.Now
	}
	if maxDrift <= 0 {
		maxDrift = DefaultMaxDrift
	}
	return &Clock{now: now, maxDrift: maxDrift}
}

// Next returns the stamp of a local write: larger than every stamp the
// clock gave or observed.
func (c *Clock) Next() Stamp {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := StampAt(c.now())
	if s <= c.last {
		s = c.last + 1
	}
	c.last = s
	return s
}

// ErrFuture is the error of a stamp too far ahead of this node's clock.
type ErrFuture struct {
	Stamp Stamp
	Ahead time.Duration
	Max   time.Duration
}

func (e *ErrFuture) Error() string {
	return fmt.Sprintf("stamp %s is %s ahead of this node's clock (at most %s): a node's clock is wrong; the change waits until this node's clock reaches it", e.Stamp, e.Ahead.Round(time.Millisecond), e.Max)
}

// Observe moves the clock past s, a stamp of another node's change, or
// returns an *ErrFuture when s is more than maxDrift ahead of the wall
// clock (the clock is not moved).
func (c *Clock) Observe(s Stamp) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if ahead := s.Wall().Sub(now); ahead > c.maxDrift {
		return &ErrFuture{Stamp: s, Ahead: ahead, Max: c.maxDrift}
	}
	if s > c.last {
		c.last = s
	}
	return nil
}

// bound returns the highest stamp Observe accepts now, and now: a run of
// stamps is checked against one reading of the wall clock.
func (c *Clock) bound() (Stamp, time.Time) {
	now := c.now()
	// Observe refuses s when s.Wall() is after now+maxDrift: s.Wall() has
	// whole milliseconds, so every stamp of that millisecond passes.
	return StampAt(now.Add(c.maxDrift)) | (1<<logicalBits - 1), now
}

// passed moves the clock past s, a stamp bound accepted.
func (c *Clock) passed(s Stamp) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s > c.last {
		c.last = s
	}
}
