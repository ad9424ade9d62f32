package bridge

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/outbox"
)

// A hung disk must not hang the node's stop: Close gives up on the outbox's
// writer after its bound and says so; the writer closes the file if it
// ever returns.
func TestCloseReturnsWhenTheOutboxDiskHangs(t *testing.T) {
	hung, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b := localBridgeWith(t, outbox.Options{CloseWait: 200 * time.Millisecond,
		BeforeCommit: func([]outbox.Change) error {
			once.Do(func() { close(hung) })
			<-release
			return nil
		}})
	t.Cleanup(func() {
		close(release)
		// The writer, released, exits and closes the file: then the file
		// opens again.
		for {
			ob, err := outbox.Open(b.cfg.OutboxPath, outbox.Options{MaxBytes: b.cfg.OutboxMaxBytes})
			if err == nil {
				_ = ob.Close()
				return
			}
			if !errors.Is(err, outbox.ErrLocked) {
				t.Errorf("open the outbox after its writer was released: %v", err)
				return
			}
		}
	})
	b.files.ob.MarkPublished(1, nil)
	<-hung

	closed := make(chan error, 1)
	go func() { closed <- b.Close() }() // exits when Close returns
	select {
	case err := <-closed:
		if !errors.Is(err, ErrOutboxStuck) {
			t.Fatalf("got %v, want an error wrapping ErrOutboxStuck", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return within 10s while the outbox's disk hangs")
	}
}
