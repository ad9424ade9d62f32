package cluster

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// submitter submits sequence-numbered commands or events to one node at a
// steady rate until told to stop, recording each answer in a ledger.
type submitter struct {
	nc      *nats.Conn
	subject string
	l       *ledger
	next    atomic.Int64

	mu      sync.Mutex
	answers map[string]int // "accepted <how>", "refused <code>", "no answer"
}

// run submits with workers goroutines at about rate per second until stop
// is closed and at least min were submitted (never more than max). It
// returns when every worker is done.
func (s *submitter) run(workers int, rate float64, min, max int, stop <-chan struct{}) {
	s.answers = map[string]int{}
	pause := time.Duration(float64(workers) / rate * float64(time.Second))
	var wg sync.WaitGroup
	for range workers {
		// Worker: exits when the run is complete (see above).
		wg.Go(func() {
			for {
				seq := int(s.next.Add(1)) - 1
				stopped := false
				select {
				case <-stop:
					stopped = true
				default:
				}
				if seq >= max || seq >= min && stopped {
					return
				}
				start := time.Now()
				resp, err := s.nc.Request(s.subject, []byte(strconv.Itoa(seq)), 20*time.Second)
				var o outcome
				var answer string
				switch code, _ := serviceError(resp); {
				case err != nil:
					o, answer = indeterminate, "no answer"
				case code != 0:
					o, answer = refused, fmt.Sprintf("refused %d", code)
				case resp.Header.Get("Meshbox-Accepted") == "":
					o, answer = indeterminate, "answer without Meshbox-Accepted"
				default:
					o, answer = acked, "accepted "+resp.Header.Get("Meshbox-Accepted")
				}
				s.l.submitted(seq, o)
				s.mu.Lock()
				s.answers[answer]++
				s.mu.Unlock()
				if d := pause - time.Since(start); d > 0 {
					time.Sleep(d)
				}
			}
		})
	}
	wg.Wait()
}

func (s *submitter) summary() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.subject + ": " + tallyString(s.answers)
}

func tallyString(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] })
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d %s", m[k], k))
	}
	return strings.Join(parts, ", ")
}

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
		code, _ := serviceError(resp)
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
