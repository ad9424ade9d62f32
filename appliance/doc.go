// Package appliance wires one meshbox node together: configuration, the
// embedded NATS server, the bindings cache, the bridge and the node, their
// lifecycle, and the node's HTTP status, health and metrics endpoints.
package appliance
