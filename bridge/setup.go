package bridge

import (
	"errors"
	"fmt"

	brokerlink "github.com/meshbox/meshbox/bridge/link"

	"github.com/meshbox/meshbox/bridge/codec"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A session's setup: the topology it declares and the channels it opens
// (topology.go holds the declarations themselves). Every step is a broker
// round trip, which on a home link (20-80 ms) is what a reconnect waits
// for, so the steps that do not depend on each other run side by side,
// each on a channel of its own (a failed declaration closes its channel):
// the publishing connection's channels, the consume channels, the event
// queue, the reply and system queues. What must come first comes first:
// the node's claim on its name, before any of its queues is bound or
// consumed, and the request queue's binding, which learns which exchange
// the node's queues are bound to (bindOwn).

// setup declares the topology (see the package doc), claims the node's
// request queue with an exclusive consumer, and opens the channels.
func (s *session) setup() error {
	node := s.b.cfg.Node
	var pub, chans, own brokerlink.Asides
	defer func() { _ = errors.Join(pub.Wait(), chans.Wait(), own.Wait()) }() // after a failure: the steps still running
	pub.Start(func() error {
		if err := s.pub.Open(); err != nil {
			return err
		}
		// On a broker URL where an earlier session found the shared
		// exchanges, the outbox need not wait for the rest of the setup
		// (half a dozen round trips more): it drains from here on. Should
		// the setup fail, what was sent goes again, marked as a possible
		// duplicate, like after any cut.
		if u := s.b.learnt.Shared.Load(); u != nil && *u == s.url {
			s.early = true
			s.spawn(s.publisher)
			s.spawn(s.confirmer)
			s.spawn(s.drainer)
		}
		return nil
	})
	chans.Start(s.openConsumeChannels)
	ch, err := s.con.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer func() { // ch may be replaced below, and is nil when reopening it failed
		if ch != nil {
			_ = ch.Close()
		}
	}()
	if err := s.findShared(&ch); err != nil {
		return err
	}
	if err := chans.Wait(); err != nil {
		return err
	}
	// The node's claim on its name comes first, before any of its queues
	// is bound or consumed (claim; on an older mesh's permissions, the
	// named request queue is the claim).
	if err := s.claim(&ch); err != nil {
		return err
	}
	if s.q.req, err = s.declareOwn(&ch, codec.RequestQueue(node)); err != nil {
		var inUse *NodeNameInUseError
		if errors.As(err, &inUse) {
			return err
		}
		return fmt.Errorf("declare queue %s: %w", codec.RequestQueue(node), err)
	}
	own.Start(s.own().OnChannel("queue "+codec.EventQueue(node), s.declareEvents))
	if err := s.bindOwn(&ch, s.q.req, codec.RequestBindingKey(node)); err != nil {
		var inUse *NodeNameInUseError
		if errors.As(err, &inUse) {
			return err
		}
		return fmt.Errorf("declare binding %s: %w", codec.RequestQueue(node), err)
	}
	own.Start(s.own().OnChannel("queue "+codec.ReplyQueue(node), func(ch **amqp.Channel) (err error) {
		if s.q.rep, err = s.declareOwn(ch, codec.ReplyQueue(node)); err != nil {
			return err
		}
		if err := s.bindOwn(ch, s.q.rep, codec.ReplyKey(node)); err != nil {
			return fmt.Errorf("binding: %w", err)
		}
		return nil
	}))
	own.Start(s.own().OnChannel("queue "+codec.SystemQueue(node), func(ch **amqp.Channel) (err error) {
		if s.q.sys, err = s.declareOwn(ch, codec.SystemQueue(node)); err != nil {
			return err
		}
		if err := (*ch).QueueBind(s.q.sys, "sys.#", codec.ExchangeMesh, false, nil); err != nil {
			return fmt.Errorf("binding: %w", err)
		}
		if err := s.bindOwn(ch, s.q.sys, "to."+node+".sys.#"); err != nil {
			return fmt.Errorf("binding (addressed): %w", err)
		}
		return nil
	}))
	own.Start(s.own().OnChannel("exchange "+codec.NodeExchange(node)+" (older meshes)", s.dropNodeExchange))
	// Requests are at most once: consumed without acks (an ack per request
	// costs the broker a round of work on the critical path); openCalls
	// bounds how many are open at the local hosts.
	reqs, err := s.con.autoCh.Consume(s.q.req, "requests", true, true, false, false, nil)
	if err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.AccessRefused {
			return &NodeNameInUseError{Node: node, Detail: ae.Reason}
		}
		return fmt.Errorf("consume %s: %w", codec.RequestQueue(node), err)
	}
	if err := own.Wait(); err != nil {
		return err
	}
	if err := s.consumeOwn(reqs); err != nil {
		return err
	}
	if err := pub.Wait(); err != nil {
		return err
	}
	s.con.connClose = s.con.conn.NotifyClose(make(chan *amqp.Error, 1))
	s.con.chClose = s.con.ch.NotifyClose(make(chan *amqp.Error, 1))
	s.con.autoClose = s.con.autoCh.NotifyClose(make(chan *amqp.Error, 1))
	s.con.cancels = s.con.ch.NotifyCancel(make(chan string, 16))
	// Only publishing connections are blocked by a resource alarm.
	s.pub.Blocked = s.pub.Conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	return nil
}

// findShared finds the mesh's shared exchanges and dead letter queue on
// *ch, declaring what is missing (link.Own.FindShared).
func (s *session) findShared(ch **amqp.Channel) error {
	return s.own().FindShared(ch, s.url, s.sizedQuorum())
}

// consumeOwn opens the consumers of the node's event, reply and system
// queues (the event consumer on con.ch beside the two on autoCh) and
// records them with reqs, the request consumer.
func (s *session) consumeOwn(reqs <-chan amqp.Delivery) error {
	node := s.b.cfg.Node
	var events <-chan amqp.Delivery
	var side brokerlink.Asides
	side.Start(func() (err error) {
		if events, err = s.con.ch.Consume(codec.EventQueue(node), "events", false, false, false, false, nil); err != nil {
			return fmt.Errorf("consume %s: %w", codec.EventQueue(node), err)
		}
		return nil
	})
	replies, err := s.con.autoCh.Consume(s.q.rep, "replies", true, true, false, false, nil)
	if err != nil {
		err = fmt.Errorf("consume %s: %w", codec.ReplyQueue(node), err)
	}
	var system <-chan amqp.Delivery
	if err == nil {
		if system, err = s.con.autoCh.Consume(s.q.sys, "system", true, true, false, false, nil); err != nil {
			err = fmt.Errorf("consume %s: %w", codec.SystemQueue(node), err)
		}
	}
	if serr := side.Wait(); serr != nil {
		return serr
	}
	if err != nil {
		return err
	}
	s.con.initial = map[string]<-chan amqp.Delivery{"requests": reqs, "replies": replies, "events": events, "system": system}
	return nil
}

// openConsumeChannels opens the two consume channels: autoCh for what is
// consumed without acks (requests, replies, system messages), con.ch for
// what is acked (events, commands), so that con.ch's delivery tags are
// dense and a run of them can be acked at once.
func (s *session) openConsumeChannels() (err error) {
	if s.con.autoCh, err = s.con.conn.Channel(); err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if s.con.ch, err = s.con.conn.Channel(); err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := s.timed(func() error { return s.con.ch.Qos(s.b.cfg.Prefetch, 0, false) }); err != nil {
		return fmt.Errorf("set prefetch: %w", err)
	}
	return nil
}
