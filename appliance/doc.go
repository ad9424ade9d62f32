// Package appliance wires one meshbox node together: configuration, the
// embedded NATS server, the bindings cache, the bridge and the node, the
// supervisor of the modules the mesh assigns to the node
// (appliance/modules), their lifecycle, and the node's HTTP status, health
// and metrics endpoints.
//
// Start brings up the bindings, NATS, the blob store, the bridge, the node and then the
// modules (the stages they declare are handed to the bridge before any of
// them starts); Close stops the modules first, while everything they use
// still runs, then the rest in reverse. Every change of the bindings goes
// to the bridge (a moved broker), the node (expected peers) and the
// supervisor (assignments, overrides, grants), in that order, on the
// bindings manager's goroutine.
//
// The node's identity in the mesh is its credential's newest generation in
// the bindings (credential.go): its broker user goes to the bridge with
// the broker URL (on each URL when broker.url lists several brokers, the
// nodes of a cluster), which switches to it make before break; the switch
// recorder, a goroutine of its own, moves the database login to the
// generation's role and records the switch in the mesh database once both
// are in use, so that the admin's rotate may revoke the older generations.
// Status.Identity shows the broker user, generation, age, the state the
// bridge reports (credential revoked included) and any rotation in
// progress.
//
// Who may connect to the embedded NATS server is package localnats's
// business: the node's own connections and its CLI with the administrative nkey,
// each local program with its own nkey and permissions (package
// programs), and clients without a credential only on a standalone node or
// when the configuration allows them (nats_anonymous). PutProgram,
// RemoveProgram and ReloadPrograms change the programs of a running node
// without a restart. The HTTP server answers only the Host names it serves
// (httphost.go).
//
// In a mesh with a database it also keeps the node's keys (package keys): its
// key pair and its content keys, handed to the bridge to seal with.
//
// The embedded server runs JetStream for the blob store alone (blobs.go,
// package blobs; off with blobs.enabled false), its files in
// <data>/jetstream. After NATS, Start binds the store if one was made
// before (applying the configured limits; otherwise it is made on its
// first use, $MESH.blobs.open) and serves the blob capabilities on a connection of the node's
// own, excluded from the watcher of local interest like the node's other
// connections; Close stops it before NATS.
package appliance
