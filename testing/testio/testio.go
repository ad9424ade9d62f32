// Package testio holds the small pieces of input and output the tests of
// every package share: a log or an output stream written by one goroutine
// and read by the test in another. It imports only the standard library,
// so that a package's own tests can use it without an import cycle.
package testio

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent use: a logger or a child
// process writes it while the test reads what was written so far.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
