package bridge

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/bridge/outbox"
	"github.com/meshbox/meshbox/internal/names"
	"github.com/meshbox/meshbox/internal/wire"
)

// This file makes dead letters something to act on. A command that fails
// for good on a node hosting its stage (its attempts spent, a permanent
// failure, a message that does not decode or open) is dead-lettered into
// its stage's queue dead.<stage> (durable, declared with the stage queue by
// every node hosting it, bound to mesh with dead.<stage>), with the node
// headers Meshbox-Dead-Reason, -Dead-Node, -Dead-Queue, -Dead-At,
// Meshbox-Attempts and Meshbox-First-Failure. What has no stage queue to
// come from (a command no node hosts, from the outbox), and every dead
// letter of a node whose broker permissions predate the stage queues, goes
// to mesh.dead as before.
//
// The operations below reach dead.<stage> with the node's own broker user,
// on a channel of their own (owned by the caller for the call): a list or
// a look takes the messages without acking them and closes the channel,
// which gives them back in their order; a replay acks the one it replayed
// once the broker confirmed the new command; a purge purges the queue.

// DeadLetter describes one dead letter of a stage.
type DeadLetter struct {
	Stage string `json:"stage"`
	ID    string `json:"id"` // the command's message id
	// Reason is why it was dead-lettered, the handler's own words opened
	// when they were sealed (or why they do not open); Node is the node
	// that did.
	Reason string `json:"reason"`
	Node   string `json:"node"`
	// Origin is the node that published the dead-lettered command, by its
	// Meshbox-Origin header.
	Origin string `json:"origin"`
	// Attempts is how many attempts it had (0: not known, a message that
	// was never handed to a handler).
	Attempts int `json:"attempts"`
	// FirstFailure and LastFailure bound its failures: the first failed
	// attempt (Meshbox-First-Failure, else the dead-lettering) and the
	// dead-lettering (Meshbox-Dead-At).
	FirstFailure time.Time `json:"first_failure"`
	LastFailure  time.Time `json:"last_failure"`
	Submitted    time.Time `json:"submitted,omitzero"`
	Size         int       `json:"size"`
	// Headers are the headers readable on the broker (the node's own;
	// the reasons' classes, and their sealed texts as they are there);
	// Content are the command's own headers when this node could open it
	// (sealed ones open only with the mesh's or the scope's key).
	Headers map[string]string `json:"headers"`
	Content map[string]string `json:"content,omitempty"`
	// Opened says whether this node could read (open) the command; a
	// replay needs it.
	Opened bool   `json:"opened"`
	Why    string `json:"why,omitempty"` // why it could not be opened
	// Waiting: the dead letter is in this node's outbox, not on a broker:
	// a standalone node's, kept until it has one.
	Waiting bool `json:"waiting,omitempty"`
}

// Standalone reports whether no broker is configured: dead letters then
// wait in the outbox, where the dead-letter tools read them (DeadLetters
// with stage "" lists every stage's).
func (b *Bridge) Standalone() bool { return b.link.Target() == "" }

// waitingDeadLetters lists the dead letters of stage ("" for every
// stage) in the outbox, oldest first (at most maxBrowse).
func (b *Bridge) waitingDeadLetters(stage string) ([]DeadLetter, error) {
	out := []DeadLetter{}
	var after uint64
	for len(out) < maxBrowse {
		recs, err := b.files.ob.ReadAfter(after, 256, outbox.KindsOf(outbox.Dead))
		if err != nil {
			return nil, fmt.Errorf("read the outbox: %w", err)
		}
		for _, r := range recs {
			after = r.Seq
			if stage != "" && r.Name != stage {
				continue
			}
			_, text := codec.SplitReason(r.Reason)
			origin := r.Header.Get(codec.HeaderOrigin)
			if origin == "" {
				origin = b.cfg.Node
			}
			dl := DeadLetter{Stage: r.Name, ID: r.MsgID, Reason: text, Node: b.cfg.Node, Origin: origin,
				Attempts: int(r.Attempt), FirstFailure: r.Created, LastFailure: r.Created, Submitted: r.Created,
				Size: len(r.Body), Headers: map[string]string{}, Content: map[string]string{}, Opened: true, Waiting: true}
			for k := range r.Header {
				dl.Content[k] = r.Header.Get(k)
			}
			out = append(out, dl)
		}
		if len(recs) < 256 {
			break
		}
	}
	return out, nil
}

