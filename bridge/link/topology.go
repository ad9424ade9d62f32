package link

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/meshbox/meshbox/bridge/codec"

	amqp "github.com/rabbitmq/amqp091-go"
)

// This file is the node's own part of the topology: its claim on its name,
// its request, reply and system queues and their bindings, the durable
// queues the admin declares for it, and what the broker's refusals said of
// its permissions. A declaration the broker refuses closes its channel:
// the functions that may meet one take **amqp.Channel and leave a usable
// channel there.

// WarnOlderPermissions is the status warning of a node whose broker user
// has an older mesh's permissions.
const WarnOlderPermissions = "this node's broker permissions are an older mesh's: its requests and replies take one more routing step on the broker; meshbox mesh node rotate gives it the current ones"

// ErrNodeNameInUse means another process holds this node's name on the
// broker (its exclusive request consumer). It is wrapped in a
// *NodeNameInUseError.
var ErrNodeNameInUse = errors.New("node name is in use on the broker by another process")

// NodeNameInUseError is returned by the bridge's Start when the broker refuses this node's
// exclusive consumer of its event queue (or, on an older mesh's
// permissions, its request queue) because another process holds it.
type NodeNameInUseError struct {
	Node   string
	Detail string // the broker's reason
}

func (e *NodeNameInUseError) Error() string {
	return fmt.Sprintf("node name %s is in use on the broker by another process (%s)", e.Node, e.Detail)
}

// Unwrap returns ErrNodeNameInUse.
func (e *NodeNameInUseError) Unwrap() error { return ErrNodeNameInUse }

// MissingQueueError: a durable queue of node Node (its event queue, a
// stage's queue) does not exist, and the node's broker user may not
// declare it: the admin declares those (bridge.NodeQueues).
type MissingQueueError struct {
	Node  string
	Queue string
}

func (e *MissingQueueError) Error() string {
	return fmt.Sprintf("queue %s does not exist on the broker and this node may not declare it: the admin declares it, a stage's queues with meshbox mesh node set-stages %s STAGE... (every stage the node may consume, this one among them), its event queue with meshbox mesh node rotate %s",
		e.Queue, e.Node, e.Node)
}

// Perms is what the broker's refusals said of this node's permissions,
// learnt once so that later sessions do not ask again. Its fields are
// safe for concurrent use.
type Perms struct {
	// Older: the last session found this node's broker permissions to be
	// an older mesh's; said once in the log and while it holds in the
	// status.
	Older atomic.Bool
	// Named: this node's broker user may not declare server-named queues
	// (an older mesh's permissions): its request, reply and system queues
	// are named after it. Admin: it may not declare its durable queues
	// (the current permissions): the admin has, and it finds them.
	Named, Admin atomic.Bool
	// Shared: the broker URL on which a session found the mesh's shared
	// exchanges and dead letter queue; the next sessions on it do not ask
	// again (three round trips), until one ends on a 404.
	Shared atomic.Pointer[string]
	// ExchangeWarned: the node said once that it may not delete its
	// older mesh's exchange.
	ExchangeWarned atomic.Bool
	// Accepted are the broker users a session ran with in this process:
	// a later refusal of one is a revocation, of another a wrong
	// credential.
	Accepted sync.Map
}

// Own declares a node's own topology on one consuming connection.
type Own struct {
	Conn  *amqp.Connection // the consuming connection: exclusive queues are its
	Node  string
	Perms *Perms
	Log   *slog.Logger
}

// Declare declares one of the node's request, reply and system queues
// (named q in the protocol) and returns the name it has on the broker. It
// is exclusive to the consuming connection: the broker deletes it with the
// connection, at once, even when the connection ends because its broker
// node is stopping. A queue that outlived its connection (as these did
// before, for 15 s) is worse on a cluster: while its broker node stops,
// which takes seconds, the queue takes messages and never delivers them,
// and it cannot be declared again from another broker node; an exclusive
// queue is gone, so a message for it comes back unroutable and its sender
// tries again (the bridge's noroute.go).
//
// It is server-named (amq.gen-*): the node's broker user may configure no
// other name but its claim queue's (NodePermissions, Claim). A broker
// user with an older mesh's permissions may configure only q itself; the
// queue is then named q, and its exclusive ownership is the claim on the
// node's name: another connection's declaration is refused
// (NodeNameInUseError). A
// queue made by an older meshbox (shared, with x-expires) is deleted, if
// unused, and declared anew.
func (o *Own) Declare(ch **amqp.Channel, q string) (string, error) {
	for range 2 {
		if !o.Perms.Named.Load() {
			dq, err := (*ch).QueueDeclare("", false, true, true, false, nil)
			if !isAccessRefused(err) {
				return dq.Name, err
			}
			if err := o.Reopen(ch); err != nil {
				return "", err
			}
			o.Perms.Named.Store(true)
			continue
		}
		err := o.declareNamed(ch, q)
		if !isAccessRefused(err) {
			return q, err
		}
		if err := o.Reopen(ch); err != nil {
			return "", err
		}
		// The permissions are the current ones now: the claim on the
		// node's name is its claim queue again.
		o.Perms.Named.Store(false)
		if err := o.Claim(ch); err != nil {
			return "", err
		}
	}
	return "", fmt.Errorf("the broker refuses this node both a server-named queue and %s: are the node's broker permissions its own?", q)
}

