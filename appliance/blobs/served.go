package blobs

import (
	"fmt"
	"sync"
	"time"

	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats.go"
)

// What the server counts of the requests it takes: by kind, by outcome.
const (
	KindOpen        = "open"         // SubjectOpen
	KindManifest    = "manifest"     // CapManifest
	KindChunk       = "chunk"        // CapChunk
	KindFetchReport = "fetch_report" // SubjectFetches

	OutcomeOK       = "ok"
	OutcomeExpired  = "expired"   // a chunk request whose deadline passed before a reader was free: dropped, its caller had given up
	OutcomeBadInput = "bad_input" // answered 400 (a report: refused)
	OutcomeNotFound = "not_found" // answered 404
	OutcomeError    = "error"     // answered 500
	OutcomeFull     = "full"      // a report of a new fetch while the server follows as many as it may: not shown
)

// RequestKey is a kind and an outcome of requests (the labels of their
// metric).
type RequestKey struct{ Kind, Outcome string }

// Served is what the server answered since it started.
type Served struct {
	Chunks  int64 `json:"chunks"`  // chunk requests answered with bytes
	Bytes   int64 `json:"bytes"`   // the bytes of those answers
	Expired int64 `json:"expired"` // chunk requests dropped: their deadline had passed
	Failed  int64 `json:"failed"`  // manifest and chunk requests answered with an error
}

// servedCounts are the server's counts of requests. Safe for concurrent
// use.
type servedCounts struct {
	mu     sync.Mutex
	counts map[RequestKey]int64
	bytes  int64
}

func (c *servedCounts) add(kind, outcome string, bytes int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts == nil {
		c.counts = map[RequestKey]int64{}
	}
	c.counts[RequestKey{kind, outcome}]++
	c.bytes += int64(bytes)
}

// Served is what the server answered since it started.
func (s *Server) Served() Served {
	s.counts.mu.Lock()
	defer s.counts.mu.Unlock()
	st := Served{Bytes: s.counts.bytes}
	for k, n := range s.counts.counts {
		switch {
		case k.Kind == KindFetchReport || k.Kind == KindOpen:
		case k.Outcome == OutcomeOK && k.Kind == KindChunk:
			st.Chunks += n
		case k.Outcome == OutcomeExpired:
			st.Expired += n
		case k.Outcome != OutcomeOK:
			st.Failed += n
		}
	}
	return st
}

// RequestCounts are the requests the server took since it started, by
// kind and outcome.
func (s *Server) RequestCounts() map[RequestKey]int64 {
	s.counts.mu.Lock()
	defer s.counts.mu.Unlock()
	out := make(map[RequestKey]int64, len(s.counts.counts))
	for k, n := range s.counts.counts {
		out[k] = n
	}
	return out
}

// outcomeOf is the outcome of an error answer with code.
func outcomeOf(code int) string {
	switch code {
	case CodeBadInput:
		return OutcomeBadInput
	case CodeNotFound:
		return OutcomeNotFound
	}
	return OutcomeError
}

// requestDeadline is when a request that arrived at at must be answered
// by: the time left its header says (Meshbox-Timeout, set by the node's
// bridge), or none (zero).
func requestDeadline(h nats.Header, at time.Time) (time.Time, error) {
	v := h.Get(wire.HeaderTimeout)
	if v == "" {
		return time.Time{}, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return time.Time{}, fmt.Errorf("header %s: %q is not a positive duration", wire.HeaderTimeout, v)
	}
	return at.Add(d), nil
}
