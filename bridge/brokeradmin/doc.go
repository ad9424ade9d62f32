// Package brokeradmin administers the mesh's RabbitMQ broker through its
// HTTP management API (with rabbit-hole, the maintained Go client for it):
// the shared topology every node uses, and one broker user per node and
// credential generation, with the permissions wire.NodePermissions gives.
//
// Only the admin commands (meshbox init, meshbox mesh ...) use it, with the
// admin credential they are given (--broker-admin URL, env
// MESHBOX_BROKER_ADMIN). That credential is never stored: not in a mesh
// setting, not in a cache, not in a node's configuration.
//
// # Generations
//
// RabbitMQ keeps one password per user, so a credential cannot gain a
// second password while the first stays valid. A node's credential is
// therefore a user per generation, node.<n>.g<k> (wire.BrokerUser), all
// with the same permissions: rotation creates generation k+1
// (CreateGeneration), the node switches to it, and generation k is deleted
// (DeleteGeneration). Deleting a user closes its connections.
//
// An Admin is safe for concurrent use; each call is bounded by Timeout.
package brokeradmin
