//go:build hoptrace

package bridge

import (
	"sync/atomic"
	"time"
)

// HopMarks holds, in a build with the hoptrace tag, when the last request
// passed each point of its round trip (Unix nanoseconds, by Hop). The
// request-hops benchmark reads them to say where a round trip's time goes;
// only one request at a time gives a meaningful reading.
var HopMarks [HopCount]atomic.Int64

// MarkHop records that the request at hand passed point h (also used by
// the benchmark for the points outside the bridge).
func MarkHop(h Hop) { HopMarks[h].Store(time.Now().UnixNano()) }

func hop(h Hop) { MarkHop(h) }
