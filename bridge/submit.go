package bridge

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/bridge/outbox"
	"github.com/meshbox/meshbox/internal/names"
	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/internal/wire"
)

// How a submission was accepted, in the Meshbox-Accepted reply header.
const (
	acceptedBroker = "broker" // confirmed by the broker
	acceptedOutbox = "outbox" // stored in the outbox, sent when the link allows
	acceptedLocal  = "local"  // for this node only (local stage while offline, event without a broker)
)

// submissions orders the commands and events of local programs: under
// mu, each takes the next sequence number and goes to the broker or into
// the outbox, in that order. Dead letters and moved records take a number
// without mu. meshPending counts the mesh records in the outbox not yet
// confirmed by the broker: while it is above 0, new submissions queue
// behind them in the outbox.
type submissions struct {
	mu          sync.Mutex
	seq         atomic.Uint64 // next record seq
	meshPending atomic.Int64
	drainSignal chan struct{} // cap 1: new mesh records
	localSignal chan struct{} // cap 1: new local records
	outboxFull  atomic.Bool   // for the one log line when the outbox fills up
	direct      atomic.Int64  // submissions published straight to the broker, not settled yet

	parkMu    sync.Mutex
	parked    []parkedReply // answers held back while the outbox's backlog is deep (under parkMu)
	parkAbove atomic.Int64  // the backlog past which answers are held (defaultParkAbove; tests lower it)
}

// Overflow into the outbox on a far link. A submission published straight
// to the broker is answered on the broker's confirm, a round trip later:
// at 50 ms, 1,024 submitters cannot pass 1,024 / 50 ms, whatever the link
// carries. So on a link of overflowRTT or more, once overflowDirect
// submissions wait for their confirms, the next ones go into the outbox
// and are answered on its commit (an fsync, not a round trip); the
// drainer sends them with the session's whole window, and new submissions
// queue behind them until the outbox is empty again, in order. Only
// commands of stages the broker routed in this session start an
// overflow; while one lasts, a command for a stage nobody hosts is
// accepted and dead-lettered, as while the link is down (refused with a
// 503 otherwise). The backlog is bounded: while more than parkAbove
// mesh records wait in the outbox, a submitter's answer waits for the
// broker to take some, so submitters slow to the link's pace instead of
// filling the outbox (507). On loopback nothing overflows: the confirm is
// quicker than the commit.
const (
	overflowRTT      = 5 * time.Millisecond
	overflowDirect   = 256
	defaultParkAbove = 2 * publishWindow
)

// parkedReply is an answer to a submitter held back by the backlog.
type parkedReply struct {
	reply, how string
	rec        *outbox.Record
}

func newSubmissions() submissions {
	return submissions{drainSignal: make(chan struct{}, 1), localSignal: make(chan struct{}, 1)}
}

// nextSeq takes the next record sequence number.
func (s *submissions) nextSeq() uint64 { return s.seq.Add(1) - 1 }

// onSubmitCommand accepts cmd.<stage> from a local program. The reply (if
// the program asked for one) comes once the command is durable.
func (b *Bridge) onSubmitCommand(msg *nats.Msg) {
	if !b.localOK(msg) {
		return
	}
	stage := msg.Subject[len(codec.SubjCmdPrefix):]
	rec, err := b.submission(outbox.Command, stage, msg)
	if err != nil {
		if !isForbidden(err) {
			b.m.err(errKindBadInput)
		}
		b.replyError(msg.Reply, err)
		return
	}
	b.accept(rec, msg.Reply)
}

// onSubmitEvent forwards evt.<topic> from a local program to the mesh.
// Local subscribers already have it from the NATS server. The mesh events
// the bridge republishes never come back here (its connection is NoEcho),
// so every event seen here is a program's: a Meshbox-Origin it carries is
// not the node's word and changes nothing (callerHeaders drops it).
func (b *Bridge) onSubmitEvent(msg *nats.Msg) {
	if msg.Reply == "" && b.link.CurrentURL() == "" {
		// No broker, nobody waiting for an answer: the local subscribers
		// have it, and there is nothing to do.
		return
	}
	if !b.localOK(msg) {
		return
	}
	topic := msg.Subject[len(codec.SubjEvtPrefix):]
	rec, err := b.submission(outbox.Event, topic, msg)
	if err != nil {
		b.m.err(errKindBadInput)
		b.replyError(msg.Reply, err)
		return
	}
	if msg.Reply != "" || !b.link.EventBinding().KeepLocal(topic, b.Connected()) { // kept: no other node listens
		b.accept(rec, msg.Reply)
	}
}

