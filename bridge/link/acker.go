package link

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/meshbox/meshbox/bridge/flow"

	amqp "github.com/rabbitmq/amqp091-go"
)

// AckOp is what Ack asks for a delivery.
type AckOp int

// What Ack asks for a delivery.
const (
	OpAck AckOp = iota
	OpRequeue
)

// ackBatch acks waiting are sent at once; fewer wait up to flow.AckLinger
// for more.
const ackBatch = 64

type ackReq struct {
	tag uint64
	op  AckOp
	at  time.Time // when it was asked for
}

// Acker settles the deliveries of a session's acked consume channel: acks
// and requeues, gathered into runs, written through the consuming
// connection's corked socket. It never waits on the broker for anything
// else. Run is its one goroutine; Ack may be called from any.
type Acker struct {
	cork *CorkConn // the consuming connection's socket: a run of acks goes out with one write
	q    chan ackReq
	// unacked counts settled deliveries whose ack is not yet applied on
	// the consume channel: a graceful close waits for it (SettleBeforeStop).
	unacked atomic.Int64
	book    ackBook   // settled deliveries of the channel (Run only)
	delays  ackDelays // how long acks waited for the acker
}

// NewAcker returns the acker of a consuming connection whose socket is
// cork.
func NewAcker(cork *CorkConn) *Acker {
	return &Acker{cork: cork, q: make(chan ackReq, 256)}
}

// Run settles the deliveries of ch as Ack asks: acks and requeues,
// gathered into runs. It exits when ctx ends or an ack fails (then it
// calls fail).
func (a *Acker) Run(ctx context.Context, ch *amqp.Channel, fail func(error)) {
	linger := time.NewTimer(flow.AckLinger)
	linger.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-a.q:
			if len(a.q) < ackBatch {
				linger.Reset(flow.AckLinger)
				select {
				case <-linger.C:
				case <-ctx.Done():
					linger.Stop()
				}
			}
			n, err := a.settle(ch, r)
			a.unacked.Add(-int64(n))
			if err != nil {
				fail(fmt.Errorf("ack: %w", err))
				return
			}
		}
	}
}

// ackBook follows the settled deliveries of the consume channel. Only
// acked consumers use that channel, so its delivery tags are dense (1, 2,
// 3, ...), and a multiple ack up to a tag is safe when every tag below it
// is settled. Only the acker touches it.
type ackBook struct {
	next    uint64          // lowest tag not known to be settled
	settled map[uint64]bool // settled tags above next
}

// settle applies first and every other ack request already queued,
// and says how many requests it took.
func (a *Acker) settle(ch *amqp.Channel, first ackReq) (int, error) {
	reqs := []ackReq{first}
	for more := true; more && len(reqs) < 4096; {
		select {
		case r := <-a.q:
			reqs = append(reqs, r)
		default:
			more = false
		}
	}
	a.delays.note(time.Since(reqs[0].at))
	requeue, upTo, single := a.book.plan(reqs)
	a.cork.Cork() // the run goes out with one write
	defer a.cork.Uncork()
	for _, tag := range requeue {
		if err := ch.Nack(tag, false, true); err != nil {
			return len(reqs), err
		}
	}
	if upTo != 0 {
		if err := ch.Ack(upTo, true); err != nil {
			return len(reqs), err
		}
	}
	for _, tag := range single {
		if err := ch.Ack(tag, false); err != nil {
			return len(reqs), err
		}
	}
	return len(reqs), nil
}

// plan turns ack requests into broker calls: requeues one by one; acks
// that complete the run of settled tags from the oldest as one multiple ack
// up to upTo (0: none); the other acks one by one (never held back behind a
// slow delivery). It records them all as settled.
func (a *ackBook) plan(reqs []ackReq) (requeue []uint64, upTo uint64, single []uint64) {
	if a.settled == nil {
		a.next, a.settled = 1, map[uint64]bool{}
	}
	pending := map[uint64]bool{}
	for _, r := range reqs {
		switch {
		case r.tag < a.next || a.settled[r.tag]:
			// settled already: never twice (a second ack would close the channel)
		case r.op == OpRequeue:
			requeue = append(requeue, r.tag)
			a.settled[r.tag] = true
		default:
			pending[r.tag] = true
		}
	}
	for a.settled[a.next] || pending[a.next] {
		if pending[a.next] {
			upTo = a.next
			delete(pending, a.next)
		}
		delete(a.settled, a.next)
		a.next++
	}
	for tag := range pending {
		single = append(single, tag)
		a.settled[tag] = true
	}
	slices.Sort(single)
	return requeue, upTo, single
}

// Ack asks the acker to ack or requeue a delivery. It gives up when ctx
// (the session's) ends: the broker requeues the delivery itself.
func (a *Acker) Ack(ctx context.Context, tag uint64, op AckOp) {
	a.unacked.Add(1)
	select {
	case a.q <- ackReq{tag: tag, op: op, at: time.Now()}:
	case <-ctx.Done():
		a.unacked.Add(-1)
	}
}

// Hold counts a delivery settled whose ack is not asked for yet, until
// the returned func is called: SettleBeforeStop waits for it too.
func (a *Acker) Hold() (release func()) {
	a.unacked.Add(1)
	return func() { a.unacked.Add(-1) }
}

// SettleBeforeStop waits, at most limit, until every delivery settled so
// far is acked on the broker: a node closing gracefully does not leave
// finished commands to be redelivered. Run still runs meanwhile.
func (a *Acker) SettleBeforeStop(limit time.Duration) {
	for end := time.Now().Add(limit); a.unacked.Load() > 0 && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
	}
}

// Delays returns the longest an ack waited for the acker, and how many
// runs of acks waited longer than 100 ms.
func (a *Acker) Delays() (most time.Duration, slow int64) {
	return time.Duration(a.delays.most.Load()), a.delays.over[1].Load()
}

// ackDelays follows how long acks wait between a handler's answer and
// their write to the broker: the acker's own linger, and anything that
// would hold it up.
type ackDelays struct {
	most atomic.Int64 // the longest wait of the session, in nanoseconds
	// over counts the runs of acks whose oldest waited longer than each
	// of ackWaits.
	over [len(ackWaits)]atomic.Int64
}

// ackWaits are the waits for the acker counted: half a home link's round
// trip (fifty times the linger), and a whole long one.
var ackWaits = [...]time.Duration{25 * time.Millisecond, 100 * time.Millisecond}

// note records a wait of d.
func (a *ackDelays) note(d time.Duration) {
	for i, w := range ackWaits {
		if d > w {
			a.over[i].Add(1)
		}
	}
	for {
		cur := a.most.Load()
		if int64(d) <= cur || a.most.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}
