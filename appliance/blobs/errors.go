package blobs

import "errors"

// Errors of references (ParseRef).
var (
	// ErrBadRef: a reference is not blob:<node>/<sha256>.
	ErrBadRef = errors.New("not a blob reference")
)

// Errors of the store (Store's methods).
var (
	// ErrNotFound: no blob with that SHA-256 is in the store.
	ErrNotFound = errors.New("blob not found")
	// ErrTooLarge: a blob is larger than the store may hold.
	ErrTooLarge = errors.New("blob larger than the store's limit")
	// ErrNoStore: the node's blob store does not exist (blobs.enabled is
	// false, or the node never started with blobs).
	ErrNoStore = errors.New("the node has no blob store")
)

// Errors of a fetch (Fetcher.Fetch).
var (
	// ErrUnreachable: the owning node could not be asked (it is gone, not
	// connected, or the mesh is unreachable).
	ErrUnreachable = errors.New("blob owner unreachable")
	// ErrCorrupt: what arrived does not match its hash, even after
	// fetching it again.
	ErrCorrupt = errors.New("blob does not match its hash")
	// ErrBadManifest: the owner's manifest does not describe the blob
	// asked for.
	ErrBadManifest = errors.New("bad blob manifest")
	// ErrStalled: a fetch that had begun got nothing for its patience;
	// what arrived is kept in the partial file.
	ErrStalled = errors.New("nothing arrived")
)