// submission validates a local program's command or event.
func (b *Bridge) submission(kind outbox.Kind, name string, msg *nats.Msg) (*outbox.Record, error) {
	what := "stage"
	if kind == outbox.Event {
		what = "topic"
	}
	if !codec.ValidName(name) {
		return nil, fmt.Errorf("%w: %q is not a valid %s name", codec.ErrBadInput, name, what)
	}
	if limit := b.maxPayload(); len(msg.Data) > limit {
		return nil, fmt.Errorf("%w: payload of %d bytes exceeds the limit of %d", codec.ErrBadInput, len(msg.Data), limit)
	}
	hdr, err := codec.CallerHeaders(msg.Header)
	if err != nil {
		return nil, err
	}
	bk, verb := seal.BindStage, "submit to"
	if kind == outbox.Event {
		bk, verb = seal.BindTopic, "publish to"
	}
	if err := b.notInScope(bk, name, verb); err != nil {
		return nil, err
	}
	if b.cfg.Keys != nil && b.link.CurrentURL() != "" {
		if _, err := b.cfg.Keys.SealerFor(b.cfg.Keys.ScopeOf(bk, name)); err != nil {
			return nil, b.lacksKey(kind.String())
		}
	}
	if topic := msg.Header.Get(codec.HeaderResultTopic); topic != "" && kind == outbox.Command { // on an event: dropped like any Meshbox-* header
		if err := names.Topic(topic); err != nil {
			return nil, fmt.Errorf("%w: header %s: %v", codec.ErrBadInput, codec.HeaderResultTopic, err)
		}
		if err := b.resultTopicOK(name, topic); err != nil {
			return nil, err
		}
		if err := b.notInScope(seal.BindTopic, topic, "name as a result topic"); err != nil {
			return nil, err
		}
		if hdr == nil {
			hdr = nats.Header{}
		}
		hdr[codec.HeaderResultTopic] = []string{topic} // a node header: moved out of the seal by outgoingFor
	}
	if key := msg.Header.Get(codec.HeaderOrderKey); key != "" && kind == outbox.Command { // on an event: dropped like any Meshbox-* header
		if !wire.ValidID(key) {
			return nil, fmt.Errorf("%w: header %s: %q is not a valid order key (printable, at most %d bytes, no spaces)", codec.ErrBadInput, codec.HeaderOrderKey, key, wire.MaxIDLen)
		}
		if !b.cmds.orderKeys.Load() && b.link.CurrentURL() != "" { // standalone: run here, in order
			return nil, fmt.Errorf("%w: header %s: a node of the mesh runs an older meshbox that does not keep commands in order by key; upgrade every node first", codec.ErrBadInput, codec.HeaderOrderKey)
		}
		if hdr == nil {
			hdr = nats.Header{}
		}
		hdr[codec.HeaderOrderKey] = []string{key} // sealed with the command: the broker never reads it
	}
	id := msg.Header.Get(codec.HeaderMsgID)
	switch {
	case id == "":
		id = newID()
	case !wire.ValidID(id):
		return nil, fmt.Errorf("%w: header %s: %q is not a valid message id (printable, at most %d bytes)", codec.ErrBadInput, codec.HeaderMsgID, id, wire.MaxIDLen)
	}
	return &outbox.Record{Kind: kind, Name: name, MsgID: id, Header: hdr,
		Body: append([]byte(nil), msg.Data...), Created: time.Now()}, nil
}

// accept routes a submission. Submissions are ordered: each takes the next
// sequence number under sub.mu and, in that order, goes straight to the
// broker (link up and nothing older waiting in the outbox) or into the
// outbox.
func (b *Bridge) accept(rec *outbox.Record, reply string) {
	b.sub.mu.Lock()
	defer b.sub.mu.Unlock()
	rec.Seq = b.sub.nextSeq()
	if rec.Kind == outbox.Command {
		b.noteSubmitted(rec.Name)
	}
	state, _ := b.link.Current()
	if sess := b.link.sess.Load(); state == StateConnected && sess != nil && b.sub.meshPending.Load() == 0 && !sess.overflows(rec) {
		b.sub.direct.Add(1)
		it := &pubItem{Out: b.outgoingFor(rec, false), Done: func(err error) {
			b.sub.direct.Add(-1)
			if err == nil && rec.Kind == outbox.Command {
				sess.sub.routed.Store(rec.Name, true)
			}
			b.directDone(rec, reply, err)
		}}
		if sess.enqueue(it) == nil {
			return
		}
		b.sub.direct.Add(-1)
	}
	b.store(rec, reply, state)
}

