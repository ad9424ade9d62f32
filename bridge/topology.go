package bridge

import (
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const (
	// eventQueueExpiry deletes the event queue of a node unused this long.
	eventQueueExpiry = 7 * 24 * time.Hour
)

// setup declares the topology (see the package doc), claims the node's
// request queue with an exclusive consumer, and opens the channels.
func (s *session) setup() (err error) {
	node := s.b.cfg.Node
	// The publishing connection's channels meanwhile: each is a broker
	// round trip, which on a home link is what a reconnect waits for.
	pubDone := make(chan error, 1)
	go func() { pubDone <- s.setupPublishing() }() // exits with the calls (prepare bounds them)
	joined := false
	defer func() {
		if !joined {
			<-pubDone
		}
	}()
	ch, err := s.con.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer func() { // ch may be replaced below, and is nil when reopening it failed
		if ch != nil {
			_ = ch.Close()
		}
	}()
	// The shared exchanges and the dead letter queue are the admin's (see
	// permissions.go): a node on a broker user of its
	// own may not declare them, only find them. A mesh run on one
	// credential (a test broker, guest) has no admin: the first node
	// declares them.
	// The dead letter queue is not needed to carry traffic: a node whose
	// broker cannot reach it (an older mesh's classic queue, its broker
	// node down: 404) goes on without it; dead letters wait for it in
	// mesh.dlx's binding or are dropped by the broker meanwhile.
	shared := []struct {
		what     string
		passive  func(*amqp.Channel) error
		declare  func(*amqp.Channel) error
		optional bool
	}{
		{"exchange " + exchangeMesh,
			func(c *amqp.Channel) error {
				return c.ExchangeDeclarePassive(exchangeMesh, "topic", true, false, false, false, nil)
			},
			func(c *amqp.Channel) error {
				return c.ExchangeDeclare(exchangeMesh, "topic", true, false, false, false, nil)
			}, false},
		{"exchange " + exchangeDLX,
			func(c *amqp.Channel) error {
				return c.ExchangeDeclarePassive(exchangeDLX, "topic", true, false, false, false, nil)
			},
			func(c *amqp.Channel) error {
				return c.ExchangeDeclare(exchangeDLX, "topic", true, false, false, false, nil)
			}, false},
		{"queue " + queueDead,
			func(c *amqp.Channel) error {
				_, err := c.QueueDeclarePassive(queueDead, true, false, false, false, nil)
				return err
			},
			func(c *amqp.Channel) error {
				if _, err := c.QueueDeclare(queueDead, true, false, false, false, quorumArgs(amqp.Table{}, s.sizedQuorum())); err != nil {
					return err
				}
				return c.QueueBind(queueDead, "#", exchangeDLX, false, nil)
			}, true},
	}
	// The consume channels open meanwhile (a round trip each).
	consumeChans := make(chan error, 1)
	go func() { consumeChans <- s.openConsumeChannels() }() // exits with the calls (prepare bounds them)
	chansJoined := false
	defer func() {
		if !chansJoined {
			<-consumeChans
		}
	}()
	if u := s.b.learnt.shared.Load(); u != nil && *u == s.url {
		shared = nil // found by an earlier session: not asked again
	}
	allFound := len(shared) > 0
	for _, st := range shared {
		err := st.passive(ch)
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			// A failed passive declare closes the channel.
			ch, err = s.con.conn.Channel()
			if err != nil {
				return fmt.Errorf("open channel: %w", err)
			}
			err = st.declare(ch)
		}
		if err != nil && st.optional {
			allFound = false // asked again by the next session
			s.b.log.Warn("cannot declare "+st.what+"; going on without it", "err", err)
			if ch.IsClosed() {
				if ch, err = s.con.conn.Channel(); err != nil {
					return fmt.Errorf("open channel: %w", err)
				}
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("declare %s: %w", st.what, err)
		}
	}
	if allFound {
		u := s.url
		s.b.learnt.shared.Store(&u)
	}
	chansJoined = true
	if err := <-consumeChans; err != nil {
		return err
	}
	// The node's claim on its name comes first, before any of its queues
	// is bound or consumed (claim; on an older mesh's permissions, the
	// named request queue is the claim).
	if err := s.claim(&ch); err != nil {
		return err
	}
	if s.q.req, err = s.declareOwn(&ch, requestQueue(node)); err != nil {
		var inUse *NodeNameInUseError
		if errors.As(err, &inUse) {
			return err
		}
		return fmt.Errorf("declare queue %s: %w", requestQueue(node), err)
	}
	// The event queue on a channel of its own meanwhile: it may take a
	// few declarations (findOrDeclare), each a round trip.
	eventsDeclared := make(chan error, 1)
	go func() { eventsDeclared <- s.declareEventsAlone() }() // exits with the calls (prepare bounds them)
	eventsJoined := false
	defer func() {
		if !eventsJoined {
			<-eventsDeclared
		}
	}()
	steps := []struct {
		what string
		do   func() error
	}{
		{"binding " + requestQueue(node), func() error { return s.bindOwn(&ch, s.q.req, requestBindingKey(node)) }},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			var inUse *NodeNameInUseError
			if errors.As(err, &inUse) {
				return err
			}
			return fmt.Errorf("declare %s: %w", st.what, err)
		}
	}
	// The reply and system queues, and an older mesh's exchange, each on
	// a channel of its own side by side: each step is a broker round
	// trip, and on a home link a reconnect waits for them. The request
	// binding came first: it learns which exchange the node's queues are
	// bound to (bindOwn).
	groups := []struct {
		what string
		do   func(ch **amqp.Channel) error
	}{
		{"queue " + replyQueue(node), func(ch **amqp.Channel) (err error) {
			if s.q.rep, err = s.declareOwn(ch, replyQueue(node)); err != nil {
				return err
			}
			if err := s.bindOwn(ch, s.q.rep, replyKey(node)); err != nil {
				return fmt.Errorf("binding: %w", err)
			}
			return nil
		}},
		{"queue " + systemQueue(node), func(ch **amqp.Channel) (err error) {
			if s.q.sys, err = s.declareOwn(ch, systemQueue(node)); err != nil {
				return err
			}
			if err := (*ch).QueueBind(s.q.sys, "sys.#", exchangeMesh, false, nil); err != nil {
				return fmt.Errorf("binding: %w", err)
			}
			if err := s.bindOwn(ch, s.q.sys, "to."+node+".sys.#"); err != nil {
				return fmt.Errorf("binding (addressed): %w", err)
			}
			return nil
		}},
		{"exchange " + nodeExchange(node) + " (older meshes)", func(ch **amqp.Channel) error { return s.dropNodeExchange(ch) }},
	}
	groupErrs := make(chan error, len(groups))
	for _, g := range groups {
		go func() { // exits with the calls (prepare bounds them)
			gch, err := s.con.conn.Channel()
			if err != nil {
				groupErrs <- fmt.Errorf("open channel: %w", err)
				return
			}
			err = g.do(&gch)
			_ = gch.Close()
			var inUse *NodeNameInUseError
			if err != nil && !errors.As(err, &inUse) {
				err = fmt.Errorf("declare %s: %w", g.what, err)
			}
			groupErrs <- err
		}()
	}
	groupsLeft := len(groups)
	defer func() {
		for ; groupsLeft > 0; groupsLeft-- {
			<-groupErrs
		}
	}()
	// Requests are at most once: consumed without acks (an ack per request
	// costs the broker a round of work on the critical path); openCalls
	// bounds how many are open at the local hosts.
	reqs, err := s.con.autoCh.Consume(s.q.req, "requests", true, true, false, false, nil)
	if err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.AccessRefused {
			return &NodeNameInUseError{Node: node, Detail: ae.Reason}
		}
		return fmt.Errorf("consume %s: %w", requestQueue(node), err)
	}
	var first error
	for ; groupsLeft > 0; groupsLeft-- {
		err := <-groupErrs
		var inUse *NodeNameInUseError
		if err != nil && (first == nil || errors.As(err, &inUse)) {
			first = err
		}
	}
	if first != nil {
		return first
	}
	eventsJoined = true
	if err := <-eventsDeclared; err != nil {
		return fmt.Errorf("declare queue %s: %w", eventQueue(node), err)
	}
	// The event consumer (on ch) beside the two on autoCh.
	type consumed struct {
		ds  <-chan amqp.Delivery
		err error
	}
	eventsC := make(chan consumed, 1)
	go func() { // exits with the call (prepare bounds it)
		ds, err := s.con.ch.Consume(eventQueue(node), "events", false, false, false, false, nil)
		eventsC <- consumed{ds, err}
	}()
	replies, err := s.con.autoCh.Consume(s.q.rep, "replies", true, true, false, false, nil)
	var system <-chan amqp.Delivery
	if err == nil {
		system, err = s.con.autoCh.Consume(s.q.sys, "system", true, true, false, false, nil)
		if err != nil {
			err = fmt.Errorf("consume %s: %w", systemQueue(node), err)
		}
	} else {
		err = fmt.Errorf("consume %s: %w", replyQueue(node), err)
	}
	ev := <-eventsC
	if ev.err != nil {
		return fmt.Errorf("consume %s: %w", eventQueue(node), ev.err)
	}
	if err != nil {
		return err
	}
	events := ev.ds
	s.con.initial = map[string]<-chan amqp.Delivery{"requests": reqs, "replies": replies, "events": events, "system": system}

	joined = true
	if err := <-pubDone; err != nil {
		return err
	}
	s.con.connClose = s.con.conn.NotifyClose(make(chan *amqp.Error, 1))
	s.con.chClose = s.con.ch.NotifyClose(make(chan *amqp.Error, 1))
	s.con.autoClose = s.con.autoCh.NotifyClose(make(chan *amqp.Error, 1))
	s.con.cancels = s.con.ch.NotifyCancel(make(chan string, 16))
	// Only publishing connections are blocked by a resource alarm.
	s.pub.blocked = s.pub.conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	return nil
}

