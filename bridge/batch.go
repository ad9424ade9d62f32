package bridge

import (
	"context"
	"encoding/binary"
	"strconv"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// This file is the command batch: several commands for one stage in one
// broker message.
//
// The broker's work is per message: routing through the topic exchange,
// writing to the quorum queue's log, the confirm, the delivery and the
// settle. On a small machine that shares its cores with the broker, that
// work bounds the commands a mesh can carry (measured with raw clients on
// 2 cores: 8,650 messages a second one command each, 30,900 commands a
// second four to a message). So when the publisher finds several commands
// for one stage waiting at once, it sends them as one message of type
// "commands" (never waiting for more to come: a command alone goes at
// once, alone). Each command in it is the message it would have been on
// its own, sealed on its own as before (the same associated data: its
// stage, its message id, the validated origin of the batch's publisher),
// so the receiving node opens and handles each exactly as if it had come
// alone, and every command keeps its own attempt, lease, retry policy,
// dead letter and result.
//
// The batch is acked once every command in it is settled. A command whose
// attempt fails and must be tried again is published again alone (with
// its failed attempts counted in Meshbox-Attempts, like a retry copy) and
// counts as settled once the broker confirmed the copy: one failing
// command never brings its batch's finished ones back. Only what no one
// can open (a key this node lacks) sends the whole batch back, as one
// message: its commands share their publisher's key. A batch the broker
// redelivers (its node died, its session ended) comes back whole: every
// command in it is delivered again, marked Meshbox-Redelivered, finished
// or not. That is the price of a batch: at least once, with more of the
// duplicates at a crash. Stages that must not run twice use Config.Dedupe.
//
// Credit is counted in commands: a stage's credit in messages is its
// credit in commands over the commands a message carried, as measured
// (flow.go), so a node behind a slow handler holds no more commands than
// without batches.
//
// An older meshbox does not know the type and would dead-letter a batch.
// So a node batches only while SetCommandBatching says every peer speaks
// it (the appliance asks discovery: protocol version 3).
//
// The body of a batch is
//
//	version | uvarint n | n × entry
//	entry: str message-id | varint timestamp (unix ms) | str content-type
//	       | str content-encoding | uvarint nkeys {str key, uvarint nvals {str val}}
//	       | str body
//
// (str: a uvarint length and the bytes). The entry's headers are the
// readable ones of its own message (Meshbox-Key and the node headers that
// travel with a command); x-* headers are the broker's and are dropped.

const (
	// typeCommandBatch is the AMQP type of a batch message.
	typeCommandBatch = "commands"
	batchVersion     = 1
	// DefaultCommandBatch is the most commands one message carries.
	DefaultCommandBatch = 4
	// MaxCommandBatch bounds Config.CommandBatch.
	MaxCommandBatch = 64
)

// batchLimit is the largest body a batch may have, for a node with
// maxPayload: a command at the limit travels alone.
func batchLimit(maxPayload int) int { return maxPayload + maxHeaderBytes + sealSlack }

// batchable reports whether it can travel in a batch: a program's
// command to a stage queue, built here (not a retry copy, not a raw
// message).
func batchable(it *pubItem) bool {
	o := it.out
	return o.kind == typeCommand && o.raw == nil && o.exchange == exchangeMesh && o.route == "" &&
		o.ttl == 0 && o.expire == 0 && o.mandatory && o.persist && o.corrID == "" && o.replyTo == ""
}

// batchGroup is the commands for one stage gathered from one run.
type batchGroup struct {
	key   string
	at    int // index of the group's slot in the run
	items []*pubItem
	ps    []amqp.Publishing
	size  int
}

// packCommands returns items with the commands of each stage gathered into
// batches of at most max commands (and batchLimit bytes); the first
// command of a batch keeps its place in the run. A command whose message
// cannot be built is settled with the error here, as publish would.
func (s *session) packCommands(items []*pubItem, max int) []*pubItem {
	n := 0
	for _, it := range items {
		if batchable(it) {
			n++
		}
	}
	if n < 2 {
		return items
	}
	limit := batchLimit(s.b.maxPayload())
	out := make([]*pubItem, 0, len(items))
	open := map[string]*batchGroup{}
	var groups []*batchGroup
	for _, it := range items {
		if !batchable(it) {
			out = append(out, it)
			continue
		}
		p, err := it.out.publishing(s.b.cfg.Node, s.user, s.b.cfg.Keys)
		if err != nil {
			it.finish(err) // not sealed: no key to seal with
			continue
		}
		size := entrySize(&p)
		g := open[it.out.key]
		if g != nil && (len(g.items) >= max || g.size+size > limit) {
			g = nil
		}
		if g == nil {
			g = &batchGroup{key: it.out.key, at: len(out), size: 16}
			open[it.out.key] = g
			groups = append(groups, g)
			out = append(out, nil) // the group's slot
		}
		g.items = append(g.items, it)
		g.ps = append(g.ps, p)
		g.size += size
	}
	for _, g := range groups {
		out[g.at] = s.batchItem(g)
	}
	return out
}

// batchItem is the pubItem of a group: the batch message, or the command
// alone when it is alone (built already, published as it is).
func (s *session) batchItem(g *batchGroup) *pubItem {
	if len(g.items) == 1 {
		it := g.items[0]
		p := g.ps[0]
		alone := *it.out
		alone.raw = &p
		it.out = &alone
		return it
	}
	first := g.items[0].out
	members := g.items
	raw := &amqp.Publishing{
		Headers:      amqp.Table{},
		MessageId:    newID(),
		Type:         typeCommandBatch,
		Timestamp:    first.at,
		DeliveryMode: amqp.Persistent,
		Body:         encodeBatch(g.ps, g.size),
	}
	out := &outgoing{exchange: exchangeMesh, key: g.key, mandatory: true, kind: typeCommandBatch,
		msgID: raw.MessageId, persist: true, at: first.at, raw: raw, batch: len(members)}
	return &pubItem{out: out, done: func(err error) {
		for _, m := range members {
			m.finish(err)
		}
	}}
}

// entrySize bounds the encoded size of p as a batch entry.
func entrySize(p *amqp.Publishing) int {
	n := 5*binary.MaxVarintLen64 + len(p.MessageId) + len(p.ContentType) + len(p.ContentEncoding) + len(p.Body)
	for k, v := range p.Headers {
		n += 2*binary.MaxVarintLen64 + len(k)
		switch v := v.(type) {
		case string:
			n += binary.MaxVarintLen64 + len(v)
		case []any:
			for _, x := range v {
				if s, ok := x.(string); ok {
					n += binary.MaxVarintLen64 + len(s)
				}
			}
		}
	}
	return n
}

// encodeBatch encodes the messages ps (built by outgoing.publishing) as a
// batch body; size is a bound of its length.
func encodeBatch(ps []amqp.Publishing, size int) []byte {
	buf := make([]byte, 0, size)
	buf = append(buf, batchVersion)
	buf = binary.AppendUvarint(buf, uint64(len(ps)))
	for i := range ps {
		p := &ps[i]
		buf = appendStr(buf, p.MessageId)
		buf = binary.AppendVarint(buf, p.Timestamp.UnixMilli())
		buf = appendStr(buf, p.ContentType)
		buf = appendStr(buf, p.ContentEncoding)
		n := 0
		for _, v := range p.Headers {
			if _, ok := stringHeader(v); ok {
				n++
			}
		}
		buf = binary.AppendUvarint(buf, uint64(n))
		for k, v := range p.Headers {
			count, ok := stringHeader(v)
			if !ok {
				continue
			}
			buf = appendStr(buf, k)
			buf = binary.AppendUvarint(buf, uint64(count))
			switch v := v.(type) {
			case string:
				buf = appendStr(buf, v)
			case []any:
				for _, x := range v {
					buf = appendStr(buf, x.(string))
				}
			}
		}
		buf = binary.AppendUvarint(buf, uint64(len(p.Body)))
		buf = append(buf, p.Body...)
	}
	return buf
}

// stringHeader reports whether v is a header value as outgoing.publishing
// builds them (a string, or a list of strings), and how many strings it
// holds. Publishing never makes another kind; one would be left out.
func stringHeader(v any) (n int, ok bool) {
	switch v := v.(type) {
	case string:
		return 1, true
	case []any:
		for _, x := range v {
			if _, ok := x.(string); !ok {
				return 0, false
			}
		}
		return len(v), true
	}
	return 0, false
}

// decodeBatch splits the batch delivery d into the deliveries of its
// commands, each as it would have come alone: d's routing key, user_id,
// redelivery and delivery tag, the broker's delivery count, and the
// entry's own id, timestamp, headers and body (which shares d's). It
// accepts at most maxEntries commands in at most limit bytes, and never
// panics, whatever the body holds.
func decodeBatch(d *amqp.Delivery, maxEntries, limit int) ([]amqp.Delivery, error) {
	if len(d.Body) > limit {
		return nil, bad("command batch of %d bytes exceeds the limit of %d", len(d.Body), limit)
	}
	if len(d.Body) == 0 || d.Body[0] != batchVersion {
		return nil, bad("command batch of an unknown format")
	}
	r := sealReader{b: d.Body[1:]}
	n := r.uvarint()
	if r.err == nil && (n < 1 || n > uint64(maxEntries)) {
		return nil, bad("command batch of %d commands, want 1..%d", n, maxEntries)
	}
	count, isCount := d.Headers[headerDeliveryCount]
	out := make([]amqp.Delivery, 0, n)
	for i := uint64(0); i < n && r.err == nil; i++ {
		e := amqp.Delivery{
			Type: typeCommand, RoutingKey: d.RoutingKey, Exchange: d.Exchange, UserId: d.UserId,
			Redelivered: d.Redelivered, DeliveryTag: d.DeliveryTag, DeliveryMode: d.DeliveryMode,
			ConsumerTag: d.ConsumerTag, Acknowledger: d.Acknowledger,
		}
		e.MessageId = r.str()
		e.Timestamp = time.UnixMilli(r.varint())
		e.ContentType = r.str()
		e.ContentEncoding = r.str()
		nkeys := r.uvarint()
		if r.err == nil && nkeys > uint64(len(r.b)) {
			return nil, bad("command batch entry %d: header count %d", i, nkeys)
		}
		e.Headers = make(amqp.Table, nkeys+1)
		for j := uint64(0); j < nkeys && r.err == nil; j++ {
			k := r.str()
			nv := r.uvarint()
			if r.err != nil || nv > uint64(len(r.b)) || nv == 0 {
				if r.err == nil {
					return nil, bad("command batch entry %d: header %q with %d values", i, k, nv)
				}
				break
			}
			if isBrokerHeader(k) {
				k = "" // a publisher's x-* header never counts (see below)
			}
			if nv == 1 {
				v := r.str()
				if k != "" {
					e.Headers[k] = v
				}
				continue
			}
			vs := make([]any, 0, nv)
			for range nv {
				vs = append(vs, r.str())
			}
			if k != "" {
				e.Headers[k] = vs
			}
		}
		size := r.uvarint()
		if r.err == nil && size > uint64(len(r.b)) {
			r.err = errShortSealed
		}
		if r.err != nil {
			break
		}
		e.Body = r.b[:size:size]
		r.b = r.b[size:]
		if isCount {
			// The broker's count of the batch's deliveries is each
			// command's: a publisher cannot make one look like a retry.
			e.Headers[headerDeliveryCount] = count
		}
		out = append(out, e)
	}
	if r.err != nil {
		return nil, bad("command batch: %v", r.err)
	}
	if len(r.b) != 0 {
		return nil, bad("command batch: %d bytes after its last command", len(r.b))
	}
	return out, nil
}

// cmdAck is how one command of a delivery is settled: the delivery's tag,
// and for a command of a batch the batch's count of commands not settled
// yet.
type cmdAck struct {
	tag   uint64
	batch *batchLeft // nil: the delivery is this command alone
}

// batchLeft counts the commands of one batch delivery not settled yet.
type batchLeft struct {
	n       atomic.Int32
	requeue atomic.Bool // a command that no one here can open: the batch goes back whole
}

// ackCmd settles one command of a delivery: a command alone is acked or
// requeued at once; a batch is acked (or, when one of its commands could
// not be opened, requeued) once its last command is settled.
func (s *session) ackCmd(a cmdAck, op ackOp) {
	if a.batch == nil {
		s.ack(a.tag, op)
		return
	}
	if op == opRequeue {
		a.batch.requeue.Store(true)
	}
	if a.batch.n.Add(-1) != 0 {
		return
	}
	if a.batch.requeue.Load() {
		s.ack(a.tag, opRequeue)
		return
	}
	s.ack(a.tag, opAck)
}

// giveBack returns a command to its stage queue for another attempt: a
// command alone is requeued; one of a batch that was opened is published
// again alone (requeueAlone), so that the rest of its batch is not tried
// again with it.
func (s *session) giveBack(c *cmdCall) {
	if c.ack.batch == nil || c.unopened {
		s.ackCmd(c.ack, opRequeue)
		return
	}
	// When the session is ending, work refuses: the broker requeues the
	// batch.
	s.work(func() { s.requeueAlone(c) })
}

// requeueAlone publishes a copy of c, a command of a batch, to its stage
// queue, with the attempts it used so far, and settles c once the broker
// confirmed the copy. When the copy cannot go out, the whole batch goes
// back (a duplicate of its settled commands rather than a lost one). Runs
// on a worker.
func (s *session) requeueAlone(c *cmdCall) {
	b := s.b
	meta := commandMeta(c.env)
	meta[HeaderAttempts] = strconv.Itoa(c.env.attempt)
	if c.env.retry.firstOrigin == "" {
		meta[HeaderFirstOrigin] = c.env.origin
	}
	out := &outgoing{exchange: exchangeMesh, key: commandKey(c.stage), mandatory: true, kind: typeCommand,
		msgID: c.env.msgID, persist: true, header: c.env.header, meta: meta, body: c.env.body, at: time.Now()}
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	err := s.publishWait(ctx, out)
	switch {
	case err == nil:
		b.m.batchSplits.Inc()
		s.ackCmd(c.ack, opAck)
	case s.ctx.Err() != nil:
		// The session ended: the broker requeues the batch.
	default:
		b.log.Warn("cannot publish a command of a batch again alone; its whole batch goes back", "stage", c.stage, "msg_id", c.env.msgID, "err", err)
		s.ackCmd(c.ack, opRequeue)
	}
}

// SetCommandBatching says whether every node of the mesh reads command
// batches: only then does this node send them (Config.CommandBatch). Off
// until called.
func (b *Bridge) SetCommandBatching(on bool) {
	if b.cmds.batching.Swap(on) != on {
		b.log.Info("command batches", "on", on, "most_per_message", b.cfg.CommandBatch)
	}
}

// SetOrderKeys says whether every node of the mesh reads a command's
// Meshbox-Order-Key (discovery protocol 5): until it does, a submission
// with one is refused, since an older node would refuse the command (a
// header of meshbox's own in its seal) and could not keep the order.
func (b *Bridge) SetOrderKeys(on bool) {
	if b.cmds.orderKeys.Swap(on) != on {
		b.log.Info("command order keys", "on", on)
	}
}

// batchMax is the most commands a message may carry now (1: no batches).
func (b *Bridge) batchMax() int {
	if !b.cmds.batching.Load() {
		return 1
	}
	return b.cfg.CommandBatch
}