// overflows reports whether rec goes into the outbox though the link is up
// (see overflowRTT).
func (s *session) overflows(rec *outbox.Record) bool {
	if time.Duration(s.flows.rtt.Load()) < overflowRTT || s.b.sub.direct.Load() < overflowDirect {
		return false
	}
	over := rec.Kind == outbox.Event
	if rec.Kind == outbox.Command {
		_, over = s.sub.routed.Load(rec.Name)
	}
	if over {
		s.b.m.overflowed.Inc()
	}
	return over
}

// answerStored answers a submitter whose message the outbox committed, or
// holds the answer back while the backlog is deep and the link is up.
func (b *Bridge) answerStored(reply string, rec *outbox.Record, how string) {
	if reply != "" && how == acceptedOutbox {
		b.sub.parkMu.Lock()
		if state, _ := b.link.Current(); state == StateConnected && b.sub.meshPending.Load() > b.sub.parkAbove.Load() {
			b.sub.parked = append(b.sub.parked, parkedReply{reply: reply, how: how, rec: rec})
			b.sub.parkMu.Unlock()
			b.m.parked.Inc()
			return
		}
		b.sub.parkMu.Unlock()
	}
	b.replyAccepted(reply, rec, how)
}

// releaseParked sends the held-back answers the backlog allows now (all of
// them when the link is not up: the outbox holds the messages either
// way). Call it after meshPending falls and when the link goes down.
func (b *Bridge) releaseParked() {
	b.sub.parkMu.Lock()
	if len(b.sub.parked) == 0 {
		b.sub.parkMu.Unlock()
		return
	}
	n := len(b.sub.parked)
	if state, _ := b.link.Current(); state == StateConnected {
		n = min(n, int(max(0, b.sub.parkAbove.Load()-b.sub.meshPending.Load())))
	}
	out := slices.Clone(b.sub.parked[:n])
	b.sub.parked = slices.Delete(b.sub.parked, 0, n)
	b.sub.parkMu.Unlock()
	for _, p := range out {
		b.replyAccepted(p.reply, p.rec, p.how)
	}
}

// store puts a submission into the outbox and answers once it is committed.
func (b *Bridge) store(rec *outbox.Record, reply, state string) {
	how := acceptedOutbox
	switch rec.Kind {
	case outbox.Command:
		if state != StateConnected && b.hostsStage(rec.Name) {
			rec.Kind, how = outbox.Local, acceptedLocal
		} else if b.link.CurrentURL() == "" {
			b.m.err(errKindUnreachable)
			b.replyError(reply, &ServiceError{Code: CodeUnavailable,
				Text: fmt.Sprintf("no broker configured and no handler for stage %s on node %s", rec.Name, b.cfg.Node)})
			return
		}
	case outbox.Event:
		if b.link.CurrentURL() == "" {
			b.replyAccepted(reply, rec, acceptedLocal) // standalone: the local subscribers have it
			return
		}
	}
	b.put(rec, reply, how)
}

// put stores rec in the outbox and answers reply after the commit.
func (b *Bridge) put(rec *outbox.Record, reply, how string) {
	data := rec.Encode()
	if err := b.files.ob.Reserve(int64(len(data))); err != nil {
		b.m.err(errKindOutboxFull)
		if reply == "" {
			b.m.err(errKindDropped)
		}
		if b.sub.outboxFull.CompareAndSwap(false, true) {
			b.log.Error("outbox full: refusing commands and events until the broker takes some", "max_bytes", b.cfg.OutboxMaxBytes)
		}
		b.replyError(reply, err)
		return
	}
	if b.sub.outboxFull.CompareAndSwap(true, false) {
		b.log.Info("outbox accepts messages again")
	}
	mesh := rec.Kind != outbox.Local
	if mesh {
		b.sub.meshPending.Add(1)
	}
	b.files.ob.Put(rec, data, func(err error) {
		if err != nil {
			if mesh {
				b.sub.meshPending.Add(-1)
			}
			b.m.err(errKindOutboxWrite)
			b.replyError(reply, &ServiceError{Code: CodeInternal, Text: fmt.Sprintf("%s not accepted: %v", rec.Kind, err)})
			return
		}
		b.answerStored(reply, rec, how)
	})
}

