package bridge

import (
	brokerlink "github.com/meshbox/meshbox/bridge/link"
	amqp "github.com/rabbitmq/amqp091-go"
)

// setup declares the topology, claims the node's request queue with an
// exclusive consumer, and opens the channels (link.SessionSetup); the
// outbox drains early on a broker URL where an earlier session found the
// shared exchanges.
func (s *session) setup() error {
	st := brokerlink.SessionSetup{Own: s.own(), Pub: s.pub, URL: s.url, Sized: s.sizedQuorum(), Prefetch: s.b.cfg.Prefetch,
		Early: func() {
			s.early = true
			s.spawn(s.publisher)
			s.spawn(s.confirmer)
			s.spawn(s.drainer)
		},
		Timed: s.timed, Republish: s.republishLegacy, Events: s.b.link.EventBinding(),
	}
	c, err := st.Run()
	if err != nil {
		return err
	}
	s.con.Consuming = *c
	return nil
}

// republishLegacy hands an event of an older classic event queue to local
// subscribers (link.Own.DeclareEvents).
func (s *session) republishLegacy(d *amqp.Delivery) {
	if err := s.republishEvent(d); err != nil {
		s.b.m.err(errKindDeadLetter)
		s.b.log.Warn("event from the classic event queue dropped", "msg_id", d.MessageId, "err", err)
	}
}

// sizedQuorum reports whether this node declares quorum queues with an
// initial group size (link.Link.Cluster).
func (s *session) sizedQuorum() bool { return s.b.link.Cluster() }
