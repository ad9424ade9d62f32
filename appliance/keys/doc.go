// Package keys is a node's keeper of the mesh's keys, in a mesh with a
// database: its key pair (node.key) and signing key (signing.key) in the
// data directory, and the content keys it opens from the copies sealed to
// it, kept in the keyring the bridge and the tables seal with.
//
// LoadNodeKey loads or makes the key pair; New makes a Keeper, Start runs
// its goroutine and Close stops it. Apply hands it each change of the
// bindings: it opens and checks this node's copies at once (copies.go),
// then its goroutine does the database's part (sync.go): it publishes the
// public keys, claims keys nobody holds and seals held keys for the nodes
// that lack them. Status is the keys part of the node's status.
//
// Each key event the keeper takes part in (made, sealed, rotated,
// retired, recovered, revoked) is one log line and one count of
// meshbox_key_events_total{kind} (events.go). A key marked compromised (a
// node removed as compromised held it) is never sealed with.
//
// Caveats: keys are opened in memory only and never logged; a copy that
// does not open, or opens to another key than its commitment names, is
// refused and removed so that an honest holder seals it again (keys.go
// says the whole model).
package keys
