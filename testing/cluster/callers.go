package cluster

import (
	"sync"
	"time"

	"github.com/meshbox/meshbox/testing/meshtest/natstest"
	"github.com/nats-io/nats.go"
)

// call is one request of a caller and its fate.
type call struct {
	from, to string
	start    time.Time
	took     time.Duration
	code     int // 0 success, the error reply's code, -1 no answer
}

// caller calls node.<to>.cap.echo from one node, one call at a time with a
// short pause, until told to stop.
type caller struct {
	nc       *nats.Conn
	from, to string

	mu    sync.Mutex
	calls []call
}

// run calls until stop is closed; wait is the client's own limit, longer
// than the node's request deadline.
func (c *caller) run(wait time.Duration, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		start := time.Now()
		resp, err := c.nc.Request("node."+c.to+".cap.echo", []byte(c.from), wait)
		code, _ := natstest.ServiceError(resp)
		if err != nil {
			code = -1
		} else if code == 0 && string(resp.Data) != c.to {
			code = -2 // an answer from the wrong host
		}
		c.mu.Lock()
		c.calls = append(c.calls, call{from: c.from, to: c.to, start: start, took: time.Since(start), code: code})
		c.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
}

func (c *caller) snapshot() []call {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]call(nil), c.calls...)
}
