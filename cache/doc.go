// Package cache holds a node's bindings: the part of the mesh database the
// node needs (every node record and mesh setting, but only its own
// assignments, overrides and grants), versioned snapshots of them in a bbolt
// file, and the Manager that keeps the two in step.
//
// # Model
//
// A Source (the mesh database, see package cache/meshdb) produces a Snapshot:
// the Bindings read in one consistent view together with the mesh revision
// they belong to, a content hash, and when and from where they were fetched.
// The Store keeps the last few distinct snapshots on disk. At start the
// Manager takes the database if it answers within a short bound, otherwise
// the newest cached snapshot, otherwise nothing; it keeps trying the
// database in the background, follows its change notifications, and when a
// (re)load finds bindings that differ from the ones in use it reports the
// difference row by row (Diff), stores the new snapshot and applies it.
// Running from cache is never invisible: the source, revision and age of the
// bindings are in Status, in the metrics and in the log.
//
// # Many nodes, one database
//
// Every node of the mesh is notified of every change at the same moment.
// So that they do not all read the database at that instant, a node waits
// a random part of NotifyDelayPerNode (1 ms) × the node records in its
// bindings before it reloads, at most ManagerConfig.MaxNotifyDelay (1 s):
// a handful of nodes still act within milliseconds, 1,000 spread over a
// second. Notifications during the wait join the reload. A Source that is
// also a RevisionSource is asked for the revision alone first: when it is
// the revision the node runs (a reconnect of the listening connection, a
// notification already caught up with, the periodic refresh, itself
// jittered), the full load is skipped. The load itself still reads every
// node record: reading only the rows changed since a revision would need
// a change log the schema does not keep.
//
// # Upgrades
//
// The cache file records its format (internal/boltfile): an older file is
// migrated forward when opened, a newer one (written by a newer meshbox) is
// refused with a *NewerFormatError and left untouched. A Source whose
// schema is newer than this binary knows fails its loads with an error
// wrapping ErrSourceNewer: the Manager keeps the cached bindings and says
// so in its status warning and its log until a load succeeds.
//
// # Concurrency
//
// Store and Manager are safe for concurrent use. The Manager owns two
// goroutines, both started by Start and gone when Close returns: one runs
// Source.Watch, the other performs every load and every change, so
// OnChange callbacks run one at a time, in order, on that goroutine and must
// not call Close. (Without a Source only one goroutine runs, and only when
// MaxAge is set: it waits to log the max-age warning.) Neither polls: the
// loader sleeps until a notification, the next retry or refresh, or the
// moment the bindings pass MaxAge; the bindings' age is computed when
// Status or the metrics are read.
//
// # Secrets
//
// Grant credentials are of type Credential, which prints and logs as
// "[redacted]"; Diff never carries credentials, and setting or override
// values whose key looks secret, as well as passwords inside URLs, are
// redacted in divergence reports.
package cache
