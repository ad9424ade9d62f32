package bridge

import (
	"errors"
	"fmt"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	brokerlink "github.com/meshbox/meshbox/bridge/link"
	"github.com/meshbox/meshbox/bridge/outbox"
	"github.com/meshbox/meshbox/internal/wire"
)

// Errors returned by New and Start.
var (
	// ErrInvalidConfig is wrapped by every configuration error; a
	// *ConfigError names the field.
	ErrInvalidConfig = errors.New("invalid bridge configuration")
	// ErrNodeNameInUse means another process holds this node's name on the
	// broker (its exclusive request consumer). Start returns it wrapped in a
	// *NodeNameInUseError.
	ErrNodeNameInUse = brokerlink.ErrNodeNameInUse
	// ErrOutboxLocked means another process holds the outbox file. Start
	// returns it wrapped in an *OutboxLockedError.
	ErrOutboxLocked = outbox.ErrLocked
	// ErrClosed is returned by methods called after Close.
	ErrClosed = errors.New("bridge closed")
	// ErrOutboxStuck is returned (wrapped) by Close when the outbox's
	// writer did not finish its last commit in time: the disk hangs. What
	// was not committed may be lost.
	ErrOutboxStuck = outbox.ErrStuck
)

// Errors of a connection's settings, returned (wrapped) by DialBroker and
// the link's dials before the broker is tried.
var (
	// ErrCAFile means Config.CAFile cannot be read or holds no PEM
	// certificate (brokerlink.ErrCAFile).
	ErrCAFile = brokerlink.ErrCAFile
	// ErrClientCert means the client certificate (Config.CertFile and
	// KeyFile) cannot be loaded (brokerlink.ErrClientCert).
	ErrClientCert = brokerlink.ErrClientCert
)

// Errors returned by PublishSystem and SendSystem, and carried (as text and a
// code) in error replies to local programs.
var (
	// ErrLinkDown means the broker link is not connected.
	ErrLinkDown = brokerlink.ErrLinkDown
	// ErrOutboxFull means the outbox reached its size bound; the message was
	// not accepted.
	ErrOutboxFull = outbox.ErrFull
	// ErrNoRoute means the broker had no queue for a message published with
	// the mandatory flag.
	ErrNoRoute = brokerlink.ErrNoRoute
	// ErrNacked means the broker refused to take responsibility for a message.
	ErrNacked = brokerlink.ErrNacked
)

// Errors returned by the dead-letter operations (deadletters.go).
var (
	// ErrNoDeadLetters means the stage has no dead-letter queue on the
	// broker: no node hosting it declared one.
	ErrNoDeadLetters = errors.New("no dead-letter queue")
	// ErrNoDeadLetter means the stage has no dead letter with that id.
	ErrNoDeadLetter = errors.New("no such dead letter")
)

// ConfigError is a configuration mistake in one field.
type ConfigError struct {
	Field string
	Msg   string
}

func (e *ConfigError) Error() string { return "bridge config " + e.Field + ": " + e.Msg }

// Unwrap returns ErrInvalidConfig.
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }

// NodeNameInUseError means another process holds this node's name on the
// broker. It unwraps to ErrNodeNameInUse.
type NodeNameInUseError = brokerlink.NodeNameInUseError

// MissingQueueError: a durable queue of node Node (its event queue, a
// stage's queue) does not exist, and the node's broker user may not
// declare it: the admin declares those (bridge.NodeQueues).
type MissingQueueError = brokerlink.MissingQueueError

// OutboxLockedError is returned by Start when the outbox file is locked by
// another process. It unwraps to ErrOutboxLocked.
type OutboxLockedError = outbox.LockedError

// ServiceError is an error reply as a local program sees it: a NATS micro
// style code and description (wire.ServiceError).
type ServiceError = wire.ServiceError

// Error codes carried in the Nats-Service-Error-Code header (wire).
const (
	CodeBadInput    = wire.CodeBadInput
	CodeForbidden   = wire.CodeForbidden
	CodeNotFound    = wire.CodeNotFound
	CodeUnavailable = wire.CodeUnavailable
	CodeTimeout     = wire.CodeTimeout
	CodeOutboxFull  = wire.CodeOutboxFull
	CodeInternal    = wire.CodeInternal
)

// codeFor maps an error to the code of its error reply.
func codeFor(err error) int {
	var se *ServiceError
	switch {
	case errors.As(err, &se):
		return se.Code
	case errors.Is(err, codec.ErrBadInput):
		return CodeBadInput
	case errors.Is(err, ErrOutboxFull):
		return CodeOutboxFull
	case errors.Is(err, ErrLinkDown), errors.Is(err, ErrNoRoute), errors.Is(err, ErrNacked), errors.Is(err, ErrClosed):
		return CodeUnavailable
	default:
		return CodeInternal
	}
}

// goneError says a call targets a node that discovery marked gone.
func goneError(node string, since time.Time) error {
	return &ServiceError{Code: CodeUnavailable, Text: fmt.Sprintf("node %s is gone (last heard from %s)", node, since.UTC().Format(time.RFC3339))}
}

// NewerFormatError is returned by Start when the outbox file was written in
// a newer format than this binary reads (by a newer meshbox, before a
// downgrade). It names the file and both formats; the file and the
// messages in it are left untouched.
type NewerFormatError = outbox.NewerFormatError
