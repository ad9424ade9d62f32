package bridge

import (
	"errors"
	"fmt"

	brokerlink "github.com/meshbox/meshbox/bridge/link"

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

// own is the node's own topology on the session's consuming connection
// (link.Own).
func (s *session) own() *brokerlink.Own {
	return &brokerlink.Own{Conn: s.con.conn, Node: s.b.cfg.Node, Perms: &s.b.learnt, Log: s.b.log}
}

func (s *session) findOrDeclare(ch **amqp.Channel, q string, declare func() error) error {
	return s.own().FindOrDeclare(ch, q, declare)
}
