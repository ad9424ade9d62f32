package link

import (
	"context"
	"log/slog"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"
	amqp "github.com/rabbitmq/amqp091-go"
)

// HandoverDrain bounds how long a handover waits for the old session's
// requests open at local hosts to be answered before it closes the old
// connections.
const HandoverDrain = 5 * time.Second

// quiesceEmptyPolls bounds how often Quiesce looks, 5 ms apart, whether an
// unbound queue has delivered what reached it.
const quiesceEmptyPolls = 40

// Quiet is what Quiesce quiets: a session's exclusive request and reply
// queues, consumed without acks on Ch, and what is still answered.
type Quiet struct {
	Ch       *amqp.Channel // the channel the queues are consumed on
	Exchange string        // the exchange the queues are bound to
	Queues   []QuietQueue
	// Open counts the requests taken that are not answered yet (handed to
	// Pub's fast publisher).
	Open func() int
	Pub  *Publisher
	Log  *slog.Logger
}

// QuietQueue is one queue Quiesce quiets: bound with Key, consumed by
// consumer Tag, whose reader closes Done when it exits.
type QuietQueue struct {
	Queue, Key, Tag string
	Done            <-chan struct{}
}

// Quiesce stops taking requests from other nodes and replies to this
// node's requests (both consumers are auto-ack: what the broker sent them
// is gone from the queue, so the readers drain it), and waits (until ctx
// ends) until every request taken is answered and the answers published.
// What is sent after comes back to its sender, who sends it again to the
// next session (the bridge's noroute.go).
func Quiesce(ctx context.Context, s Quiet) {
	// The queues are exclusive to this session's connection and go with
	// it. So they are unbound first: what is sent from now on comes back
	// unroutable and its sender tries again until the next session has
	// bound its own (the bridge's noroute.go); what reached them before is delivered to
	// the readers before the consumers are cancelled.
	for _, q := range s.Queues {
		if err := s.Ch.QueueUnbind(q.Queue, q.Key, s.Exchange, nil); err != nil {
			// The channel is gone: nothing more to answer on it; what is
			// open is answered by the next session (answerOrphans).
			s.Log.Warn("credential handover: cannot unbind the old session's queue; ending it as it is", "queue", q.Queue, "err", err)
			return
		}
	}
	for _, sq := range s.Queues {
		q := sq.Queue
		left := 0
		for range quiesceEmptyPolls {
			st, err := s.Ch.QueueDeclarePassive(q, false, false, true, false, nil)
			if err != nil {
				s.Log.Warn("credential handover: cannot look into the old session's queue; ending it as it is", "queue", q, "err", err)
				return
			}
			if left = st.Messages; left == 0 {
				break
			}
			select {
			case <-time.After(5 * time.Millisecond):
			case <-ctx.Done():
				return
			}
		}
		if left > 0 {
			// Gone with the queue: their callers get their deadlines' 504.
			s.Log.Warn("credential handover: the old session's queue still held messages after about 200ms; they go with it", "queue", q, "messages", left)
		}
	}
	for _, c := range s.Queues {
		if err := s.Ch.Cancel(c.Tag, false); err != nil {
			return // the channel is gone: nothing more to answer on it
		}
		select {
		case <-c.Done:
		case <-ctx.Done():
			return
		}
	}
	dctx, cancel := context.WithTimeout(ctx, HandoverDrain)
	defer cancel()
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		if s.Open() == 0 && s.Pub.FastIdle() {
			// A barrier: the broker answers a method on the channel after it
			// has sent back every message published before it that it could
			// not route, so those are in fastReturns (and sent again,
			// the bridge's noroute.go) before the session stops.
			_ = s.Pub.FastCh.ExchangeDeclarePassive(codec.ExchangeMesh, "topic", true, false, false, false, nil)
			for range quiesceEmptyPolls {
				if len(s.Pub.FastReturns) == 0 {
					break
				}
				time.Sleep(time.Millisecond)
			}
			return
		}
		select {
		case <-dctx.Done():
			return
		case <-t.C:
		}
	}
}
