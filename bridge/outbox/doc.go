// Package outbox is a node's durable store-and-forward queue: the commands,
// events and dead letters the node accepted and has not handed on yet, in
// one bbolt file that survives a crash, kill -9 and a power cut.
//
// # Model
//
// An outbox holds Records in the order of their sequence number (Seq),
// which is the order the node accepted them in; the caller numbers them,
// starting at NextSeq. A record's Kind says where it goes: a Command or an
// Event for the mesh, a Dead letter waiting for the mesh, or a Local
// command for a stage hosted on this node. Next to the records the file
// keeps the published mark (MarkPublished, Published): every record at or
// below it may have reached the broker, so it goes out again marked as a
// possible duplicate.
//
// Changes (Put, Replace, Delete, MarkPublished) are queued to one writer
// goroutine. The writer applies everything that was queued while its
// previous commit ran in one transaction: one fsync for the group. Each
// change's done callback runs after its commit, with the commit's
// outcome; Options.OnCommit then hears which kinds were stored. Reads
// (ReadAfter, Oldest) and the counters (Counts) see committed records only.
//
// The outbox is bounded by Options.MaxBytes. Room for a record is claimed
// before it is put: Reserve refuses with ErrFull past the bound, and
// ReserveAlways claims room beyond it for a record that was accepted once
// already and must not be refused now. A reservation ends when its put
// commits or fails.
//
// # The file
//
// The file has three buckets: records (the 8-byte big-endian Seq of each
// record to its encoding, Record.Encode), meta (the published mark, an
// 8-byte big-endian seq, and the file's format) and quarantine. Open checks
// every page and the layout (internal/boltfile): a damaged file, or a bbolt
// file that is not an outbox, is set aside with a .corrupt-<time> suffix
// and replaced by an empty outbox, and Warning says so; records that
// cannot be decoded are moved to the quarantine bucket. A file of a newer
// format is refused with a *NewerFormatError and left untouched, an older
// one is migrated; a file another process holds is a *LockedError.
//
// The encoding of a record is part of the file's format, so Record and its
// codec live here, with the layout and the format number: changing either
// is one format change. A record is decodable only when its name, message
// id and headers meet the rules every layer applies to them (package names
// for the name, package wire for ids and headers): a record that breaks
// them is quarantined like a truncated one. What turns a record into a
// broker message (the envelope, the corked publishing socket, the
// sealing of bodies) is not stored and stays in package bridge.
//
// # Rules
//
//   - Every method is safe for concurrent use. A Record read from the
//     outbox is a copy that the caller owns; the Record handed to Put or
//     Replace must not change until its done callback ran.
//   - done callbacks, OnCommit and BeforeCommit run on the writer
//     goroutine: they must not block, and must never wait for a commit
//     (Wait, Sync), which only that goroutine makes. Queueing a change
//     from a callback is allowed, but while the queue is full (1024
//     changes) it waits for room that only the writer makes.
//   - Waiting for a commit takes a context (Wait, Sync). When the context
//     ends first, the change may still be committed later.
//   - Put takes a record's encoding and a reservation of its length:
//     data := r.Encode(), then Reserve or ReserveAlways, then Put.
//     Delete takes the record's Seq and Size.
//   - Open starts the writer; Close stops it once every change queued
//     before Close is committed, and closes the file. A change queued after
//     Close fails with ErrClosed. Close waits at most Options.CloseWait: on
//     a hung disk it returns an error wrapping ErrStuck, and the writer
//     closes the file if its commit ever returns.
package outbox
