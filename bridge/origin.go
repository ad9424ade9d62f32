package bridge

import (
	"fmt"

	"github.com/meshbox/meshbox/bridge/codec"

	amqp "github.com/rabbitmq/amqp091-go"
)

// This file is where a delivery's origin is validated. Every message a
// node publishes carries its broker user as the AMQP user_id property, and
// RabbitMQ refuses a user_id that is not the connection's user. So:
//
//   - In a mesh where every node has a broker user of its own
//     (node.<n>.g<k>, see BrokerUser), the origin of a delivery is the node
//     of its user_id, and a delivery without a node's user_id (none, the
//     admin's, guest) is dropped as forged: nobody can speak for another
//     node. A node knows it is in such a mesh by its own user.
//   - A mesh run on one credential (a test broker, guest, one user for all
//     nodes) cannot tell its nodes apart on the broker: there the origin is
//     the Meshbox-Origin header, as trustworthy as every node holding the
//     mesh's one credential. A node's user_id still wins over the header.

// decode validates a delivery of the given kind, and its origin against
// the session's mode (see above) and the generations the bindings list
// (senders.go). The origin is checked first: a delivery that no node
// could have sent is forged, whatever else is wrong with it. A forged
// delivery of a node's user comes with its envelope (for a command given
// back while this node's bindings may lag a rotation).
func (s *session) decode(kind string, d *amqp.Delivery) (*codec.Envelope, error) {
	node, gen, nodeUser := ParseBrokerUser(d.UserId)
	if s.perNode && !nodeUser {
		return nil, &codec.Forged{Cause: causeNoNodeUser, Reason: fmt.Sprintf("user_id %q is not a node's broker user", d.UserId)}
	}
	env, err := codec.Decode(kind, codec.FromAMQP(d), s.b.maxPayload())
	if err != nil {
		return nil, err
	}
	if nodeUser {
		if err := s.b.peers.senders.check(node, gen); err != nil {
			return env, err
		}
	}
	// Opened only once the origin is validated: it is part of the seal.
	if s.b.cfg.Keys != nil && codec.Sealable(kind) {
		if err := s.b.unseal(env, d); err != nil {
			return nil, err
		}
	}
	return env, nil
}
