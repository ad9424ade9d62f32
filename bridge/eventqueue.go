package bridge

import (
	amqp "github.com/rabbitmq/amqp091-go"
)

// This file is the session's use of the node's event queue
// (bridge/link's eventqueue.go): the events an older mesh's classic
// event queue held are republished to local subscribers.

// sizedQuorum reports whether this node declares quorum queues with an
// initial group size.
func (s *session) sizedQuorum() bool { return s.b.link.Cluster() }

// declareEvents declares the node's event queue and binds it
// (link.Own.DeclareEvents).
func (s *session) declareEvents(ch **amqp.Channel) error {
	return s.own().DeclareEvents(ch, s.sizedQuorum(), func(d *amqp.Delivery) {
		if err := s.republishEvent(d); err != nil {
			s.b.m.err(errKindDeadLetter)
			s.b.log.Warn("event from the classic event queue dropped", "msg_id", d.MessageId, "err", err)
		}
	})
}
