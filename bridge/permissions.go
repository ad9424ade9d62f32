package bridge

import "github.com/meshbox/meshbox/internal/wire"

// A node's identity on the broker (its user's name, its permissions and
// limits, the durable queues the admin declares for it) is the protocol's,
// in package wire: the admin tools take it from there too. The names here
// are that package's, for the runtime's callers.

// Exported broker names.
const (
	MeshExchange       = wire.MeshExchange
	DeadLetterExchange = wire.DeadLetterExchange
	DeadLetterQueue    = wire.DeadLetterQueue
	AllStages          = wire.AllStages
)

// Permissions are a node's rights on the mesh vhost (wire.Permissions).
type Permissions = wire.Permissions

// Limits are a node user's RabbitMQ user limits (wire.Limits).
type Limits = wire.Limits

// QueueSpec is one of a node's durable queues (wire.QueueSpec).
type QueueSpec = wire.QueueSpec

// NodeExchange returns an older mesh's exchange of node n.
func NodeExchange(n string) string { return wire.NodeExchange(n) }

// NodeBindingKey returns the key that bound an older mesh's node exchange
// to mesh.
func NodeBindingKey(n string) string { return wire.NodeBindingKey(n) }

// BrokerUser returns the broker user of generation gen of node n.
func BrokerUser(n string, gen int) string { return wire.BrokerUser(n, gen) }

// ParseBrokerUser returns the node and generation of a node's broker user.
func ParseBrokerUser(user string) (node string, gen int, ok bool) { return wire.ParseBrokerUser(user) }

// NodePermissions returns the permissions of node n's broker user.
func NodePermissions(n string, stages []string) (Permissions, error) {
	return wire.NodePermissions(n, stages)
}

// NodeLimits returns the limits of every node's broker user.
func NodeLimits() Limits { return wire.NodeLimits() }

// NodeQueues returns the durable queues the admin declares for node n.
func NodeQueues(n string, stages []string) ([]QueueSpec, error) { return wire.NodeQueues(n, stages) }