// Claim takes this node's claim on its name: its claim queue
// node.<n>.claim, declared exclusive to the consuming connection. Another
// process with the same name and credential is refused it
// (NodeNameInUseError) instead of silently splitting the node's traffic.
// The claim queue is never bound nor consumed: the node's permissions
// give it the right to configure that name and no other right on it, so
// an exchange of that name (which the same right lets it declare) can
// neither be published into nor bound to anything (RabbitMQ asks for the
// write right on the exchange, or the read right on it as a binding's
// source). A broker user with an older mesh's permissions may not declare
// it; there the node's named request queue is the claim (Declare).
func (o *Own) Claim(ch **amqp.Channel) error {
	if o.Perms.Named.Load() {
		return nil
	}
	q := codec.ClaimQueue(o.Node)
	_, err := (*ch).QueueDeclare(q, false, true, true, false, nil)
	var ae *amqp.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ae) && ae.Code == amqp.ResourceLocked:
		// Exclusive to another connection (another process has the
		// name), or a shared queue of that name, which anyone holding
		// this node's credential could have declared to keep it out: a
		// passive declaration from here tells them apart, and a shared
		// one is deleted and the claim taken.
		inUse := &NodeNameInUseError{Node: o.Node, Detail: ae.Reason}
		if err := o.Reopen(ch); err != nil {
			return err
		}
		if _, err := (*ch).QueueDeclarePassive(q, false, false, false, false, nil); err != nil {
			_ = o.Reopen(ch)
			return inUse
		}
		if _, err := (*ch).QueueDelete(q, true, false, false); err != nil {
			_ = o.Reopen(ch)
			return inUse
		}
		o.Log.Warn("deleted a shared queue that stood in the way of this node's claim on its name", "queue", q)
		if _, err := (*ch).QueueDeclare(q, false, true, true, false, nil); err != nil {
			if errors.As(err, &ae) && ae.Code == amqp.ResourceLocked {
				return &NodeNameInUseError{Node: o.Node, Detail: ae.Reason}
			}
			return fmt.Errorf("declare claim queue %s: %w", q, err)
		}
		return nil
	case isAccessRefused(err):
		if err := o.Reopen(ch); err != nil {
			return err
		}
		o.Perms.Named.Store(true) // said with the older exchange (Bind)
		return nil
	default:
		return fmt.Errorf("declare claim queue %s: %w", codec.ClaimQueue(o.Node), err)
	}
}

// Reopen replaces *ch, closed by a refusal, with a new channel.
func (o *Own) Reopen(ch **amqp.Channel) error {
	nc, err := o.Conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	*ch = nc
	return nil
}

// isAccessRefused reports whether err is the broker's 403 ACCESS_REFUSED.
func isAccessRefused(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == amqp.AccessRefused
}

// declareNamed declares q, exclusive, for a broker user with an older
// mesh's permissions (see Declare).
func (o *Own) declareNamed(ch **amqp.Channel, q string) error {
	_, err := (*ch).QueueDeclare(q, false, false, true, false, nil)
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.ResourceLocked {
		return err
	}
	// Locked: exclusive to another connection, or shared (made by an older
	// meshbox), which a passive declaration from here tells apart.
	inUse := &NodeNameInUseError{Node: o.Node, Detail: ae.Reason}
	nc, cerr := o.Conn.Channel()
	if cerr != nil {
		return fmt.Errorf("open channel: %w", cerr)
	}
	*ch = nc
	if _, err := nc.QueueDeclarePassive(q, false, false, false, false, nil); err != nil {
		if nc.IsClosed() {
			if nc, cerr = o.Conn.Channel(); cerr == nil {
				*ch = nc
			}
		}
		return inUse
	}
	if _, err := nc.QueueDelete(q, true, false, false); err != nil {
		if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
			return inUse // consumed: an older meshbox runs as this node
		}
		return fmt.Errorf("replace queue %s of an older meshbox: %w", q, err)
	}
	o.Log.Info("replaced a queue made by an older meshbox with an exclusive one", "queue", q)
	_, err = nc.QueueDeclare(q, false, false, true, false, nil)
	return err
}

