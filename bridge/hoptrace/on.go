//go:build hoptrace

package hoptrace

import (
	"sync/atomic"
	"time"
)

// Marks holds, in a build with the hoptrace tag, when the last request
// passed each point of its round trip (Unix nanoseconds, by Hop). The
// request-hops benchmark reads them to say where a round trip's time goes;
// only one request at a time gives a meaningful reading.
var Marks [HopCount]atomic.Int64

// Mark records that the request at hand passed point h.
func Mark(h Hop) { Marks[h].Store(time.Now().UnixNano()) }