// maxBrowse bounds how many dead letters one operation reads.
const maxBrowse = 10000

// deadBook is the dead-letter count of each stage at the last look.
type deadBook struct {
	mu     sync.Mutex
	counts map[string]int
}

// setDeadCount records the dead letters of stage seen on the broker.
func (b *Bridge) setDeadCount(stage string, n int) {
	b.cmds.dead.mu.Lock()
	if b.cmds.dead.counts == nil {
		b.cmds.dead.counts = map[string]int{}
	}
	b.cmds.dead.counts[stage] = n
	b.cmds.dead.mu.Unlock()
	b.m.deadLetters.WithLabelValues(stage).Set(float64(n))
}

// deadAdded counts a dead letter this node put in dead.<stage>.
func (b *Bridge) deadAdded(stage string) {
	b.cmds.dead.mu.Lock()
	if b.cmds.dead.counts == nil {
		b.cmds.dead.counts = map[string]int{}
	}
	b.cmds.dead.counts[stage]++
	n := b.cmds.dead.counts[stage]
	b.cmds.dead.mu.Unlock()
	b.m.deadLetters.WithLabelValues(stage).Set(float64(n))
}

// deadCounts returns the dead letters per stage hosted here.
func (b *Bridge) deadCounts() map[string]int {
	hosted := b.hostedStages()
	b.cmds.dead.mu.Lock()
	defer b.cmds.dead.mu.Unlock()
	out := make(map[string]int, len(hosted))
	for stage := range hosted {
		out[stage] = b.cmds.dead.counts[stage]
	}
	return out
}

