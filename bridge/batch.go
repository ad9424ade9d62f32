package bridge

import (
	"github.com/meshbox/meshbox/bridge/codec"

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

// batchable reports whether it can travel in a batch: a program's
// command to a stage queue, built here (not a retry copy, not a raw
// message).
func batchable(it *pubItem) bool {
	o := it.Out
	return o.Kind == codec.TypeCommand && o.Raw == nil && o.Exchange == codec.ExchangeMesh && o.Route == "" &&
		o.TTL == 0 && o.Expire == 0 && o.Mandatory && o.Persist && o.CorrID == "" && o.ReplyTo == ""
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
	limit := codec.BatchLimit(s.b.maxPayload())
	out := make([]*pubItem, 0, len(items))
	open := map[string]*batchGroup{}
	var groups []*batchGroup
	for _, it := range items {
		if !batchable(it) {
			out = append(out, it)
			continue
		}
		p, err := it.Out.Publishing(s.b.cfg.Node, s.user, s.b.cfg.Keys)
		if err != nil {
			it.Finish(err) // not sealed: no key to seal with
			continue
		}
		size := codec.EntrySize(&p)
		g := open[it.Out.Key]
		if g != nil && (len(g.items) >= max || g.size+size > limit) {
			g = nil
		}
		if g == nil {
			g = &batchGroup{key: it.Out.Key, at: len(out), size: 16}
			open[it.Out.Key] = g
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
		alone := *it.Out
		alone.Raw = &p
		it.Out = &alone
		return it
	}
	first := g.items[0].Out
	members := g.items
	raw := &amqp.Publishing{
		Headers:      amqp.Table{},
		MessageId:    newID(),
		Type:         codec.TypeCommandBatch,
		Timestamp:    first.At,
		DeliveryMode: amqp.Persistent,
		Body:         codec.EncodeBatch(g.ps, g.size),
	}
	out := &codec.Outgoing{Exchange: codec.ExchangeMesh, Key: g.key, Mandatory: true, Kind: codec.TypeCommandBatch,
		MsgID: raw.MessageId, Persist: true, At: first.At, Raw: raw, Batch: len(members)}
	return &pubItem{Out: out, Done: func(err error) {
		for _, m := range members {
			m.Finish(err)
		}
	}}
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
