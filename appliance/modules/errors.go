package modules

import "errors"

// Errors of the catalog (LoadCatalog, ReadManifest).
var (
	// ErrManifest is wrapped by every problem of one manifest (see
	// ManifestError).
	ErrManifest = errors.New("invalid module manifest")
)

// Errors of the supervisor.
var (
	// ErrConfig is returned by New for an invalid Config.
	ErrConfig = errors.New("modules config")
	// ErrUnknownModule is returned by Start, Stop, Restart and Logs for a
	// module that is not assigned to this node.
	ErrUnknownModule = errors.New("module not assigned to this node")
	// ErrNotRunnable is returned by Start and Restart for an assigned
	// module that cannot run: not in the catalog, a bad manifest, an
	// unknown selection.
	ErrNotRunnable = errors.New("module cannot run")
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("modules supervisor closed")
)

// ManifestError is a problem of one manifest: the file and the field at
// fault ("" for the file as a whole).
type ManifestError struct {
	File  string
	Field string
	Err   error
}

func (e *ManifestError) Error() string {
	if e.Field == "" {
		return e.File + ": " + e.Err.Error()
	}
	return e.File + ": " + e.Field + ": " + e.Err.Error()
}

// Unwrap returns ErrManifest and the cause.
func (e *ManifestError) Unwrap() []error { return []error{ErrManifest, e.Err} }