// deadOp runs f on a channel of its own on the current session's consuming
// connection; closing it gives back what f took and did not ack.
func (b *Bridge) deadOp(ctx context.Context, stage string, f func(s *session, ch *amqp.Channel) error) error {
	if err := names.Stage(stage); err != nil {
		return fmt.Errorf("%w: %v", codec.ErrBadInput, err)
	}
	s := b.link.sess.Load()
	if st, _ := b.link.Current(); st != StateConnected || s == nil {
		return ErrLinkDown
	}
	ch, err := s.con.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	done := make(chan struct{})
	defer close(done)
	// Closes the channel when ctx ends first, which ends a Get waiting on
	// it; exits when the operation returns.
	go func() {
		select {
		case <-ctx.Done():
			_ = ch.Close()
		case <-done:
		}
	}()
	defer func() { _ = ch.Close() }()
	err = f(s, ch)
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound {
		return fmt.Errorf("%w: stage %s has no dead-letter queue %s (no node hosting it declared one)", ErrNoDeadLetters, stage, codec.DeadQueue(stage))
	}
	if err == nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// browse takes up to maxBrowse dead letters of stage without acking them
// and calls each until it returns false.
func browse(ch *amqp.Channel, stage string, each func(d *amqp.Delivery) (bool, error)) error {
	for range maxBrowse {
		d, ok, err := ch.Get(codec.DeadQueue(stage), false)
		if err != nil {
			return err
		}
		if !ok {
			return nil
		}
		more, err := each(&d)
		if err != nil || !more {
			return err
		}
	}
	return nil
}

// DeadLetters lists the dead letters of stage, oldest first (at most
// 10,000).
func (b *Bridge) DeadLetters(ctx context.Context, stage string) ([]DeadLetter, error) {
	if b.Standalone() {
		if stage != "" {
			if err := names.Stage(stage); err != nil {
				return nil, fmt.Errorf("%w: %v", codec.ErrBadInput, err)
			}
		}
		return b.waitingDeadLetters(stage)
	}
	out := []DeadLetter{}
	err := b.deadOp(ctx, stage, func(s *session, ch *amqp.Channel) error {
		return browse(ch, stage, func(d *amqp.Delivery) (bool, error) {
			out = append(out, b.describeDead(stage, d, false))
			return true, nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("dead letters of %s: %w", stage, err)
	}
	b.setDeadCount(stage, len(out))
	return out, nil
}

// ShowDeadLetter describes the dead letter id of stage, with the command's
// own headers when this node can open it.
func (b *Bridge) ShowDeadLetter(ctx context.Context, stage, id string) (DeadLetter, error) {
	if !wire.ValidID(id) {
		return DeadLetter{}, fmt.Errorf("%w: %q is not a message id", codec.ErrBadInput, id)
	}
	if b.Standalone() {
		list, err := b.waitingDeadLetters(stage)
		if err != nil {
			return DeadLetter{}, err
		}
		for _, dl := range list {
			if dl.ID == id {
				return dl, nil
			}
		}
		return DeadLetter{}, fmt.Errorf("dead letter of %s: %w: %s", stage, ErrNoDeadLetter, id)
	}
	var found *DeadLetter
	err := b.deadOp(ctx, stage, func(s *session, ch *amqp.Channel) error {
		return browse(ch, stage, func(d *amqp.Delivery) (bool, error) {
			if d.MessageId != id {
				return true, nil
			}
			dl := b.describeDead(stage, d, true)
			found = &dl
			return false, nil
		})
	})
	if err == nil && found == nil {
		err = fmt.Errorf("%w: %s", ErrNoDeadLetter, id)
	}
	if err != nil {
		return DeadLetter{}, fmt.Errorf("dead letter of %s: %w", stage, err)
	}
	return *found, nil
}

// ReplayDeadLetters sends the dead letter id of stage (all of them when id
// is "") back to the stage as a new command of this node: same message
// id, headers and body, attempts from 1 again, and a Meshbox-Replayed
// header saying when, by which node, and why it had died. Each is removed
// from the dead letters once the broker confirmed its replay. It returns
// how many were replayed; a dead letter this node cannot open stays.
func (b *Bridge) ReplayDeadLetters(ctx context.Context, stage, id string) (int, error) {
	if id != "" && !wire.ValidID(id) {
		return 0, fmt.Errorf("%w: %q is not a message id", codec.ErrBadInput, id)
	}
	n := 0
	var skipped []string
	err := b.deadOp(ctx, stage, func(s *session, ch *amqp.Channel) error {
		return browse(ch, stage, func(d *amqp.Delivery) (bool, error) {
			if id != "" && d.MessageId != id {
				return true, nil
			}
			envs, ds, why := b.openDeadAll(stage, d)
			if envs == nil {
				if id != "" {
					return false, fmt.Errorf("%s cannot be replayed: %s", d.MessageId, why)
				}
				skipped = append(skipped, d.MessageId+": "+why)
				return true, nil
			}
			for i, env := range envs {
				if err := b.replay(ctx, s, stage, &ds[i], env); err != nil {
					return false, err
				}
			}
			if err := ch.Ack(d.DeliveryTag, false); err != nil {
				return false, fmt.Errorf("remove the replayed dead letter %s: %w", d.MessageId, err)
			}
			n++
			return id == "", nil
		})
	})
	if err == nil && id != "" && n == 0 {
		err = fmt.Errorf("%w: %s", ErrNoDeadLetter, id)
	}
	if err == nil && len(skipped) > 0 {
		err = fmt.Errorf("%d dead letters cannot be replayed by node %s and stay: %v", len(skipped), b.cfg.Node, skipped)
	}
	if n > 0 {
		b.deadRemoved(stage, n)
		b.log.Info("dead letters replayed", "stage", stage, "count", n)
	}
	if err != nil {
		return n, fmt.Errorf("replay dead letters of %s: %w", stage, err)
	}
	return n, nil
}

// replay publishes the opened dead letter env of stage as a new command.
func (b *Bridge) replay(ctx context.Context, s *session, stage string, d *amqp.Delivery, env *codec.Envelope) error {
	meta := map[string]string{}
	if env.ResultTopic != "" {
		meta[codec.HeaderResultTopic] = env.ResultTopic
	}
	first := env.Retry.FirstOrigin
	if first == "" {
		first = env.Origin
	}
	meta[codec.HeaderFirstOrigin] = first
	class, _ := d.Headers[codec.HeaderDeadReason].(string)
	deadAt, _ := d.Headers[codec.HeaderDeadAt].(string)
	replayed := fmt.Sprintf("%s by %s (dead-lettered %s: ", codec.StampTime(time.Now()), b.cfg.Node, deadAt)
	plain, sealed := b.reasonHeaders(codec.HeaderReplayed, codec.TypeCommand, codec.CommandKey(stage), env.MsgID,
		replayed+b.deadReason(stage, d)+")", replayed+class+")")
	meta[codec.HeaderReplayed] = plain
	if sealed != "" {
		meta[codec.HeaderReplayedSealed] = sealed
	}
	out := &codec.Outgoing{Exchange: codec.ExchangeMesh, Key: codec.CommandKey(stage), Mandatory: true, Kind: codec.TypeCommand,
		MsgID: env.MsgID, Persist: true, Header: env.Header, Meta: meta, Body: env.Body, At: time.Now()}
	wait, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := s.publishWait(wait, out); err != nil {
		if errors.Is(err, ErrNoRoute) {
			return fmt.Errorf("replay %s: the broker has no queue %s", env.MsgID, codec.StageQueue(stage))
		}
		return fmt.Errorf("replay %s: %w", env.MsgID, err)
	}
	return nil
}

// PurgeDeadLetters deletes every dead letter of stage and returns how many.
func (b *Bridge) PurgeDeadLetters(ctx context.Context, stage string) (int, error) {
	var n int
	err := b.deadOp(ctx, stage, func(s *session, ch *amqp.Channel) error {
		var err error
		n, err = ch.QueuePurge(codec.DeadQueue(stage), false)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("purge dead letters of %s: %w", stage, err)
	}
	b.setDeadCount(stage, 0)
	b.log.Info("dead letters purged", "stage", stage, "count", n)
	return n, nil
}

// deadRemoved counts n dead letters of stage taken out by this node.
func (b *Bridge) deadRemoved(stage string, n int) {
	b.cmds.dead.mu.Lock()
	c := max(0, b.cmds.dead.counts[stage]-n)
	if b.cmds.dead.counts != nil {
		b.cmds.dead.counts[stage] = c
	}
	b.cmds.dead.mu.Unlock()
	b.m.deadLetters.WithLabelValues(stage).Set(float64(c))
}

// openDead reads a dead letter of stage as the command it was: its origin
// is the Meshbox-Origin it was published with (the dead letter's own
// publisher is the node that dead-lettered it), its routing key the
// stage's. It returns nil and why when it cannot be read or opened.
func (b *Bridge) openDead(stage string, d *amqp.Delivery) (*codec.Envelope, string) {
	if err := codec.CheckDeadLetter(stage, d); err != nil {
		b.replayRefused(codec.AsReplay(err), originOf(d))
		return nil, err.Error()
	}
	orig := *d
	orig.UserId = ""
	orig.Redelivered = false
	orig.RoutingKey = codec.CommandKey(stage)
	orig.Headers = codec.WithoutDeaths(d.Headers) // how it died is the dead letter's, not a replay's mark
	env, err := codec.Decode(codec.TypeCommand, codec.FromAMQP(&orig), b.maxPayload())
	if err != nil {
		return nil, err.Error()
	}
	if env.KeyID != "" {
		if b.cfg.Keys == nil {
			return nil, "it is sealed and this node holds no keys"
		}
		if err := b.unseal(env, &orig); err != nil {
			return nil, err.Error()
		}
	}
	return env, ""
}

// openDeadAll opens dead letter d of stage: one command, or each command
// of a batch (a batch an older node dead-lettered whole, not knowing its
// type), with the deliveries they came in. It returns nil and why when
// any of them does not open: a batch is replayed whole or not at all.
func (b *Bridge) openDeadAll(stage string, d *amqp.Delivery) ([]*codec.Envelope, []amqp.Delivery, string) {
	if d.Type != codec.TypeCommandBatch {
		env, why := b.openDead(stage, d)
		if env == nil {
			return nil, nil, why
		}
		return []*codec.Envelope{env}, []amqp.Delivery{*d}, ""
	}
	entries, err := codec.DecodeBatch(d, codec.MaxCommandBatch, codec.BatchLimit(b.maxPayload()))
	if err != nil {
		return nil, nil, err.Error()
	}
	origin, _ := d.Headers[codec.HeaderOrigin].(string)
	envs := make([]*codec.Envelope, 0, len(entries))
	for i := range entries {
		e := &entries[i]
		// Its dead letter names the batch's publisher; the seal binds it.
		if origin != "" {
			e.Headers[codec.HeaderOrigin] = origin
		}
		for _, k := range []string{codec.HeaderDeadReason, codec.HeaderDeadReasonSealed, codec.HeaderDeadNode, codec.HeaderDeadQueue, codec.HeaderDeadAt} {
			if v, ok := d.Headers[k]; ok {
				e.Headers[k] = v
			}
		}
		env, why := b.openDead(stage, e)
		if env == nil {
			return nil, nil, fmt.Sprintf("command %d (%s) of the batch: %s", i+1, e.MessageId, why)
		}
		envs = append(envs, env)
	}
	return envs, entries, ""
}

// describeDead describes dead letter d of stage; open adds the command's
// own headers when this node can open it.
func (b *Bridge) describeDead(stage string, d *amqp.Delivery, open bool) DeadLetter {
	str := func(k string) string { v, _ := d.Headers[k].(string); return v }
	dl := DeadLetter{Stage: stage, ID: d.MessageId, Reason: b.deadReason(stage, d), Node: str(codec.HeaderDeadNode),
		Origin: originOf(d), Submitted: d.Timestamp, Size: len(d.Body), Headers: map[string]string{}}
	dl.Attempts, _ = strconv.Atoi(str(codec.HeaderAttempts))
	dl.LastFailure, _ = time.Parse(time.RFC3339Nano, str(codec.HeaderDeadAt))
	dl.FirstFailure, _ = time.Parse(time.RFC3339Nano, str(codec.HeaderFirstFail))
	if dl.FirstFailure.IsZero() {
		dl.FirstFailure = dl.LastFailure
	}
	for k, v := range d.Headers {
		switch v := v.(type) {
		case string:
			dl.Headers[k] = v
		case int64, int32, int, bool:
			dl.Headers[k] = fmt.Sprint(v)
		}
	}
	if d.ContentType != "" {
		dl.Headers["content-type"] = d.ContentType
	}
	env, why := b.openDead(stage, d)
	dl.Opened, dl.Why = env != nil, why
	if open && env != nil {
		dl.Content = map[string]string{}
		for _, k := range slices.Sorted(maps.Keys(env.Header)) {
			dl.Content[k] = env.Header.Get(k)
		}
	}
	return dl
}

// deadReason is the reason of dead letter d of stage, its sealed text
// opened (reasons.go).
func (b *Bridge) deadReason(stage string, d *amqp.Delivery) string {
	class, _ := d.Headers[codec.HeaderDeadReason].(string)
	sealed, _ := d.Headers[codec.HeaderDeadReasonSealed].(string)
	return b.openReason(codec.HeaderDeadReason, codec.CommandKey(stage), d.MessageId, class, sealed)
}

// originOf is the origin of a dead letter: Meshbox-Origin, which a node
// that dead-letters a command sets to the node that published it
// (events.go), else the node of its user_id (the broker keeps the
// publisher's when it dead-letters).
func originOf(d *amqp.Delivery) string {
	if v, _ := d.Headers[codec.HeaderOrigin].(string); v != "" {
		return v
	}
	node, _, _ := ParseBrokerUser(d.UserId)
	return node
}
