// Package appliance wires one meshbox node together: configuration, the
// embedded NATS server, the bindings cache, the bridge and the node, their
// lifecycle, and the node's HTTP status, health and metrics endpoints.
//
// Who may connect to the embedded NATS server is localauth.go's business:
// the node's own connections and its CLI with the administrative nkey,
// each local program with its own nkey and permissions (package
// programs), and clients without a credential only on a standalone node or
// when the configuration allows them (nats_anonymous). PutProgram,
// RemoveProgram and ReloadPrograms change the programs of a running node
// without a restart. The HTTP server answers only the Host names it serves
// (httphost.go).
package appliance
