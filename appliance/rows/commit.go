package rows

import (
	"errors"

	bolt "go.etcd.io/bbolt"
)

// The store's writes: one committer goroutine, a commit for every run of
// writes queued while the one before it ran (group commit without a
// timer).

type commitCall struct {
	fn   func(*bolt.Tx) error
	done chan error
}

// maxCommit bounds the writes one commit takes.
const maxCommit = 1024

var errStoreClosed = errors.New("rows store closed")

// update commits fn, sharing the commit with the writes queued beside it.
// fn may run more than once (alone again when the shared commit failed).
func (s *Store) update(fn func(*bolt.Tx) error) error {
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return errStoreClosed
	}
	s.calls.Add(1)
	s.mu.RUnlock()
	defer s.calls.Done()
	c := commitCall{fn: fn, done: make(chan error, 1)}
	s.queue <- c
	return <-c.done
}

// commit runs the queued writes, as many as wait at once in a commit,
// until Close.
func (s *Store) commit() {
	defer close(s.exited)
	calls := make([]commitCall, 0, maxCommit)
	for {
		calls = calls[:0]
		select {
		case c := <-s.queue:
			calls = append(calls, c)
		case <-s.quit:
			return
		}
	more:
		for len(calls) < maxCommit {
			select {
			case c := <-s.queue:
				calls = append(calls, c)
			default:
				break more
			}
		}
		err := s.db.Update(func(tx *bolt.Tx) error {
			for _, c := range calls {
				if err := c.fn(tx); err != nil {
					return err
				}
			}
			return nil
		})
		if err == nil || len(calls) == 1 {
			for _, c := range calls {
				c.done <- err
			}
			continue
		}
		// One of them failed the shared commit: each alone, so that
		// only the one at fault fails.
		for _, c := range calls {
			c.done <- s.db.Update(c.fn)
		}
	}
}

// Close waits for the writes in progress and closes the store.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.calls.Wait()
	close(s.quit)
	<-s.exited
	return s.db.Close()
}
