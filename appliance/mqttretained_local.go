package appliance

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/meshbox/meshbox/appliance/localnats"
	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// hear takes a message heard on $MQTT.rmsgs.>: the server storing a
// retained publish of a device, the mirror's own puts, or anything else a
// local client made the server send there.
//
// Only the server's own store requests are recorded: their reply is
// $MQTT.JSA.<server>.MS.<id> and their origin the server's node name. A
// program may not publish on $MQTT.rmsgs.>, but one with the blob store's
// rights can make the server send there for it: a direct get of one of
// its objects answered to $MQTT.rmsgs.<subject> (no reply), or a push
// consumer delivering there (reply $JS.ACK.…), with headers it chose.
// Those are refused as forged (and the store's copy, which they replaced,
// is taken as seen: the settler puts the mesh's winner in its place).
func (mr *retainedMirror) hear(msg *nats.Msg) {
	r, err := localnats.DecodeRetained(msg.Subject, msg.Header, msg.Data)
	if err != nil {
		mr.refuse("malformed", "", err)
		return
	}
	if r.Origin == localnats.MeshOrigin {
		return // the mesh's own copy, put by settle: not a change (no loop)
	}
	if !strings.HasPrefix(msg.Reply, mr.storeReply) || r.Origin != mr.server {
		mr.distrust(r, "forged", fmt.Errorf("%s: a message on the MQTT store's subjects that is no store request of this node's server (reply %q, origin %q): it is not carried", r.Subject, msg.Reply, r.Origin))
		return
	}
	mr.record(r, time.Time{})
}

// distrust refuses a message of the store the mirror cannot trust as a
// device's publish, under cause: it is taken as seen, so that the settler
// puts the mesh's winner of its topic in its place.
func (mr *retainedMirror) distrust(r localnats.Retained, cause string, err error) {
	mr.refuse(cause, r.Source, err)
	if retainedSubjectOK(r.Subject) != nil {
		return
	}
	mr.mu.Lock()
	mr.recorded[r.Subject] = retainedHash(r)
	mr.distrusted[r.Subject] = distrustedMsg{hash: retainedHash(r), at: time.Now()}
	mr.mu.Unlock()
	mr.markDirty(retainedRow(r.Subject))
}

// record writes a local retained publish to the table. heard is when the
// store took it, for a message read from the store at start or tried
// again (zero: heard now): that one is written only when it is newer than
// the table's winner, and not when the table holds it already. A failed
// write is kept (pending) and tried again by the settler.
func (mr *retainedMirror) record(r localnats.Retained, heard time.Time) {
	if !strings.HasPrefix(r.Subject, wire.EvtPrefix) {
		mr.refuse("not_event", r.Source, fmt.Errorf("%s is no event's subject (evt/...): its retained message stays on this node", r.Subject))
		return
	}
	mr.mu.Lock()
	defer mr.mu.Unlock()
	_, was := mr.pending[r.Subject]
	if mr.recordLocked(r, heard) {
		delete(mr.pending, r.Subject)
		delete(mr.retry, r.Subject)
	} else {
		if heard.IsZero() {
			heard = time.Now()
		}
		mr.pending[r.Subject] = retainedHash(r)
		mr.retry[r.Subject] = heardRetained{r: r, heard: heard}
		select { // the settler tries it again after retainedRetry
		case mr.wake <- struct{}{}:
		default:
		}
	}
	if _, is := mr.pending[r.Subject]; is || was {
		mr.savePending()
	}
}

// recordLocked is record's work; false when the table's write failed.
// mr.mu is held.
func (mr *retainedMirror) recordLocked(r localnats.Retained, heard time.Time) bool {
	row := retainedRow(r.Subject)
	// A message refused is taken as seen: the mesh's winner of its topic
	// may take its place in the store (settle).
	if err := mr.rights.RetainAllowed(r.Source, r.Subject); err != nil {
		mr.recorded[r.Subject] = retainedHash(r)
		mr.refuse("not_allowed", r.Source, err)
		return true
	}
	if err := retainedSubjectOK(r.Subject); err != nil {
		mr.recorded[r.Subject] = retainedHash(r)
		mr.refuse("not_allowed", r.Source, err)
		return true
	}
	if len(r.Payload) > MaxRetainedPayload {
		mr.recorded[r.Subject] = retainedHash(r)
		mr.refuse("too_large", r.Source, fmt.Errorf("%s: a retained payload of %d bytes, the mesh carries at most %d: it stays on this node", r.Subject, len(r.Payload), MaxRetainedPayload))
		return true
	}
	if !heard.IsZero() {
		cells, err := mr.eng.Store().Row(wire.TableMQTTRetained, row)
		if err != nil {
			return false
		}
		if held, sc, err := retainedOf(row, cells); len(cells) > 0 && err == nil && (sameRetained(held, r) || !heard.After(sc.Stamp.Wall())) {
			// The table holds it, or something newer that settle
			// puts in its place.
			mr.recorded[r.Subject] = retainedHash(r)
			if !sameRetained(held, r) {
				mr.markDirty(row)
			}
			return true
		}
	}
	set, del := retainedWrite(r)
	if _, err := mr.eng.Put(wire.TableMQTTRetained, row, set, del); err != nil {
		mr.m.errors.WithLabelValues("table").Inc()
		mr.logOnce("table\x00"+errKind(err), "a retained publish was not written to the mesh's retained state yet: it is tried again (logged once per kind of failure)", "subject", r.Subject, "err", err)
		return false
	}
	mr.recorded[r.Subject] = retainedHash(r)
	mr.m.recorded.Inc()
	return true
}

