package meshtest

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// A broker's boot is the heaviest thing a test does: the Erlang VM
// starts, loads its applications and builds its schema on every core for
// seconds. The test binaries of `make test` run side by side (-p), each
// starting brokers of its own, and on a 2-core machine four or five
// booting at once took each 30 s and more, and a restart past its
// deadline. A machine-wide slot, a lock file that every test process
// shares, is held from a broker's start until it answers:
// startSlots boot at once, the others wait their turn, and the ready
// deadline counts from the slot, not from the wait.
const startSlots = 2

// startSlot takes a slot, waiting as long as every one is held, and
// returns its release and how long it waited.
func startSlot() (release func(), waited time.Duration, err error) {
	began := time.Now()
	var files []*os.File
	for i := range startSlots {
		f, err := os.OpenFile(filepath.Join(os.TempDir(), fmt.Sprintf("%srabbitmq-start-%d.lock", dirPrefix, i)), os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			return nil, 0, fmt.Errorf("broker start slot: %w", err)
		}
		files = append(files, f)
	}
	for {
		for i, f := range files {
			if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
				continue
			}
			for j, o := range files {
				if j != i {
					o.Close()
				}
			}
			return func() {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				f.Close()
			}, time.Since(began), nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}
