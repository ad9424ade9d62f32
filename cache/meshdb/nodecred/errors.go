package nodecred

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/meshbox/meshbox/cache/meshdb"
)

// Errors of the checks Rotate and Rejoin make before they change anything.
var (
	// ErrUnknownNode is wrapped by the error for a node that is not in the
	// mesh. That error reads as, and also wraps, the database's
	// *meshdb.NotFoundError.
	ErrUnknownNode = errors.New("unknown node")
	// ErrNoCredential means the node has no credential of its own to
	// replace: it is recorded without one (by init, or node add
	// --record-only).
	ErrNoCredential = errors.New("no credential of its own")
)

// ErrNotSwitched is wrapped by *NotSwitchedError.
var ErrNotSwitched = errors.New("nodes did not switch to their new credential in time")

// unknownNodeError is the error for a node that is not in the mesh.
type unknownNodeError struct {
	nf *meshdb.NotFoundError
}

func (e *unknownNodeError) Error() string { return e.nf.Error() }

// Unwrap returns ErrUnknownNode and the database's *meshdb.NotFoundError.
func (e *unknownNodeError) Unwrap() []error { return []error{ErrUnknownNode, e.nf} }

// NotSwitchedError names the nodes Rotate waited for in vain. Their older
// generations stay valid; a later Rotate finishes their rotation.
type NotSwitchedError struct {
	Nodes []Pending
}

func (e *NotSwitchedError) Error() string {
	names := make([]string, 0, len(e.Nodes))
	for _, p := range e.Nodes {
		names = append(names, fmt.Sprintf("%s (generation %d waiting since %s)", p.Node, p.Generation, p.Since.UTC().Format(time.RFC3339)))
	}
	return ErrNotSwitched.Error() + ": " + strings.Join(names, ", ")
}

// Unwrap returns ErrNotSwitched.
func (e *NotSwitchedError) Unwrap() error { return ErrNotSwitched }

// NoPublicKeyError names the nodes Rotate did not rotate because a new
// generation cannot be sealed to a node that has not published its public
// key. It is returned after the other nodes' rotation finished.
type NoPublicKeyError struct {
	Nodes []string
}

func (e *NoPublicKeyError) Error() string {
	return meshdb.ErrNoPublicKey.Error() + ": " + strings.Join(e.Nodes, ", ")
}

// Unwrap returns meshdb.ErrNoPublicKey.
func (e *NoPublicKeyError) Unwrap() error { return meshdb.ErrNoPublicKey }

// RevokeError lists what Rotate or Rejoin could not revoke or remove once
// the new generations were made: older generations (on the broker or in
// the database) that stay valid, and old exchanges that stay. Each error
// names its node.
type RevokeError struct {
	Errs []error
}

func (e *RevokeError) Error() string { return errors.Join(e.Errs...).Error() }

// Unwrap returns Errs.
func (e *RevokeError) Unwrap() []error { return e.Errs }
