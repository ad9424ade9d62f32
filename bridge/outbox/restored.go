package outbox

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"sync"
)

// MarkRestored prepares the outbox file at path, restored from a backup,
// for the node's next start: whatever it holds may have been sent or run
// after the backup was taken (the node went on working), so every record
// is marked Republished and the published mark moves past the last one.
// Each record then goes out, or runs locally, marked as a possible
// duplicate (Meshbox-Redelivered), and a stage that dedupes drops an id
// it completed since (package bridge). It returns how many records it
// marked. Run it before the node opens the file.
func MarkRestored(path string) (int, error) {
	o, err := Open(path, Options{MaxBytes: math.MaxInt64 / 2})
	if err != nil {
		return 0, fmt.Errorf("mark the restored outbox: %w", err)
	}
	n, err := o.markRestored()
	if cerr := o.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return n, fmt.Errorf("mark the restored outbox: %w", err)
	}
	return n, nil
}

func (o *Outbox) markRestored() (int, error) {
	ctx := context.Background()
	var after uint64
	n := 0
	var mu sync.Mutex
	var failed error
	done := func(err error) {
		if err != nil {
			mu.Lock()
			failed = cmp.Or(failed, err)
			mu.Unlock()
		}
	}
	for {
		recs, err := o.ReadAfter(after, 256, KindsOf(Command, Event, Dead, Local))
		if err != nil {
			return n, err
		}
		if len(recs) == 0 {
			break
		}
		for _, r := range recs {
			after = r.Seq
			if r.Republished {
				continue
			}
			r.Republished = true
			o.Replace(r, r.Size, done) // committed in groups; Sync below waits
			n++
		}
	}
	if after > o.Published() {
		o.MarkPublished(after, done)
	}
	if err := o.Sync(ctx); err != nil {
		return n, err
	}
	mu.Lock()
	defer mu.Unlock()
	return n, failed
}
