package node

import (
	"errors"
	"fmt"
)

// Errors returned by New, Start and Close.
var (
	// ErrConfig is wrapped by every *ConfigError.
	ErrConfig = errors.New("invalid node config")
	// ErrClosed is returned by Start after Close.
	ErrClosed = errors.New("node closed")
	// ErrStarted is returned by a second Start.
	ErrStarted = errors.New("node already started")
)

// Errors returned by DecodeMessage, one per reason a discovery message off
// the wire is rejected. Each is wrapped by a *WireError whose Reason is the
// label of the meshbox_discovery_rejected_total metric.
var (
	// ErrTooLarge means the message body is larger than MaxMessageBytes.
	ErrTooLarge = errors.New("message too large")
	// ErrMalformed means the body is not a JSON discovery message.
	ErrMalformed = errors.New("malformed message")
	// ErrVersion means the message speaks another protocol version.
	ErrVersion = errors.New("unsupported protocol version")
	// ErrUnknownType means the message type is not one this node knows.
	ErrUnknownType = errors.New("unknown message type")
	// ErrKeyMismatch means the system key is not the message's type.
	ErrKeyMismatch = errors.New("system key does not match message type")
	// ErrBadName means a node, capability or stage name is not valid.
	ErrBadName = errors.New("invalid name")
	// ErrTooMany means a list in the message is longer than allowed.
	ErrTooMany = errors.New("list too long")
	// ErrBadField means another field has an invalid value.
	ErrBadField = errors.New("invalid field")
	// ErrOrigin means the broker-level origin of the message differs from
	// the node the message claims to come from.
	ErrOrigin = errors.New("origin does not match sender")
)

// ConfigError is a configuration problem; Field names the Config field.
type ConfigError struct {
	Field string
	Msg   string
}

func (e *ConfigError) Error() string { return "node config: " + e.Field + ": " + e.Msg }

// Unwrap returns ErrConfig.
func (e *ConfigError) Unwrap() error { return ErrConfig }

// WireError says why a discovery message was rejected. Field names the
// message field at fault, when there is one.
type WireError struct {
	Reason string // metric label: too_large, malformed, version, ...
	Field  string
	Detail string
	Err    error // one of the sentinels above
}

func (e *WireError) Error() string {
	s := e.Err.Error()
	if e.Field != "" {
		s += ": " + e.Field
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Unwrap returns the sentinel.
func (e *WireError) Unwrap() error { return e.Err }

func wireErr(sentinel error, field, format string, args ...any) *WireError {
	reason := "malformed"
	switch sentinel {
	case ErrTooLarge:
		reason = "too_large"
	case ErrVersion:
		reason = "version"
	case ErrUnknownType:
		reason = "unknown_type"
	case ErrKeyMismatch:
		reason = "key_mismatch"
	case ErrBadName:
		reason = "bad_name"
	case ErrTooMany:
		reason = "too_many"
	case ErrBadField:
		reason = "bad_field"
	case ErrOrigin:
		reason = "origin_mismatch"
	}
	return &WireError{Reason: reason, Field: field, Detail: fmt.Sprintf(format, args...), Err: sentinel}
}
