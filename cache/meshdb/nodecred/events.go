package nodecred

import (
	"time"

	"github.com/meshbox/meshbox/cache/meshdb"
)

// An Event is one step of Rotate or Rejoin, reported to Rotator.Progress
// as it happens. It is one of Skipped, Resumed, Created, NotRotated,
// ReadError, Switched, Waiting, Forced and Revoked. An Event's slices and
// pointers are the receiver's to keep.
type Event interface {
	event()
}

// Skipped: Rotate found rotations pending and leaves this node, which has
// none, for a later run.
type Skipped struct {
	Node string
}

// Resumed: Rotate finishes the node's pending rotation to Generation
// (broker user User); the Older generations are still valid.
type Resumed struct {
	Node       string
	Generation int
	User       string
	Older      []int
}

// Created: the node's generation Generation exists, as broker user User
// and database role Role, recorded at mesh revision Revision. Token is
// the join token that hands it to the node's machine (Rejoin); nil when
// the node takes it from its bindings (Rotate).
type Created struct {
	Node       string
	Generation int
	User       string
	Role       string
	Revision   int64
	Token      *meshdb.JoinToken
}

// NotRotated: Rotate could not seal a new generation to the node (Err
// wraps meshdb.ErrNoPublicKey) and deleted its broker user again; the
// node keeps its credential.
type NotRotated struct {
	Node string
	Err  error
}

// ReadError: Rotate could not read the credential generations while it
// waits for nodes to switch; it reads them again at its next look.
type ReadError struct {
	Err error
}

// Switched: the node recorded at At that it connects with Generation.
type Switched struct {
	Node       string
	Generation int
	At         time.Time
}

// Waiting: at At, Rotate still waits for Nodes to switch, for at most
// Left more. It is reported when the wait starts and then every 10 s.
type Waiting struct {
	Nodes []Pending
	At    time.Time
	Left  time.Duration
}

// Forced: the node did not switch to Generation in time, and Rotate
// revokes its older generations anyway (RotateOptions.Force).
type Forced struct {
	Node       string
	Generation int
}

// Revoked: the node's generation Generation is revoked: its broker user
// is deleted, and Database is what went on the database side.
type Revoked struct {
	Node       string
	Generation int
	Database   meshdb.Revoked
}

// Pending is a node's new generation that the node has not switched to,
// and since when Rotate has waited for it.
type Pending struct {
	Node       string
	Generation int
	Since      time.Time
}

func (Skipped) event()    {}
func (Resumed) event()    {}
func (Created) event()    {}
func (NotRotated) event() {}
func (ReadError) event()  {}
func (Switched) event()   {}
func (Waiting) event()    {}
func (Forced) event()     {}
func (Revoked) event()    {}
