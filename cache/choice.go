package cache

import (
	"errors"
	"fmt"
)

// Which bindings a manager runs from: the choice at start and on reload.

// startChoice is the outcome of chooseStart.
type startChoice struct {
	snap   Snapshot
	source string // SourceDB, SourceCache or SourceNone
	reason string // why the cache was not used, for the log
}

// chooseStart picks the bindings to start with: the live snapshot if the
// database answered, else the cached one if it is for this node, else none.
func chooseStart(node string, live Snapshot, liveErr error, cached Snapshot, cachedErr error) startChoice {
	if liveErr == nil {
		return startChoice{snap: live, source: SourceDB}
	}
	switch {
	case errors.Is(cachedErr, ErrNoSnapshot):
		return startChoice{source: SourceNone, reason: "the cache holds no snapshot"}
	case cachedErr != nil:
		return startChoice{source: SourceNone, reason: "the cache could not be read: " + cachedErr.Error()}
	case cached.Bindings.Node != node:
		return startChoice{source: SourceNone, reason: fmt.Sprintf("the cached snapshot is for node %q", cached.Bindings.Node)}
	}
	return startChoice{snap: cached, source: SourceCache}
}

// reloadAction is what a freshly loaded snapshot means for the one in use.
type reloadAction int

const (
	reloadApply     reloadAction = iota // content differs (or nothing was in use): report and apply
	reloadRefresh                       // same content at another revision: record the revision
	reloadUnchanged                     // same revision, same content
)

// chooseReload compares a loaded snapshot with the one in use.
func chooseReload(cur Snapshot, have bool, loaded Snapshot) reloadAction {
	switch {
	case !have || cur.Hash != loaded.Hash || cur.Bindings.Node != loaded.Bindings.Node:
		return reloadApply
	case cur.Revision != loaded.Revision:
		return reloadRefresh
	default:
		return reloadUnchanged
	}
}
