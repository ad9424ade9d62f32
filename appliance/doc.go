// Package appliance wires one meshbox node together: configuration, the
// embedded NATS server, the bindings cache, the bridge and the node, their
// lifecycle, and the node's HTTP status, health and metrics endpoints. In
// a mesh with a database it also keeps the node's keys (keys.go): its key
// pair, its content keys, handed to the bridge to seal with.
package appliance