// replyAccepted tells a submitter its message is durable.
func (b *Bridge) replyAccepted(reply string, rec *outbox.Record, how string) {
	if reply == "" {
		return
	}
	v := [...]string{how, rec.MsgID} // one allocation for both values (canonical keys)
	b.reply(&nats.Msg{Subject: reply, Header: nats.Header{codec.HeaderAccepted: v[0:1:1], codec.HeaderMsgID: v[1:2:2]}})
}

// directDone settles a submission published straight to the broker. It
// runs on the confirmer goroutine and must not take sub.mu.
func (b *Bridge) directDone(rec *outbox.Record, reply string, err error) {
	switch {
	case err == nil:
		b.replyAccepted(reply, rec, acceptedBroker)
	case errors.Is(err, ErrNoRoute) && reply != "":
		b.replyError(reply, &ServiceError{Code: CodeUnavailable,
			Text: fmt.Sprintf("no node hosts stage %s: the broker has no queue %s", rec.Name, codec.StageQueue(rec.Name))})
	case errors.Is(err, ErrNoRoute):
		b.deadRecord(rec, codec.PlainReason(fmt.Sprintf("no route: the broker had no queue %s", codec.StageQueue(rec.Name))), nil)
	case errors.Is(err, seal.ErrNoKey):
		// The key went away after the submission was checked: the outbox
		// keeps it until the node holds one again.
		b.put(rec, reply, acceptedOutbox)
	case errors.Is(err, ErrNacked) && reply != "":
		b.replyError(reply, &ServiceError{Code: CodeUnavailable, Text: fmt.Sprintf("the broker refused the %s; it was not accepted", rec.Kind)})
	default:
		// Link lost (or refused with nobody to tell): it may have reached the
		// broker, so it goes out again marked as a possible duplicate.
		rec.Republished = true
		b.put(rec, reply, acceptedOutbox)
	}
}

// deadRecord stores a dead letter for rec in the outbox (it goes to
// mesh.dlx when the link allows) and calls done (may be nil) with the
// outcome of its commit: rec may be deleted only after a nil one. Safe on
// any goroutine.
func (b *Bridge) deadRecord(rec *outbox.Record, reason error, done func(error)) {
	b.m.err(errKindDeadLetter)
	b.logDead(rec.Name, rec.MsgID, reason.Error())
	dead := *rec
	dead.Seq = b.sub.nextSeq()
	dead.Kind = outbox.Dead
	dead.Reason = codec.JoinReason(reason)
	data := dead.Encode()
	b.files.ob.ReserveAlways(int64(len(data))) // dead letters are never refused: they were accepted once
	b.sub.meshPending.Add(1)
	b.files.ob.Put(&dead, data, func(err error) {
		if err != nil {
			b.sub.meshPending.Add(-1)
			b.m.err(errKindOutboxWrite)
		}
		if done != nil {
			done(err)
		}
	})
}

// outgoingFor builds the broker message for an outbox record.
func (b *Bridge) outgoingFor(rec *outbox.Record, redelivered bool) *codec.Outgoing {
	out := &codec.Outgoing{
		Exchange: codec.ExchangeMesh, Persist: true, MsgID: rec.MsgID, At: rec.Created,
		Header: rec.Header, Body: rec.Body,
	}
	switch rec.Kind {
	case outbox.Command, outbox.Local:
		// Through mesh to the stage's queue (bound with its key); never the
		// default exchange, whose write right cannot be scoped per queue.
		out.Key, out.Kind, out.Mandatory = codec.CommandKey(rec.Name), codec.TypeCommand, true
	case outbox.Event:
		out.Key, out.Kind = codec.EventKey(rec.Name), codec.TypeEvent
	case outbox.Dead:
		out.Exchange, out.Key, out.Kind = codec.ExchangeDLX, codec.CommandKey(rec.Name), codec.TypeCommand
		out.Meta = map[string]string{}
		class, text := codec.SplitReason(rec.Reason)
		plain, sealed := b.reasonHeaders(codec.HeaderDeadReason, codec.TypeCommand, codec.CommandKey(rec.Name), rec.MsgID, text, class)
		out.Meta[codec.HeaderDeadReason] = plain
		if sealed != "" {
			out.Meta[codec.HeaderDeadReasonSealed] = sealed
		}
		out.Meta[codec.HeaderDeadNode] = b.cfg.Node
		out.Meta[codec.HeaderDeadQueue] = codec.StageQueue(rec.Name)
	}
	if out.Kind == codec.TypeCommand {
		out.Header, out.Meta = codec.SplitNodeHeaders(out.Header, out.Meta)
	}
	if redelivered || rec.Republished {
		if out.Meta == nil {
			out.Meta = map[string]string{}
		}
		out.Meta[codec.HeaderRedelivered] = "true"
	}
	return out
}

