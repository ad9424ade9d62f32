package rows

import "time"

// SetSnapshotGap sets the least time between two snapshots of a node for
// a test, and returns what undoes it.
func SetSnapshotGap(d time.Duration) (undo func()) {
	old := snapshotGap
	snapshotGap = d
	return func() { snapshotGap = old }
}
