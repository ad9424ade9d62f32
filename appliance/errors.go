package appliance

import "errors"

// Errors returned by the appliance.
var (
	// ErrDataDirInUse means another meshbox process holds the data directory.
	ErrDataDirInUse = errors.New("data directory is in use by another meshbox process")
	// ErrClosed is returned by Start after Close.
	ErrClosed = errors.New("appliance closed")
	// ErrNotRunning is returned by the methods that need a running node
	// (PutProgram, RemoveProgram, ReloadPrograms) before Start or after
	// Close.
	ErrNotRunning = errors.New("node is not running")
	// ErrNoNodeKey means the node has no key pair: it runs without a mesh
	// database.
	ErrNoNodeKey = errors.New("no node key: the node runs without a mesh database")
)
