package bridge

import (
	"time"

	"github.com/meshbox/meshbox/bridge/flow"

	"github.com/meshbox/meshbox/bridge/codec"

	dto "github.com/prometheus/client_model/go"
	amqp "github.com/rabbitmq/amqp091-go"
)

// SetTestAfterDial makes every connection attempt of b run f once its
// connections are open, before the topology is declared: the seam for a
// broker that stalls during setup.
func SetTestAfterDial(b *Bridge, f func()) { b.testAfterDial = f }

// StageConsumers returns the consumers b's current session has open on
// stage's queue now and the most it had open at once.
func StageConsumers(b *Bridge, stage string) (open, most int) { return b.stageConsumers(stage) }

// StageCreditOf returns the credit of stage in b's current session.
func StageCreditOf(b *Bridge, stage string) flow.StageCredit { return b.stageCredit(stage) }

// AckDelays returns the longest an ack of b's current session waited for
// the acker, and how many runs of acks waited longer than 100 ms (0, 0:
// no session).
func AckDelays(b *Bridge) (most time.Duration, slow int64) {
	s := b.link.sess.Load()
	if s == nil {
		return 0, 0
	}
	return s.con.acker.Delays()
}

// OwnQueues returns the names of the request, reply and system queues of
// b's current session.
func OwnQueues(b *Bridge) (requests, replies, system string) {
	s := b.link.sess.Load()
	if s == nil {
		return "", "", ""
	}
	return s.con.Req, s.con.Rep, s.con.Sys
}

// SetOwnQueuesBound unbinds the request and reply queues of b's current
// session from their exchange (bound false), or binds them again: the seam
// for a node between two sessions. Only the session's own connection may:
// the queues are exclusive to it.
func SetOwnQueuesBound(b *Bridge, bound bool) error {
	s := b.link.sess.Load()
	if s == nil {
		return ErrLinkDown
	}
	node := b.cfg.Node
	for _, q := range []struct{ queue, key string }{{s.con.Req, codec.RequestBindingKey(node)}, {s.con.Rep, codec.ReplyKey(node)}} {
		var err error
		if bound {
			err = s.con.AutoCh.QueueBind(q.queue, q.key, s.con.Ex, false, nil)
		} else {
			err = s.con.AutoCh.QueueUnbind(q.queue, q.key, s.con.Ex, nil)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// CommandBatches returns the batch messages b sent, the commands they
// carried, and the commands of a batch it published again alone.
func CommandBatches(b *Bridge) (batches, commands, splits int) {
	var h, c dto.Metric
	_ = b.m.batchSize.Write(&h)
	_ = b.m.batchSplits.Write(&c)
	return int(h.GetHistogram().GetSampleCount()), int(h.GetHistogram().GetSampleSum()), int(c.GetCounter().GetValue())
}

// DecodeBatchIDs returns the message ids of the commands in a batch body.
func DecodeBatchIDs(body []byte) ([]string, error) {
	d := amqp.Delivery{Type: codec.TypeCommandBatch, RoutingKey: "cmd.x", Body: body}
	ds, err := codec.DecodeBatch(&d, codec.MaxCommandBatch, 1<<24)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(ds))
	for i := range ds {
		ids[i] = ds[i].MessageId
	}
	return ids, nil
}

// SetStageCredit asks b's current session to give stage a credit of msgs
// messages, as the stage's rules would, and wakes its consumer manager.
// It reports false when the session does not consume the stage.
func SetStageCredit(b *Bridge, stage string, msgs int) bool {
	s := b.link.sess.Load()
	if s == nil {
		return false
	}
	s.flows.mu.Lock()
	f := s.flows.stages[stage]
	s.flows.mu.Unlock()
	if f == nil {
		return false
	}
	f.Mu.Lock()
	f.Want = msgs
	f.Mu.Unlock()
	signal(s.flows.wake)
	return true
}

// SetParkAbove lowers the outbox backlog past which answers to submitters
// are held back (defaultParkAbove).
func SetParkAbove(b *Bridge, n int64) { b.sub.parkAbove.Store(n) }

// Overflow returns the submissions that overflowed into the outbox and
// the answers held back by its backlog.
func Overflow(b *Bridge) (overflowed, held int) {
	var o, h dto.Metric
	_ = b.m.overflowed.Write(&o)
	_ = b.m.parked.Write(&h)
	return int(o.GetCounter().GetValue()), int(h.GetCounter().GetValue())
}

// LinkRTT is the round trip b's session measured to the broker (0: no
// session or none measured yet).
func LinkRTT(b *Bridge) time.Duration {
	if s := b.link.sess.Load(); s != nil {
		return time.Duration(s.flows.rtt.Load())
	}
	return 0
}

// OverflowRTT is the round trip from which submissions may overflow.
const OverflowRTT = overflowRTT

// LinkConnectedAt records that b's link connected at at, as the link
// does after telling discovery (link.EventBinder.Connected).
func LinkConnectedAt(b *Bridge, at time.Time) { b.link.EventBinding().Connected(at) }