// FindOrDeclare makes sure durable queue q exists: the admin declares it
// for a broker user with the current permissions (NodePermissions: the
// node may only find it); a node on an older mesh's permissions, or on a
// credential of the whole vhost (a test broker), declares it with args
// itself. found reports the first case. A queue that is neither there nor
// declarable is a *MissingQueueError. After a refusal *ch is a new
// channel.
func (o *Own) FindOrDeclare(ch **amqp.Channel, q string, declare func() error) error {
	for range 2 {
		if o.Perms.Admin.Load() {
			_, err := (*ch).QueueDeclarePassive(q, true, false, false, false, nil)
			if err == nil {
				return nil
			}
			var ae *amqp.Error
			if !errors.As(err, &ae) || ae.Code != amqp.NotFound {
				return err
			}
			if err := o.Reopen(ch); err != nil {
				return err
			}
		}
		err := declare()
		if !isAccessRefused(err) {
			return err
		}
		if err := o.Reopen(ch); err != nil {
			return err
		}
		if o.Perms.Admin.Load() {
			return &MissingQueueError{Node: o.Node, Queue: q}
		}
		o.Perms.Admin.Store(true)
	}
	return &MissingQueueError{Node: o.Node, Queue: q}
}

// Bind binds one of the node's own queues with a key of its own name
// (to.<n>.*): to mesh, or, for a broker user with an older mesh's
// permissions (which refuse that binding), to the node's exchange node.<n>
// the admin bound to mesh (see permissions.go). The exchange the session
// bound to is *ex (a handover's Quiesce unbinds from it).
func (o *Own) Bind(ch **amqp.Channel, ex *string, q, key string) error {
	if *ex == "" {
		err := (*ch).QueueBind(q, key, codec.ExchangeMesh, false, nil)
		var ae *amqp.Error
		if !errors.As(err, &ae) || ae.Code != amqp.AccessRefused {
			if err == nil {
				*ex = codec.ExchangeMesh
				o.Perms.Older.Store(false)
			}
			return err
		}
		// Refused: the permissions predate direct bindings. The refusal
		// closed the channel.
		c, err := o.Conn.Channel()
		if err != nil {
			return fmt.Errorf("open channel: %w", err)
		}
		*ch = c
		if err := c.ExchangeDeclarePassive(codec.NodeExchange(o.Node), "topic", true, false, false, false, nil); err != nil {
			return fmt.Errorf("the broker refused binding %s to %s, and %w", q, codec.ExchangeMesh, err)
		}
		*ex = codec.NodeExchange(o.Node)
		if o.Perms.Older.CompareAndSwap(false, true) {
			o.Log.Warn(WarnOlderPermissions, "exchange", *ex)
		}
	}
	return (*ch).QueueBind(q, key, *ex, false, nil)
}

// DropNodeExchange deletes an older mesh's exchange node.<n> once the
// node's queues are bound to mesh themselves: while it stays bound to
// mesh, every message to this node is routed through it for nothing.
// With the current permissions the node may not delete it (the admin does,
// when it applies them); failing to costs only that routing step, and is
// logged.
// bound is the exchange the node's queues are bound to (Bind).
func (o *Own) DropNodeExchange(ch **amqp.Channel, bound string) error {
	if bound != codec.ExchangeMesh {
		return nil
	}
	ex := codec.NodeExchange(o.Node)
	err := (*ch).ExchangeDeclarePassive(ex, "topic", true, false, false, false, nil)
	if err == nil {
		err = (*ch).ExchangeDelete(ex, false, false)
		if err == nil {
			return nil
		}
		if o.Perms.ExchangeWarned.CompareAndSwap(false, true) {
			o.Log.Warn("cannot delete this node's older exchange; messages to it take one more routing step on the broker until the admin runs meshbox mesh node rotate", "exchange", ex, "err", err)
		}
	}
	if (*ch).IsClosed() {
		return o.Reopen(ch)
	}
	return nil
}