// syncStages consumes the stages the node hosts and cancels the others.
func (s *session) syncStages(decl **amqp.Channel) {
	if s.flows.draining {
		return // the node stops: no stage consumer again
	}
	want := s.b.hostedStages()
	s.flows.mu.Lock()
	defer s.flows.mu.Unlock()
	for stage, f := range s.flows.stages {
		if !want[stage] {
			for len(f.cons) > 0 {
				if !s.cancelConsumer(f, f.cons[len(f.cons)-1].tag) {
					return
				}
			}
			delete(s.flows.stages, stage)
			delete(s.flows.aux, stage)
			s.b.log.Debug("stage consumers cancelled", "stage", stage)
		}
	}
	for stage := range want {
		if s.flows.stages[stage] != nil {
			continue
		}
		if err := s.declareStage(decl, stage); err != nil {
			s.b.log.Error("cannot declare stage queue", "stage", stage, "err", err)
			continue
		}
		s.flows.aux[stage] = s.declareAux(decl, stage)
		f := newStageFlow(stage, s.b.cfg.Prefetch, s.b.cfg.CommandBatch, s.b.cfg.MaxStagePrefetch, s.b.route.creditOf(stage), &s.flows.rtt)
		if !s.addConsumer(f, f.wanted()) {
			return
		}
		s.flows.stages[stage] = f
		s.b.log.Debug("stage consumer started", "stage", stage)
	}
	s.declareDeclaredLocked(decl)
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

// declareEventsAlone declares the node's event queue on a channel of its
// own.
func (s *session) declareEventsAlone() error {
	ch, err := s.con.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer func() { _ = ch.Close() }() // the channel declareEvents left open, maybe a new one
	return s.declareEvents(&ch)
}

// setupPublishing opens the publishing connection's channels: one in
// confirm mode for what is confirmed, one without for requests and replies.
func (s *session) setupPublishing() (err error) {
	s.pub.ch, err = s.pub.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := s.pub.ch.Confirm(false); err != nil {
		return fmt.Errorf("confirm mode: %w", err)
	}
	s.pub.confirms = s.pub.ch.NotifyPublish(make(chan amqp.Confirmation, publishWindow))
	s.pub.returns = s.pub.ch.NotifyReturn(make(chan amqp.Return, 64))
	s.pub.connClose = s.pub.conn.NotifyClose(make(chan *amqp.Error, 1))
	s.pub.chClose = s.pub.ch.NotifyClose(make(chan *amqp.Error, 1))
	// Requests and replies go on a channel without confirms: they are at
	// most once and bounded by a deadline, a confirm tells nothing the reply
	// or the deadline does not, and it costs latency. Returns (no route)
	// still come back at once.
	s.pub.fastCh, err = s.pub.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	s.pub.fastReturns = s.pub.fastCh.NotifyReturn(make(chan amqp.Return, 64))
	s.pub.fastClose = s.pub.fastCh.NotifyClose(make(chan *amqp.Error, 1))
	return nil
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
	q := claimQueue(s.b.cfg.Node)
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
		return fmt.Errorf("declare claim queue %s: %w", claimQueue(s.b.cfg.Node), err)
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
			return &MissingQueueError{Queue: q}
		}
		s.b.learnt.admin.Store(true)
	}
	return &MissingQueueError{Queue: q}
}

