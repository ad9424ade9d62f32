package bridge

import (
	"errors"
	"fmt"

	"github.com/meshbox/meshbox/bridge/flow"

	"github.com/meshbox/meshbox/bridge/codec"

	amqp "github.com/rabbitmq/amqp091-go"
)

// syncStages consumes the stages the node hosts and cancels the others.
// A stage it cannot consume is recorded as refused (grants.go) and tried
// again at the next sync.
func (s *session) syncStages(decl **amqp.Channel) {
	if s.flows.draining {
		return // the node stops: no stage consumer again
	}
	want := s.b.hostedStages()
	s.flows.mu.Lock()
	defer s.flows.mu.Unlock()
	for stage, f := range s.flows.stages {
		if !want[stage] {
			for len(f.Cons) > 0 {
				if !s.cancelConsumer(f, f.Cons[len(f.Cons)-1].Tag) {
					return
				}
			}
			delete(s.flows.stages, stage)
			delete(s.flows.aux, stage)
			s.b.log.Debug("stage consumers cancelled", "stage", stage)
		}
	}
	s.b.keepRefusals(want)
	for stage := range want {
		if s.flows.stages[stage] != nil {
			continue
		}
		if err := s.declareStage(decl, stage); err != nil {
			s.b.stageRefused(stage, err)
			continue
		}
		s.flows.aux[stage] = s.declareAux(decl, stage)
		f := flow.NewStageFlow(stage, s.b.cfg.Prefetch, s.b.cfg.CommandBatch, s.b.cfg.MaxStagePrefetch, s.b.route.creditOf(stage), &s.flows.rtt)
		if !s.addConsumer(f, f.Wanted()) {
			return
		}
		s.flows.stages[stage] = f
		s.b.stageConsumed(stage)
		s.b.log.Debug("stage consumer started", "stage", stage)
	}
	s.declareDeclaredLocked(decl)
}

// declareOwn declares one of the node's request, reply and system queues
// (named q in the protocol) and returns the name it has on the broker. It
// is exclusive to the consuming connection: the broker deletes it with the
// connection, at once, even when the connection ends because its broker
// node is stopping. A queue that outlived its connection (as these did
// before, for 15 s) is worse on a cluster: while its broker node stops,
// which takes seconds, the queue takes messages and never delivers them,
// and it cannot be declared again from another broker node; an exclusive
// queue is gone, so a message for it comes back unroutable and its sender
// tries again (noroute.go).
//
// It is server-named (amq.gen-*): the node's broker user may configure no
// other name but its claim queue's (NodePermissions, claim). A broker
// user with an older mesh's permissions may configure only q itself; the
// queue is then named q, and its exclusive ownership is the claim on the
// node's name: another connection's declaration is refused
// (NodeNameInUseError). A
// queue made by an older meshbox (shared, with x-expires) is deleted, if
// unused, and declared anew.
func (s *session) declareOwn(ch **amqp.Channel, q string) (string, error) {
	for range 2 {
		if !s.b.learnt.named.Load() {
			dq, err := (*ch).QueueDeclare("", false, true, true, false, nil)
			if !isAccessRefused(err) {
				return dq.Name, err
			}
			if err := s.reopen(ch); err != nil {
				return "", err
			}
			s.b.learnt.named.Store(true)
			continue
		}
		err := s.declareNamed(ch, q)
		if !isAccessRefused(err) {
			return q, err
		}
		if err := s.reopen(ch); err != nil {
			return "", err
		}
		// The permissions are the current ones now: the claim on the
		// node's name is its claim queue again.
		s.b.learnt.named.Store(false)
		if err := s.claim(ch); err != nil {
			return "", err
		}
	}
	return "", fmt.Errorf("the broker refuses this node both a server-named queue and %s: are the node's broker permissions its own?", q)
}

