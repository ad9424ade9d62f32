package link

import (
	"errors"
	"sync"
	"testing"
)

// A closing channel can make the publisher's error path and the
// confirmer's final sweep settle the same item; done must run once.
func TestItemSettlesOnce(t *testing.T) {
	var calls int
	var got error
	it := &Item{Done: func(err error) { calls++; got = err }}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() { // exits after one finish
			defer wg.Done()
			it.Finish(ErrLinkDown)
		}()
	}
	wg.Wait()
	it.Finish(nil)
	if calls != 1 {
		t.Fatalf("done called %d times, want 1", calls)
	}
	if !errors.Is(got, ErrLinkDown) {
		t.Fatalf("got %v, want ErrLinkDown (the first settlement)", got)
	}
}
