package link

import (
	"errors"
	"fmt"

	"github.com/meshbox/meshbox/bridge/codec"
	amqp "github.com/rabbitmq/amqp091-go"
)

// A session's setup: the topology it declares and the channels it opens
// (topology.go and eventqueue.go hold the declarations themselves). Every step is a broker
// round trip, which on a home link (20-80 ms) is what a reconnect waits
// for, so the steps that do not depend on each other run side by side,
// each on a channel of its own (a failed declaration closes its channel):
// the publishing connection's channels, the consume channels, the event
// queue, the reply and system queues. What must come first comes first:
// the node's claim on its name, before any of its queues is bound or
// consumed, and the request queue's binding, which learns which exchange
// the node's queues are bound to (Own.Bind).

// SessionSetup is what a session's setup needs.
type SessionSetup struct {
	Own      *Own       // the consuming connection and the node's own topology
	Pub      *Publisher // the publishing connection
	URL      string     // the broker URL of the session
	Sized    bool       // quorum queues with an initial group size (Link.Cluster)
	Prefetch int        // of the acked consume channel
	// Early is called, beside the rest of the setup, once the publishing
	// channels are open on a broker URL where an earlier session found the
	// shared exchanges: what waits to be published may go from then on.
	Early func()
	// Timed runs a broker call whose time is a round trip of the link.
	Timed func(call func() error) error
	// Republish is handed the events an older classic event queue held.
	Republish func(*amqp.Delivery)
	// Events binds the event queue, all its keys again (EventBinder.Apply).
	Events *EventBinder
}

// Consuming is a session's consuming side once set up: its channels, the
// node's own queues and their first consumers, and the close
// notifications to watch.
type Consuming struct {
	// Ch is the acked consume channel (events, commands), AutoCh the
	// unacked one (requests, replies, system messages).
	Ch, AutoCh *amqp.Channel
	// Ex is the exchange the node's own queues are bound to: mesh, or
	// node.<n> for a broker user with an older mesh's permissions.
	Ex string
	// Req, Rep and Sys are the session's request, reply and system
	// queues: server-named (amq.gen-*), or, for a broker user with an
	// older mesh's permissions, node.<n>.requests, .replies and .system.
	Req, Rep, Sys string
	// Initial are the consumers opened by the setup: requests, replies,
	// events, system.
	Initial                       map[string]<-chan amqp.Delivery
	Cancels                       chan string
	ConnClose, ChClose, AutoClose chan *amqp.Error
}

// Run declares the topology (see the bridge's internals page), claims the
// node's request queue with an exclusive consumer, and opens the channels.
func (st *SessionSetup) Run() (*Consuming, error) {
	c := &Consuming{}
	if err := st.run(c); err != nil {
		return nil, err
	}
	return c, nil
}

