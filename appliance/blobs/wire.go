package blobs

import (
	"time"

	"github.com/meshbox/meshbox/internal/wire"
)

// The capabilities every node serves for its blobs, called on a named node
// as node.<node>.cap.<name> (so through the broker, sealed like every
// other request, for another node; locally for this one). A program that
// may call meshbox.blob.> (its credential's call list) fetches blobs the
// way `meshbox blob get` does.
const (
	// CapManifest answers a ManifestRequest with a Manifest (JSON).
	CapManifest = "meshbox.blob.manifest"
	// CapChunk answers a ChunkRequest with the chunk's bytes.
	CapChunk = "meshbox.blob.chunk"
	// CapPrefix is what both start with: programs may not host it.
	CapPrefix = "meshbox.blob."
)

// SubjectOpen, on a node's own NATS server, makes the node's blob store
// if it has none yet (a node makes it only when it is first used) and
// answers {"bucket": Bucket}, or an error. `meshbox blob put` asks it
// first; so must a program before its first put with the object store
// API on a node that holds no blobs yet.
const SubjectOpen = wire.SubjectBlobsOpen

// SubjectFetches, on a node's own NATS server, takes the progress reports
// of the fetches its clients run (FetchReport, JSON, no reply): a Fetcher
// publishes one every ReportInterval and one when it ends, and the node
// shows the fetches in its status and counts them in its metrics.
const SubjectFetches = wire.SubjectBlobsFetches

// Transfer constants.
const (
	// ChunkSize is the size of every chunk of a transfer but the last.
	ChunkSize = 256 << 10
	// ManifestPage is the most chunk hashes one Manifest carries; a
	// larger blob's manifest is asked for in pages (ManifestRequest.From).
	ManifestPage = 4096
)

// Error codes of the blob capabilities (header Nats-Service-Error-Code,
// with the text in Nats-Service-Error), as the bridge's own.
const (
	CodeBadInput = wire.CodeBadInput
	CodeNotFound = wire.CodeNotFound
	CodeInternal = wire.CodeInternal
)

// ManifestRequest asks a node for the manifest of one of its blobs, the
// chunk hashes from chunk From on.
type ManifestRequest struct {
	SHA256 string `json:"sha256"`
	From   int    `json:"from,omitempty"`
}

// Manifest describes a blob as it is transferred: its size, the size of
// its chunks and the SHA-256 of each (lowercase hex), from chunk From on,
// at most ManifestPage of them. Ranges says the node serves parts of a
// chunk (ChunkRequest.Offset and Length).
type Manifest struct {
	SHA256    string    `json:"sha256"`
	Size      int64     `json:"size"`
	ChunkSize int       `json:"chunk_size"`
	Chunks    int       `json:"chunks"`
	From      int       `json:"from"`
	Hashes    []string  `json:"hashes"`
	Modified  time.Time `json:"modified"`
	Ranges    bool      `json:"ranges,omitempty"`
}

// ChunkRequest asks a node for chunk Index of one of its blobs, or for
// Length bytes of it from Offset (a node whose manifest says Ranges):
// Length 0 is the rest of the chunk.
type ChunkRequest struct {
	SHA256 string `json:"sha256"`
	Index  int    `json:"index"`
	Offset int    `json:"offset,omitempty"`
	Length int    `json:"length,omitempty"`
}

// chunksOf is the number of chunks of a blob of size bytes.
func chunksOf(size int64) int { return int((size + ChunkSize - 1) / ChunkSize) }

// chunkLen is the length of chunk i of a blob of size bytes.
func chunkLen(size int64, i int) int {
	return int(min(ChunkSize, size-int64(i)*ChunkSize))
}
