// Package node is a node's view of the mesh: its identity, the capabilities
// hosted by local programs, what its peers host, and the local stand-ins that
// let a caller reach a capability without knowing where it runs.
package node