// meshKinds are the outbox records the drainer sends to the broker.
var meshKinds = outbox.KindsOf(outbox.Command, outbox.Event, outbox.Dead)

// outboxOptions are the options Start opens the outbox with.
func (b *Bridge) outboxOptions() outbox.Options {
	return outbox.Options{MaxBytes: b.cfg.OutboxMaxBytes, Logger: b.log, OnCommit: b.onOutboxCommit}
}

// onOutboxCommit wakes the drainer or the local runner for new records.
func (b *Bridge) onOutboxCommit(kinds outbox.Kinds) {
	if kinds&meshKinds != 0 {
		signal(b.sub.drainSignal)
	}
	if kinds.Has(outbox.Local) {
		signal(b.sub.localSignal)
	}
}

// drainer sends the outbox's mesh records to the broker in order, deleting
// each once confirmed. It starts from the oldest record on every session.
// Exits when the session ends.
func (s *session) drainer() {
	b := s.b
	const chunk = 256
	if err := b.files.ob.Sync(s.ctx); err != nil { // rescues of the last session are committed
		return
	}
	var cursor uint64
	for {
		select {
		case <-s.sub.rescan:
			s.sub.drainWait.Wait()
			if b.files.ob.Sync(s.ctx) != nil {
				return
			}
			cursor = 0
			select {
			case <-time.After(b.link.Backoff(3)):
			case <-s.ctx.Done():
				return
			}
		default:
		}
		recs, err := b.files.ob.ReadAfter(cursor, chunk, meshKinds)
		if err != nil {
			s.fail(fmt.Errorf("read outbox: %w", err))
			return
		}
		if len(recs) == 0 {
			select {
			case <-s.ctx.Done():
				return
			case <-b.sub.drainSignal:
			case <-s.sub.rescan:
				signal(s.sub.rescan)
			}
			continue
		}
		// Persist, before publishing, that these may reach the broker: after a
		// crash they go out again marked as possible duplicates.
		published := b.files.ob.Published()
		if last := recs[len(recs)-1].Seq; last > published {
			if err := b.files.ob.Wait(s.ctx, func(done func(error)) { b.files.ob.MarkPublished(last, done) }); err != nil {
				s.fail(err)
				return
			}
		}
		for _, r := range recs {
			s.sub.drainWait.Add(1)
			it := &pubItem{Out: b.outgoingFor(r, r.Seq <= published), Done: func(err error) {
				defer s.sub.drainWait.Done()
				s.drained(r, err)
			}}
			if err := s.enqueue(it); err != nil {
				s.sub.drainWait.Done()
				return
			}
			cursor = r.Seq
		}
	}
}

// drained settles a record sent by the drainer (on the confirmer).
func (s *session) drained(r *outbox.Record, err error) {
	b := s.b
	switch {
	case err == nil:
		b.files.ob.Delete(r.Seq, r.Size, nil)
		b.sub.meshPending.Add(-1)
		b.releaseParked()
	case errors.Is(err, ErrNoRoute):
		// The record is deleted only once its dead letter is committed; if
		// that write fails it is kept and sent again after a pause. The
		// drainer's rescan waits until the delete is queued.
		s.sub.drainWait.Add(1)
		b.deadRecord(r, codec.PlainReason(fmt.Sprintf("no route: the broker had no queue %s", codec.StageQueue(r.Name))), func(err error) {
			defer s.sub.drainWait.Done()
			if err != nil {
				signal(s.sub.rescan)
				return
			}
			b.files.ob.Delete(r.Seq, r.Size, nil)
			b.sub.meshPending.Add(-1)
			b.releaseParked()
		})
	case errors.Is(err, ErrNacked), errors.Is(err, seal.ErrNoKey):
		signal(s.sub.rescan) // kept; sent again after a pause
	default:
		// link lost: kept, sent again on the next session
	}
}