// Asides are setup steps running beside the main line, each on a
// goroutine of its own that ends with its broker calls (the caller bounds
// them). The zero value is ready; one goroutine uses it.
type Asides struct {
	errs chan error
	n    int // started and not yet waited for
}

// Start runs step beside the caller.
func (a *Asides) Start(step func() error) {
	if a.errs == nil {
		a.errs = make(chan error, 8)
	}
	a.n++
	go func() { a.errs <- step() }()
}

// Wait waits for every step started and returns the first error, a
// *NodeNameInUseError before any other. Waiting again returns nil.
func (a *Asides) Wait() error {
	var first error
	for ; a.n > 0; a.n-- {
		err := <-a.errs
		var inUse *NodeNameInUseError
		if err != nil && (first == nil || errors.As(err, &inUse)) {
			first = err
		}
	}
	return first
}

// OnChannel returns step run on a channel of its own, closed after it;
// failures are named after what.
func (o *Own) OnChannel(what string, step func(ch **amqp.Channel) error) func() error {
	return func() error {
		ch, err := o.Conn.Channel()
		if err != nil {
			return fmt.Errorf("open channel: %w", err)
		}
		defer func() { _ = ch.Close() }() // the channel step left open, maybe a new one
		err = step(&ch)
		var inUse *NodeNameInUseError
		if err != nil && !errors.As(err, &inUse) {
			err = fmt.Errorf("declare %s: %w", what, err)
		}
		return err
	}
}

// FindShared finds the mesh's shared exchanges and dead letter queue on
// *ch, declaring what is missing. They are the admin's (see
// the bridge's permissions.go): a node on a broker user of its own may not declare
// them, only find them. A mesh run on one credential (a test broker,
// guest) has no admin: the first node declares them. The dead letter
// queue is not needed to carry traffic: a node whose broker cannot reach
// it (an older mesh's classic queue, its broker node down: 404) goes on
// without it; dead letters wait for it in mesh.dlx's binding or are
// dropped by the broker meanwhile. A session that found them all says so
// for the broker URL (learnt.Shared), and the next ones on it do not ask
// again (three round trips), until one ends on a 404.
func (o *Own) FindShared(ch **amqp.Channel, url string, sized bool) error {
	if u := o.Perms.Shared.Load(); u != nil && *u == url {
		return nil
	}
	shared := []struct {
		what     string
		passive  func(*amqp.Channel) error
		declare  func(*amqp.Channel) error
		optional bool
	}{
		{"exchange " + codec.ExchangeMesh,
			func(c *amqp.Channel) error {
				return c.ExchangeDeclarePassive(codec.ExchangeMesh, "topic", true, false, false, false, nil)
			},
			func(c *amqp.Channel) error {
				return c.ExchangeDeclare(codec.ExchangeMesh, "topic", true, false, false, false, nil)
			}, false},
		{"exchange " + codec.ExchangeDLX,
			func(c *amqp.Channel) error {
				return c.ExchangeDeclarePassive(codec.ExchangeDLX, "topic", true, false, false, false, nil)
			},
			func(c *amqp.Channel) error {
				return c.ExchangeDeclare(codec.ExchangeDLX, "topic", true, false, false, false, nil)
			}, false},
		{"queue " + codec.QueueDead,
			func(c *amqp.Channel) error {
				_, err := c.QueueDeclarePassive(codec.QueueDead, true, false, false, false, nil)
				return err
			},
			func(c *amqp.Channel) error {
				if _, err := c.QueueDeclare(codec.QueueDead, true, false, false, false, QuorumArgs(amqp.Table{}, sized)); err != nil {
					return err
				}
				return c.QueueBind(codec.QueueDead, "#", codec.ExchangeDLX, false, nil)
			}, true},
	}
	allFound := true
	for _, st := range shared {
		err := st.passive(*ch)
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			// A failed passive declare closes the channel.
			if err := o.Reopen(ch); err != nil {
				return err
			}
			err = st.declare(*ch)
		}
		if err != nil && st.optional {
			allFound = false // asked again by the next session
			o.Log.Warn("cannot declare "+st.what+"; going on without it", "err", err)
			if (*ch).IsClosed() {
				if err := o.Reopen(ch); err != nil {
					return err
				}
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("declare %s: %w", st.what, err)
		}
	}
	if allFound {
		u := url
		o.Perms.Shared.Store(&u)
	}
	return nil
}
