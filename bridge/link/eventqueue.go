package link

import (
	"errors"
	"fmt"

	"github.com/meshbox/meshbox/bridge/codec"
	"github.com/meshbox/meshbox/internal/wire"
	amqp "github.com/rabbitmq/amqp091-go"
)

// This file is the node's event queue (node.<n>.events): a quorum queue,
// so that it lives on every node of a broker cluster and not only on the
// one it was declared on, and the move of an older mesh's classic event
// queue to it; and the arguments all of the node's quorum queues share.

// clusterURLs: a broker setting of this many URLs or more names a cluster,
// whose quorum queues get wire.QuorumGroupSize replicas.
const clusterURLs = 3

// legacyMoveRounds bounds the rounds of moving a classic event queue that
// keeps filling while it is emptied.
const legacyMoveRounds = 5

// QuorumArgs adds to args what the node's quorum queues share (stages,
// events, dead letters): the initial group size when the broker setting
// names a cluster of three or more nodes (Link.Cluster), nothing with
// fewer (RabbitMQ then places a replica on every node). RabbitMQ compares
// the group size when a queue is declared again, so withSize=false asks
// for the other choice (see DeclareEvents).
func QuorumArgs(args amqp.Table, withSize bool) amqp.Table {
	return amqp.Table(wire.QuorumArgs(map[string]any(args), withSize))
}

// Cluster reports whether the broker setting names a cluster, whose
// quorum queues this node declares with an initial group size.
func (l *Link) Cluster() bool { return l.Brokers() >= clusterURLs }

// eventQueueArgs returns the event queue's arguments.
func eventQueueArgs(withSize bool) amqp.Table {
	return QuorumArgs(amqp.Table{"x-expires": codec.EventQueueExpiry.Milliseconds()}, withSize)
}

// DeclareEvents declares the node's event queue as a quorum queue (or
// finds the one the admin declared, FindOrDeclare), with an initial
// group size when sized; its bindings are an EventBinder's. *ch is the setup's channel; a failed declaration closes it, so
// it is replaced by a new one.
//
// A queue of that name may exist with other arguments: declared by this
// node with another broker setting (with or without the group size: it
// is used as it is), by the admin (without x-expires), or the classic
// queue of an older meshbox. A classic
// queue lives on one broker node and cannot be reached while that node
// is down, so it is replaced (moveLegacyEvents): republish is handed
// each event taken from it, in order.
func (o *Own) DeclareEvents(ch **amqp.Channel, sized bool, republish func(*amqp.Delivery)) error {
	q := codec.EventQueue(o.Node)
	err := o.FindOrDeclare(ch, q, func() error {
		// Each form a quorum event queue may have: this node's, with the
		// other group size, and the admin's (NodeQueues).
		var err error
		for _, args := range []amqp.Table{eventQueueArgs(sized), eventQueueArgs(!sized), QuorumArgs(amqp.Table{}, false)} {
			if err = o.declareOn(ch, q, args); !isPrecondition(err) {
				return err
			}
		}
		return o.moveLegacyEvents(ch, q, sized, republish)
	})
	return err
}

// declareOn declares a durable queue on *ch; after a failure *ch is a new
// channel (or the closed one when none can be opened).
func (o *Own) declareOn(ch **amqp.Channel, q string, args amqp.Table) error {
	_, err := (*ch).QueueDeclare(q, true, false, false, false, args)
	if err != nil && (*ch).IsClosed() {
		if nc, cerr := o.Conn.Channel(); cerr == nil {
			*ch = nc
		}
	}
	return err
}

// isPrecondition reports whether err is the broker's 406 PRECONDITION_FAILED:
// a queue exists with other arguments.
func isPrecondition(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed
}

// moveLegacyEvents replaces the classic event queue of an older meshbox
// with the quorum queue, before this session consumes anything. Each
// round takes what waits in the classic queue, republishes it to local
// subscribers in order and acks it (as the consumer would), then deletes
// the queue if it is empty by then; an event that
// arrived meanwhile keeps it, and the next round takes that. Once
// deleted, the quorum queue is declared in its place. An event published
// in the moment between the delete and the new queue's binding does not
// reach this node. When the queue keeps filling for legacyMoveRounds
// rounds, the session uses it as it is and the next one tries again. A
// classic queue whose broker node is down cannot be read, deleted or
// replaced: the setup fails (404) until that node is back, as before.
func (o *Own) moveLegacyEvents(ch **amqp.Channel, q string, sized bool, republish func(*amqp.Delivery)) error {
	moved := 0
	for range legacyMoveRounds {
		var last uint64
		for {
			d, ok, err := (*ch).Get(q, false)
			if err != nil {
				return fmt.Errorf("take from classic event queue: %w", err)
			}
			if !ok {
				break
			}
			republish(&d)
			last = d.DeliveryTag
			moved++
		}
		// Acked once republished, as the consumer does: a failed delete
		// below closes the channel, which would give them back.
		if last > 0 {
			if err := (*ch).Ack(last, true); err != nil {
				return fmt.Errorf("ack classic event queue: %w", err)
			}
		}
		_, err := (*ch).QueueDelete(q, false, true, false)
		if isPrecondition(err) { // not empty: more arrived
			if nc, cerr := o.Conn.Channel(); cerr == nil {
				*ch = nc
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("delete classic event queue: %w", err)
		}
		if err := o.declareOn(ch, q, eventQueueArgs(sized)); err != nil {
			return err
		}
		o.Log.Info("event queue moved to a quorum queue", "queue", q, "events_moved", moved)
		return nil
	}
	o.Log.Warn("classic event queue keeps filling; used as it is, the next connection moves it", "queue", q, "events_moved", moved)
	_, err := (*ch).QueueDeclare(q, true, false, false, false, amqp.Table{"x-expires": codec.EventQueueExpiry.Milliseconds()})
	return err
}
