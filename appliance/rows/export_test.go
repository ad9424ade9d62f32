package rows

import (
	"time"

	"github.com/meshbox/meshbox/internal/seal"
)

// SetSnapshotGap sets the least time between two snapshots of a node for
// a test, and returns what undoes it.
func SetSnapshotGap(d time.Duration) (undo func()) {
	old := snapshotGap
	snapshotGap = d
	return func() { snapshotGap = old }
}

// SealedBatch is a log message's body as a node of the given name seals
// it: a change batch (snap "") or one part of a one-part snapshot with
// join and from, for tests that forge what a peer may publish.
func SealedBatch(s *seal.Sealer, table, node, snap string, join, from uint64, changes []Change) []byte {
	b := batch{V: 1, Kind: kindChanges, Node: node, Join: join, Changes: changes}
	if snap != "" {
		b.Kind, b.Snap, b.Part, b.Parts, b.From = kindSnapshot, snap, 1, 1, from
	}
	body, err := sealBatch(s, table, &b)
	if err != nil {
		panic(err)
	}
	return body
}

// Held limits for tests.
const (
	MaxHeldChanges = maxHeldChanges
	MaxHeldBytes   = maxHeldBytes
	MaxHoldAhead   = maxHoldAhead
)

// SetSnapshotWait sets how long a joiner waits for the snapshot its join
// offset names, and returns what undoes it.
func SetSnapshotWait(d time.Duration) (undo func()) {
	old := snapshotWait
	snapshotWait = d
	return func() { snapshotWait = old }
}

// SnapshotPart is part part of parts of snapshot snap as node seals it.
func SnapshotPart(s *seal.Sealer, table, node, snap string, part, parts int, join, from uint64, changes []Change) []byte {
	b := batch{V: 1, Kind: kindSnapshot, Node: node, Snap: snap, Part: part, Parts: parts, Join: join, From: from, Changes: changes}
	body, err := sealBatch(s, table, &b)
	if err != nil {
		panic(err)
	}
	return body
}

// SetResumeWait sets how long a resuming reader waits for the message it
// resumes at before it asks the broker where the log ends, and returns
// what undoes it.
func SetResumeWait(d time.Duration) (undo func()) {
	old := resumeWait
	resumeWait = d
	return func() { resumeWait = old }
}

// PartVersion opens a log message of table with ring and returns its
// kind and batch version (2: a snapshot's part in binary).
func PartVersion(ring *seal.Keyring, table, keyID string, body []byte) (kind string, v int, err error) {
	b, err := openBatch(nil, ring, table, keyID, body)
	if err != nil {
		return "", 0, err
	}
	return b.Kind, b.V, nil
}
