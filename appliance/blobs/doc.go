// Package blobs is a node's blob store and the way blobs move across the
// mesh: exact bytes, kept by the node that made them, named by their
// SHA-256, fetched from any node in verified chunks.
//
// # Model
//
// The store is the JetStream object store Bucket in the node's embedded
// NATS server (Store; the appliance enables JetStream for it alone, with
// its files in the data directory). The node makes it when it is first
// used (SubjectOpen, Server.Open): any JetStream stream keeps the NATS
// server's access-time ticker running, 10 wake-ups a second, which a node
// without blobs should not pay for. An object put by meshbox is named by
// its SHA-256 in lowercase hex and stored in chunks of ChunkSize; an
// object a program put under another name, in chunks of any size, is
// found by its digest. A blob is referred to as blob:<node>/<sha256>
// (Ref).
//
// Retention: a blob is kept until it is deleted, until it is older than
// Limits.MaxAge (the stream's own age limit: JetStream expires it), or
// until the blobs together pass Limits.MaxBytes, when the oldest are
// deleted first (Server's keeper, woken by every put).
//
// # Protocol
//
// A node serves its blobs as two capabilities on its own NATS server,
// which other nodes (and programs) call on the named node,
// node.<node>.cap.<name>: for another node the bridge carries the request
// and its reply through the broker, sealed like every request; for this
// node it calls the local host. So a gone or unconnected owner fails a
// fetch at once with the bridge's 503 naming it.
//
//	CapManifest  ManifestRequest{sha256, from} -> Manifest (JSON): size,
//	             chunk size, chunk count, the SHA-256 of each chunk from
//	             chunk from, at most ManifestPage of them; ranges: true
//	CapChunk     ChunkRequest{sha256, index[, offset, length]} -> the
//	             chunk's bytes, or length bytes of it from offset
//
// Errors are NATS micro error headers: 404 no such blob, 400 bad
// request, 500 the store failed; the bridge's 503 and 504 on the way.
// Every request carries its deadline (Meshbox-Timeout), which the bridge
// carries to the owner and hands to the Server as the time left: a chunk
// request still waiting for a reader when it passes is dropped, since its
// caller has given up and the answer would only fill the owner's link.
//
// A Fetcher asks for the manifest (any failure there is final but a
// deadline, tried again until Patience), then for the chunks, verifying
// each against its hash once all its bytes arrived: a mismatch is fetched
// again (at most chunkAttempts times), a 503 is tried again with backoff,
// a request whose deadline passed at once, until nothing has arrived for
// Patience (the broker restarting). How much it has in flight, the size
// of its requests and their deadlines follow the rate at which replies
// arrive (flow): on a slow link it asks for parts of chunks, two or three
// at a time, each with a deadline that covers the bytes ahead of it at
// that rate; on a fast one for whole chunks, up to Window at a time. A
// deadline that passes halves the rate it assumes, and the late reply's
// bytes count as still on the link until they would have arrived, so
// that a fetch never asks again while a reply may still be on its way.
// It writes what arrives at its offset in <path>.part, checks the whole
// file's SHA-256, and renames it to path. A fetch that finds a .part file
// keeps the chunks in it that verify.
//
// A Fetcher reports its progress to the local node (SubjectFetches,
// FetchReport) every ReportInterval and when it ends; the Server keeps
// the fetches in progress and the last ones that ended (Fetches), which
// the node shows in its status and counts in its metrics. A report is the
// client's word: shown and counted, never acted on.
//
// # Memory
//
// Nothing holds a whole blob: a fetch holds the replies in flight (at most
// Window chunks' bytes, a second's worth of the link) and one chunk buffer
// to verify a chunk that came in parts; the server reads at most
// chunkWorkers chunks at once, each from the stream's messages by sequence
// (direct gets), and keeps a small index per recent blob (the chunk hashes
// and where each stored chunk lies: about 150 KB for 1 GiB).
//
// # Concurrency
//
// A Server's subscriptions run on the NATS client's goroutines. It owns
// the keeper (retention, usage, indexes of new blobs: exits at Close) and
// one goroutine per chunk being read (at most chunkWorkers; each exits
// once its chunk is answered or dropped). Close unsubscribes and waits
// for them. The index cache has one mutex; an index is built once,
// outside it, while other askers wait; the fetch reports and the counts
// have a mutex each. A Fetch runs one loop that owns the fetch's state and
// its flow, and one goroutine per request in flight, which writes what
// arrived into the file and hands the answer to the loop; it returns after
// they are gone. Store has no goroutines; its methods are safe for
// concurrent use.
package blobs