func (st *SessionSetup) run(c *Consuming) error {
	node := st.Own.Node
	var pub, chans, own Asides
	defer func() { _ = errors.Join(pub.Wait(), chans.Wait(), own.Wait()) }() // after a failure: the steps still running
	pub.Start(func() error {
		if err := st.Pub.Open(); err != nil {
			return err
		}
		// On a broker URL where an earlier session found the shared
		// exchanges, the outbox need not wait for the rest of the setup
		// (half a dozen round trips more): it drains from here on. Should
		// the setup fail, what was sent goes again, marked as a possible
		// duplicate, like after any cut.
		if u := st.Own.Perms.Shared.Load(); u != nil && *u == st.URL {
			st.Early()
		}
		return nil
	})
	chans.Start(func() error { return st.openConsumeChannels(c) })
	ch, err := st.Own.Conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer func() { // ch may be replaced below, and is nil when reopening it failed
		if ch != nil {
			_ = ch.Close()
		}
	}()
	if err := st.Own.FindShared(&ch, st.URL, st.Sized); err != nil {
		return err
	}
	if err := chans.Wait(); err != nil {
		return err
	}
	// The node's claim on its name comes first, before any of its queues
	// is bound or consumed (claim; on an older mesh's permissions, the
	// named request queue is the claim).
	if err := st.Own.Claim(&ch); err != nil {
		return err
	}
	if c.Req, err = st.Own.Declare(&ch, codec.RequestQueue(node)); err != nil {
		var inUse *NodeNameInUseError
		if errors.As(err, &inUse) {
			return err
		}
		return fmt.Errorf("declare queue %s: %w", codec.RequestQueue(node), err)
	}
	own.Start(st.Own.OnChannel("queue "+codec.EventQueue(node), func(ch **amqp.Channel) error {
		if err := st.Own.DeclareEvents(ch, st.Sized, st.Republish); err != nil {
			return err
		}
		return st.Events.Apply(st.Own.Conn, true)
	}))
	if err := st.Own.Bind(&ch, &c.Ex, c.Req, codec.RequestBindingKey(node)); err != nil {
		var inUse *NodeNameInUseError
		if errors.As(err, &inUse) {
			return err
		}
		return fmt.Errorf("declare binding %s: %w", codec.RequestQueue(node), err)
	}
	own.Start(st.Own.OnChannel("queue "+codec.ReplyQueue(node), func(ch **amqp.Channel) (err error) {
		if c.Rep, err = st.Own.Declare(ch, codec.ReplyQueue(node)); err != nil {
			return err
		}
		if err := st.Own.Bind(ch, &c.Ex, c.Rep, codec.ReplyKey(node)); err != nil {
			return fmt.Errorf("binding: %w", err)
		}
		return nil
	}))
	own.Start(st.Own.OnChannel("queue "+codec.SystemQueue(node), func(ch **amqp.Channel) (err error) {
		if c.Sys, err = st.Own.Declare(ch, codec.SystemQueue(node)); err != nil {
			return err
		}
		if err := (*ch).QueueBind(c.Sys, "sys.#", codec.ExchangeMesh, false, nil); err != nil {
			return fmt.Errorf("binding: %w", err)
		}
		if err := st.Own.Bind(ch, &c.Ex, c.Sys, "to."+node+".sys.#"); err != nil {
			return fmt.Errorf("binding (addressed): %w", err)
		}
		return nil
	}))
	own.Start(st.Own.OnChannel("exchange "+codec.NodeExchange(node)+" (older meshes)", func(ch **amqp.Channel) error {
		return st.Own.DropNodeExchange(ch, c.Ex)
	}))
	// Requests are at most once: consumed without acks (an ack per request
	// costs the broker a round of work on the critical path); openCalls
	// bounds how many are open at the local hosts.
	reqs, err := c.AutoCh.Consume(c.Req, "requests", true, true, false, false, nil)
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
	if err := st.consumeOwn(c, reqs); err != nil {
		return err
	}
	if err := pub.Wait(); err != nil {
		return err
	}
	c.ConnClose = st.Own.Conn.NotifyClose(make(chan *amqp.Error, 1))
	c.ChClose = c.Ch.NotifyClose(make(chan *amqp.Error, 1))
	c.AutoClose = c.AutoCh.NotifyClose(make(chan *amqp.Error, 1))
	c.Cancels = c.Ch.NotifyCancel(make(chan string, 16))
	// Only publishing connections are blocked by a resource alarm.
	st.Pub.Blocked = st.Pub.Conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	return nil
}

// consumeOwn opens the consumers of the node's event, reply and system
// queues (the event consumer on Ch beside the two on AutoCh) and
// records them with reqs, the request consumer.
func (st *SessionSetup) consumeOwn(c *Consuming, reqs <-chan amqp.Delivery) error {
	node := st.Own.Node
	var events <-chan amqp.Delivery
	var side Asides
	side.Start(func() (err error) {
		if events, err = c.Ch.Consume(codec.EventQueue(node), "events", false, false, false, false, nil); err != nil {
			return fmt.Errorf("consume %s: %w", codec.EventQueue(node), err)
		}
		return nil
	})
	replies, err := c.AutoCh.Consume(c.Rep, "replies", true, true, false, false, nil)
	if err != nil {
		err = fmt.Errorf("consume %s: %w", codec.ReplyQueue(node), err)
	}
	var system <-chan amqp.Delivery
	if err == nil {
		if system, err = c.AutoCh.Consume(c.Sys, "system", true, true, false, false, nil); err != nil {
			err = fmt.Errorf("consume %s: %w", codec.SystemQueue(node), err)
		}
	}
	if serr := side.Wait(); serr != nil {
		return serr
	}
	if err != nil {
		return err
	}
	c.Initial = map[string]<-chan amqp.Delivery{"requests": reqs, "replies": replies, "events": events, "system": system}
	return nil
}

// openConsumeChannels opens the two consume channels: AutoCh for what is
// consumed without acks (requests, replies, system messages), Ch for
// what is acked (events, commands), so that Ch's delivery tags are
// dense and a run of them can be acked at once.
func (st *SessionSetup) openConsumeChannels(c *Consuming) (err error) {
	if c.AutoCh, err = st.Own.Conn.Channel(); err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if c.Ch, err = st.Own.Conn.Channel(); err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := st.Timed(func() error { return c.Ch.Qos(st.Prefetch, 0, false) }); err != nil {
		return fmt.Errorf("set prefetch: %w", err)
	}
	return nil
}