// declareStage declares a stage's quorum queue and binds it. A queue that
// exists with other arguments is used as it is.
func (s *session) declareStage(decl **amqp.Channel, stage string) error {
	q := stageQueue(stage)
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
	return (*decl).QueueBind(q, commandKey(stage), exchangeMesh, false, nil)
}

// bindOwn binds one of the node's own queues with a key of its own name
// (to.<n>.*): to mesh, or, for a broker user with an older mesh's
// permissions (which refuse that binding), to the node's exchange node.<n>
// the admin bound to mesh (see permissions.go). The exchange the session
// bound to is s.q.ex (quiesce unbinds from it).
func (s *session) bindOwn(ch **amqp.Channel, q, key string) error {
	if s.q.ex == "" {
		err := (*ch).QueueBind(q, key, exchangeMesh, false, nil)
		var ae *amqp.Error
		if !errors.As(err, &ae) || ae.Code != amqp.AccessRefused {
			if err == nil {
				s.q.ex = exchangeMesh
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
		if err := c.ExchangeDeclarePassive(nodeExchange(s.b.cfg.Node), "topic", true, false, false, false, nil); err != nil {
			return fmt.Errorf("the broker refused binding %s to %s, and %w", q, exchangeMesh, err)
		}
		s.q.ex = nodeExchange(s.b.cfg.Node)
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
	if s.q.ex != exchangeMesh {
		return nil
	}
	ex := nodeExchange(s.b.cfg.Node)
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