// retryRecords tries the failed writes of the table again.
func (mr *retainedMirror) retryRecords() {
	mr.mu.Lock()
	retry := make([]heardRetained, 0, len(mr.retry))
	for _, h := range mr.retry {
		retry = append(retry, h)
	}
	mr.mu.Unlock()
	for _, h := range retry {
		mr.record(h.r, h.heard)
	}
}

// loadPending reads the hashes of the publishes heard but not written
// before the last stop.
func (mr *retainedMirror) loadPending() {
	if mr.pendingPath == "" {
		return
	}
	b, err := os.ReadFile(mr.pendingPath)
	if err != nil {
		return // none
	}
	var kept map[string]string
	if err := json.Unmarshal(b, &kept); err != nil {
		mr.log.Warn("the list of retained publishes not yet written to the mesh is unreadable: they reach the mesh at their next publish", "path", mr.pendingPath, "err", err)
		return
	}
	mr.mu.Lock()
	defer mr.mu.Unlock()
	for subj, h := range kept {
		var sum [sha256.Size]byte
		if b, err := hex.DecodeString(h); err == nil && len(b) == len(sum) {
			copy(sum[:], b)
			mr.pending[subj] = sum
		}
	}
}

// savePending keeps pending's hashes at pendingPath. mr.mu is held.
func (mr *retainedMirror) savePending() {
	if mr.pendingPath == "" {
		return
	}
	kept := make(map[string]string, len(mr.pending))
	for subj, h := range mr.pending {
		kept[subj] = hex.EncodeToString(h[:])
	}
	b, _ := json.Marshal(kept)
	tmp := mr.pendingPath + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err == nil {
		err = os.Rename(tmp, mr.pendingPath)
		if err == nil {
			return
		}
	}
	mr.logOnce("pending\x00file", "the list of retained publishes not yet written to the mesh was not saved: they reach the mesh only at their next publish if the node stops first", "path", mr.pendingPath)
}

// reconcile reads the store as it is at start: local publishes the table
// lacks are written, and every row is settled (its winner put into the
// store where the store holds another).
//
// What the stream holds cannot tell a device's publish from a message a
// local program made the server send onto $MQTT.rmsgs.> (see hear): the
// stream stores both, and the origin header is the server's node name, a
// hash of its name that anyone can compute. So at start the mirror trusts
// a local message of the store only when it saw it live: when the table
// already holds it (nothing to write then), or when it is a publish heard
// live whose write of the table failed, whose hash was kept for this
// (pending, at pendingPath). Any other (and any carrying the headers of a
// JetStream answer or delivery: Nats-Stream, Nats-Subject,
// Nats-Sequence, or another origin) is refused as unverified or forged
// and taken as seen: the mesh's winner of its topic takes its place. The
// cost: a device's publish the mirror missed while running (a slow
// consumer) reaches the mesh at the device's next publish, not at the
// node's next start.
func (mr *retainedMirror) reconcile(ctx context.Context) error {
	info, err := mr.stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("stream %s: %w", localnats.RetainedStream, err)
	}
	if info.State.Msgs > 0 {
		cons, err := mr.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
		if err != nil {
			return fmt.Errorf("read stream %s: %w", localnats.RetainedStream, err)
		}
		for seen := uint64(0); seen < info.State.LastSeq; {
			batch, err := cons.Fetch(256, jetstream.FetchMaxWait(2*time.Second))
			if err != nil {
				return fmt.Errorf("read stream %s: %w", localnats.RetainedStream, err)
			}
			n := 0
			for msg := range batch.Messages() {
				n++
				md, err := msg.Metadata()
				if err != nil {
					continue
				}
				seen = md.Sequence.Stream
				r, err := localnats.DecodeRetained(msg.Subject(), msg.Headers(), msg.Data())
				if err != nil {
					mr.refuse("malformed", "", err)
					continue
				}
				if r.Origin != localnats.MeshOrigin {
					mr.reconcileOne(r, msg.Headers(), md.Timestamp)
				}
			}
			if batch.Error() != nil || n == 0 {
				break // read what there was; the rest came after the start and is heard
			}
		}
	}
	return mr.eng.Store().Rows(wire.TableMQTTRetained, "", func(row string, _ map[string]rows.Cell) bool {
		mr.markDirty(row)
		return true
	})
}

// reconcileOne takes a local message of the store at start (see
// reconcile).
func (mr *retainedMirror) reconcileOne(r localnats.Retained, h nats.Header, stored time.Time) {
	for _, k := range []string{jetstream.StreamHeader, jetstream.SubjectHeader, jetstream.SequenceHeader} {
		if h.Get(k) != "" {
			mr.distrust(r, "forged", fmt.Errorf("%s: the MQTT store holds a JetStream answer (header %s), no store request of this node's server: it is not carried", r.Subject, k))
			return
		}
	}
	if r.Origin != mr.server {
		mr.distrust(r, "forged", fmt.Errorf("%s: the MQTT store holds a message of origin %q, not this node's server: it is not carried", r.Subject, r.Origin))
		return
	}
	if !strings.HasPrefix(r.Subject, wire.EvtPrefix) {
		mr.record(r, stored) // refused, not_event
		return
	}
	mr.mu.Lock()
	kept, ok := mr.pending[r.Subject]
	mr.mu.Unlock()
	if ok && kept == retainedHash(r) {
		mr.record(r, stored)
		return
	}
	row := retainedRow(r.Subject)
	cells, err := mr.eng.Store().Row(wire.TableMQTTRetained, row)
	if held, _, herr := retainedOf(row, cells); err == nil && len(cells) > 0 && herr == nil && sameRetained(held, r) {
		mr.mu.Lock()
		mr.recorded[r.Subject] = retainedHash(r)
		mr.mu.Unlock()
		return // the table holds it
	}
	mr.distrust(r, "unverified", fmt.Errorf("%s: the MQTT store holds a message the node did not see a device publish: it is not carried", r.Subject))
}