// claim takes this node's claim on its name: its claim queue
// node.<n>.claim, declared exclusive to the consuming connection. Another
// process with the same name and credential is refused it
// (NodeNameInUseError) instead of silently splitting the node's traffic.
// The claim queue is never bound nor consumed: the node's permissions
// give it the right to configure that name and no other right on it, so
// an exchange of that name (which the same right lets it declare) can
// neither be published into nor bound to anything (RabbitMQ asks for the
// write right on the exchange, or the read right on it as a binding's
// source). A broker user with an older mesh's permissions may not declare
// it; there the node's named request queue is the claim (declareOwn).
func (s *session) claim(ch **amqp.Channel) error {
	if s.b.learnt.named.Load() {
		return nil
	}
	q := codec.ClaimQueue(s.b.cfg.Node)
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
		inUse := &NodeNameInUseError{Node: s.b.cfg.Node, Detail: ae.Reason}
		if err := s.reopen(ch); err != nil {
			return err
		}
		if _, err := (*ch).QueueDeclarePassive(q, false, false, false, false, nil); err != nil {
			_ = s.reopen(ch)
			return inUse
		}
		if _, err := (*ch).QueueDelete(q, true, false, false); err != nil {
			_ = s.reopen(ch)
			return inUse
		}
		s.b.log.Warn("deleted a shared queue that stood in the way of this node's claim on its name", "queue", q)
		if _, err := (*ch).QueueDeclare(q, false, true, true, false, nil); err != nil {
			if errors.As(err, &ae) && ae.Code == amqp.ResourceLocked {
				return &NodeNameInUseError{Node: s.b.cfg.Node, Detail: ae.Reason}
			}
			return fmt.Errorf("declare claim queue %s: %w", q, err)
		}
		return nil
	case isAccessRefused(err):
		if err := s.reopen(ch); err != nil {
			return err
		}
		s.b.learnt.named.Store(true) // said with the older exchange (bindOwn)
		return nil
	default:
		return fmt.Errorf("declare claim queue %s: %w", codec.ClaimQueue(s.b.cfg.Node), err)
	}
}

