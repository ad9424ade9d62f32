package bridge

import (
	"context"

	"github.com/meshbox/meshbox/bridge/codec"
	"github.com/meshbox/meshbox/bridge/hoptrace"
	brokerlink "github.com/meshbox/meshbox/bridge/link"
	amqp "github.com/rabbitmq/amqp091-go"
)

// This file is the session's use of its publisher (link.Publisher): what
// a message becomes, the metrics and hops of what is written, command
// batches, refusals, and the requests and replies the broker returns.

// publishWindow bounds the unconfirmed publishes of a session.
const publishWindow = brokerlink.PublishWindow

// pubItem is one message for the publisher (link.Item).
type pubItem = brokerlink.Item

// publisherHooks are the bridge's answers to s's publisher.
func (s *session) publisherHooks() brokerlink.PublisherHooks {
	b := s.b
	return brokerlink.PublisherHooks{
		Message: func(out *codec.Outgoing) (amqp.Publishing, error) {
			return out.Publishing(b.cfg.Node, s.user, b.cfg.Keys)
		},
		Pack: func(items []*pubItem) []*pubItem {
			if most := b.batchMax(); most > 1 {
				return s.packCommands(items, most)
			}
			return items
		},
		Written: func(out *codec.Outgoing, fast bool) {
			if fast {
				b.m.msg(out.Kind, "out")
				switch out.Kind {
				case codec.TypeRequest:
					hoptrace.Mark(hoptrace.HopRequestWritten)
				case codec.TypeReply:
					hoptrace.Mark(hoptrace.HopReplyWritten)
				}
				return
			}
			if n := out.Batch; n > 0 {
				b.m.batchSize.Observe(float64(n))
				for range n {
					b.m.msg(codec.TypeCommand, "out")
				}
				return
			}
			b.m.msg(out.Kind, "out")
		},
		Refused: func(err error) {
			if err == ErrNacked {
				b.m.err(errKindNacked)
				return
			}
			b.m.err(errKindNoRoute)
		},
		Fail: s.fail,
	}
}

// enqueue hands it to the publisher (link.Publisher.Enqueue).
func (s *session) enqueue(it *pubItem) error { return s.pub.Enqueue(s.ctx, it) }

// enqueueFast hands a request or a reply to the fast publisher
// (link.Publisher.EnqueueFast).
func (s *session) enqueueFast(it *pubItem) error { return s.pub.EnqueueFast(s.ctx, it) }

// publisher, confirmer and fastPublisher own the publish channels until
// the session ends (link.Publisher).
func (s *session) publisher()     { s.pub.Run(s.ctx) }
func (s *session) confirmer()     { s.pub.Confirm() }
func (s *session) fastPublisher() { s.pub.RunFast(s.ctx) }

// fastReturned drains the request channel's returns: a request or a reply
// the broker could not route (its node is not connected) is sent again
// for a short while (noroute.go); a request that may not reach its node
// fails then. A returned probe tells its prober (nodeprobe.go). Exits when the
// channel closes.
func (s *session) fastReturned() {
	for r := range s.pub.FastReturns {
		if node, ok := brokerlink.ProbedNode(r.RoutingKey); ok && r.Type == "" {
			s.b.probeReturned(node)
			continue
		}
		if r.Type == codec.TypeReply {
			s.b.retryReply(r)
			continue
		}
		if s.b.retryRequest(r.MessageId) {
			continue
		}
		s.b.m.err(errKindNoRoute)
		if p := s.b.takePending(r.MessageId); p != nil {
			s.b.m.err(errKindUnreachable)
			s.b.m.observe("unreachable", p.start)
			s.b.replyError(p.reply, requestFailure(ErrNoRoute, p.name, p.node))
		}
	}
}

// publishWait publishes out and waits for the broker's confirm (or ctx).
func (s *session) publishWait(ctx context.Context, out *codec.Outgoing) error {
	res := make(chan error, 1)
	if err := s.enqueue(&pubItem{Out: out, Done: func(err error) { res <- err }}); err != nil {
		return err
	}
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// watchBlocked follows the broker's connection.blocked notifications for
// the publishing connection: the link is "blocked" (with the broker's
// reason) while a resource alarm holds; consuming and acking go on, on the
// other connection. Exits when the publishing connection closes.
func (s *session) watchBlocked() {
	s.pub.WatchBlocked(func(active bool, reason string) {
		if active {
			s.b.m.Blocked()
			s.b.setState(StateBlocked, "broker resource alarm: "+reason)
			s.b.link.SetBlocked(reason)
		} else {
			s.b.setState(StateConnected, "")
		}
	})
}
