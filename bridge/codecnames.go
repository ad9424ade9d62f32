package bridge

import "github.com/meshbox/meshbox/bridge/codec"

// Names the bridge's callers know it by; their home is package codec.
const (
	// DefaultCommandBatch is Config.CommandBatch's default.
	DefaultCommandBatch = codec.DefaultCommandBatch
	// MaxCommandBatch is the most commands one message may carry.
	MaxCommandBatch = codec.MaxCommandBatch
	// HeaderTimeout is the header with which a program sets its request's
	// deadline.
	HeaderTimeout = codec.HeaderTimeout
)