// reopen replaces *ch, closed by a refusal, with a new channel.
func (s *session) reopen(ch **amqp.Channel) error {
	nc, err := s.con.conn.Channel()
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
// mesh's permissions (see declareOwn).
func (s *session) declareNamed(ch **amqp.Channel, q string) error {
	_, err := (*ch).QueueDeclare(q, false, false, true, false, nil)
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.ResourceLocked {
		return err
	}
	// Locked: exclusive to another connection, or shared (made by an older
	// meshbox), which a passive declaration from here tells apart.
	inUse := &NodeNameInUseError{Node: s.b.cfg.Node, Detail: ae.Reason}
	nc, cerr := s.con.conn.Channel()
	if cerr != nil {
		return fmt.Errorf("open channel: %w", cerr)
	}
	*ch = nc
	if _, err := nc.QueueDeclarePassive(q, false, false, false, false, nil); err != nil {
		if nc.IsClosed() {
			if nc, cerr = s.con.conn.Channel(); cerr == nil {
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
	s.b.log.Info("replaced a queue made by an older meshbox with an exclusive one", "queue", q)
	_, err = nc.QueueDeclare(q, false, false, true, false, nil)
	return err
}

// findOrDeclare makes sure durable queue q exists: the admin declares it
// for a broker user with the current permissions (NodePermissions: the
// node may only find it); a node on an older mesh's permissions, or on a
// credential of the whole vhost (a test broker), declares it with args
// itself. found reports the first case. A queue that is neither there nor
// declarable is a *MissingQueueError. After a refusal *ch is a new
// channel.
func (s *session) findOrDeclare(ch **amqp.Channel, q string, declare func() error) error {
	for range 2 {
		if s.b.learnt.admin.Load() {
			_, err := (*ch).QueueDeclarePassive(q, true, false, false, false, nil)
			if err == nil {
				return nil
			}
			var ae *amqp.Error
			if !errors.As(err, &ae) || ae.Code != amqp.NotFound {
				return err
			}
			if err := s.reopen(ch); err != nil {
				return err
			}
		}
		err := declare()
		if !isAccessRefused(err) {
			return err
		}
		if err := s.reopen(ch); err != nil {
			return err
		}
		if s.b.learnt.admin.Load() {
			return &MissingQueueError{Node: s.b.cfg.Node, Queue: q}
		}
		s.b.learnt.admin.Store(true)
	}
	return &MissingQueueError{Node: s.b.cfg.Node, Queue: q}
}

// declareStage declares a stage's quorum queue and binds it. A queue that
// exists with other arguments is used as it is.
func (s *session) declareStage(decl **amqp.Channel, stage string) error {
	q := codec.StageQueue(stage)
	args := stageQueueArgs(s.sizedQuorum())
	err := s.findOrDeclare(decl, q, func() error {
		_, err := (*decl).QueueDeclare(q, true, false, false, false, args)
		return err
	})
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
		nc, cerr := s.con.conn.Channel()
		if cerr != nil {
			return cerr // *decl stays the closed channel, never nil
		}
		*decl = nc
		if _, err = (*decl).QueueDeclarePassive(q, true, false, false, false, nil); err == nil {
			s.b.log.Warn("stage queue exists with other arguments; using it as it is", "queue", q, "detail", ae.Reason)
		}
	}
	if err != nil {
		if (*decl).IsClosed() {
			if nc, cerr := s.con.conn.Channel(); cerr == nil {
				*decl = nc
			}
		}
		return err
	}
	if err := (*decl).QueueBind(q, codec.CommandKey(stage), codec.ExchangeMesh, false, nil); err != nil {
		if (*decl).IsClosed() { // refused: the next declaration needs a channel
			if nc, cerr := s.con.conn.Channel(); cerr == nil {
				*decl = nc
			}
		}
		return fmt.Errorf("bind %s: %w", q, err)
	}
	return nil
}

// bindOwn binds one of the node's own queues with a key of its own name
// (to.<n>.*): to mesh, or, for a broker user with an older mesh's
// permissions (which refuse that binding), to the node's exchange node.<n>
// the admin bound to mesh (see permissions.go). The exchange the session
// bound to is s.q.ex (quiesce unbinds from it).
func (s *session) bindOwn(ch **amqp.Channel, q, key string) error {
	if s.q.ex == "" {
		err := (*ch).QueueBind(q, key, codec.ExchangeMesh, false, nil)
		var ae *amqp.Error
		if !errors.As(err, &ae) || ae.Code != amqp.AccessRefused {
			if err == nil {
				s.q.ex = codec.ExchangeMesh
				s.b.learnt.older.Store(false)
			}
			return err
		}
		// Refused: the permissions predate direct bindings. The refusal
		// closed the channel.
		c, err := s.con.conn.Channel()
		if err != nil {
			return fmt.Errorf("open channel: %w", err)
		}
		*ch = c
		if err := c.ExchangeDeclarePassive(codec.NodeExchange(s.b.cfg.Node), "topic", true, false, false, false, nil); err != nil {
			return fmt.Errorf("the broker refused binding %s to %s, and %w", q, codec.ExchangeMesh, err)
		}
		s.q.ex = codec.NodeExchange(s.b.cfg.Node)
		if s.b.learnt.older.CompareAndSwap(false, true) {
			s.b.log.Warn(WarnOlderPermissions, "exchange", s.q.ex)
		}
	}
	return (*ch).QueueBind(q, key, s.q.ex, false, nil)
}

// dropNodeExchange deletes an older mesh's exchange node.<n> once the
// node's queues are bound to mesh themselves: while it stays bound to
// mesh, every message to this node is routed through it for nothing.
// With the current permissions the node may not delete it (the admin does,
// when it applies them); failing to costs only that routing step, and is
// logged.
func (s *session) dropNodeExchange(ch **amqp.Channel) error {
	if s.q.ex != codec.ExchangeMesh {
		return nil
	}
	ex := codec.NodeExchange(s.b.cfg.Node)
	err := (*ch).ExchangeDeclarePassive(ex, "topic", true, false, false, false, nil)
	if err == nil {
		err = (*ch).ExchangeDelete(ex, false, false)
		if err == nil {
			return nil
		}
		if s.b.learnt.exchangeWarned.CompareAndSwap(false, true) {
			s.b.log.Warn("cannot delete this node's older exchange; messages to it take one more routing step on the broker until the admin runs meshbox mesh node rotate", "exchange", ex, "err", err)
		}
	}
	if (*ch).IsClosed() {
		return s.reopen(ch)
	}
	return nil
}
