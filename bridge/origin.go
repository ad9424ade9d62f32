package bridge

import (
	"errors"
	"fmt"

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

// forged is a delivery whose origin cannot be trusted: it is dropped (dead-
// lettered with the reason) and counted as errKindForged. cause is one of
// the cause* constants (senders.go); "" is causeOther.
type forged struct {
	cause  string
	reason string
}

func (e *forged) Error() string { return "forged message: " + e.reason }

// decode validates a delivery of the given kind, and its origin against
// the session's mode (see above) and the generations the bindings list
// (senders.go). The origin is checked first: a delivery that no node
// could have sent is forged, whatever else is wrong with it. A forged
// delivery of a node's user comes with its envelope (for a command given
// back while this node's bindings may lag a rotation).
func (s *session) decode(kind string, d *amqp.Delivery) (*envelope, error) {
	node, gen, nodeUser := ParseBrokerUser(d.UserId)
	if s.perNode && !nodeUser {
		return nil, &forged{cause: causeNoNodeUser, reason: fmt.Sprintf("user_id %q is not a node's broker user", d.UserId)}
	}
	env, err := decode(kind, fromAMQP(d), s.b.maxPayload())
	if err != nil {
		return nil, err
	}
	if nodeUser {
		if err := s.b.peers.senders.check(node, gen); err != nil {
			return env, err
		}
	}
	// Opened only once the origin is validated: it is part of the seal.
	if s.b.cfg.Keys != nil && sealable(kind) {
		if err := s.b.unseal(env, d); err != nil {
			return nil, err
		}
	}
	return env, nil
}

// isForged reports whether err is a forged delivery.
func isForged(err error) bool {
	var f *forged
	return errors.As(err, &f)
}

// asForged returns err as a *forged, or nil.
func asForged(err error) *forged {
	var f *forged
	if errors.As(err, &f) {
		return f
	}
	return nil
}
