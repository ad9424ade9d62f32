package link

import (
	"sync"
	"time"
)

// Workers counts the goroutines and timers working on a session's
// deliveries. Unlike a WaitGroup it may gain work while someone waits,
// and refuses new work once closed. The zero value is ready.
type Workers struct {
	mu     sync.Mutex
	n      int
	zero   chan struct{} // closed when n drops to 0 while closing
	closed bool
}

// Go runs f on a goroutine of its own; CloseAndWait waits for it. f
// must return soon after the session's context is cancelled. After
// CloseAndWait began, f is dropped (Go returns false).
func (w *Workers) Go(f func()) bool {
	if !w.add() {
		return false
	}
	go func() {
		defer w.done()
		f()
	}()
	return true
}

// After runs f after d, tracked like Go (nil after CloseAndWait began).
// Cancel it with Cancel.
func (w *Workers) After(d time.Duration, f func()) *time.Timer {
	if !w.add() {
		return nil
	}
	return time.AfterFunc(d, func() {
		defer w.done()
		f()
	})
}

// Cancel stops a timer from After and reports whether it did; a timer
// that already fired is left to finish.
func (w *Workers) Cancel(t *time.Timer) bool {
	if t != nil && t.Stop() {
		w.done()
		return true
	}
	return false
}

func (w *Workers) add() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return false
	}
	w.n++
	return true
}

func (w *Workers) done() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n--
	if w.n == 0 && w.zero != nil {
		close(w.zero)
		w.zero = nil
	}
}

// CloseAndWait refuses new work and waits for the work in progress.
func (w *Workers) CloseAndWait() {
	w.mu.Lock()
	w.closed = true
	if w.n == 0 {
		w.mu.Unlock()
		return
	}
	zero := make(chan struct{})
	w.zero = zero
	w.mu.Unlock()
	<-zero
}
