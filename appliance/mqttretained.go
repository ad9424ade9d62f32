package appliance

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshbox/meshbox/appliance/localnats"
	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/internal/wire"
)

// The MQTT retained state of the mesh rides on the tables of rows: the
// table mqtt_retained (wire.TableMQTTRetained), which a node with an MQTT
// listener defines for itself, holds a row per topic. Rows are sealed,
// checked for their writer and bounded, and converge by the mesh's hybrid
// clock, so the retained state does too: the last retain of a topic, by
// that clock, is its retained message on every node.
//
// The node's retainedMirror joins the table to its NATS server's own
// store of retained messages (localnats.Retained):
//
//   - Out: it hears the server store its devices' retained publishes (a
//     subscription on $MQTT.rmsgs.>; the server stores one only after it
//     checked the device's right to publish the topic), keeps only the
//     server's own store requests (hear: a local program can make the
//     server send other messages there), checks the publisher's right
//     again against the programs' rights, and writes the row. Only topics
//     under evt/ (the mesh's events) go to the mesh.
//   - In: for each change of the table that won, it puts the winner into
//     the server's store as the server would (an empty payload clears),
//     where the server's own consumer of the stream finds it and serves it
//     to later subscribers.
//
// No loop: what the mirror puts into the store carries the origin
// localnats.MeshOrigin, which the server never gives its devices'
// publishes; the mirror hears those copies on $MQTT.rmsgs.> too and
// drops them there (hear), so a retained message from the mesh never
// becomes a new write of the table. And a row whose winner this node wrote
// came from its own store: it is not put back (settle).

// The row of a topic: every write sets subject, qos and source, and sets
// or deletes each payload part, all with one stamp, so that every field of
// a row converges to the same write. A clear sets the payload parts
// deleted: the row keeps the subject (a row whose key is a hash names its
// topic only there).
const (
	retainedFieldSubject = "subject"
	retainedFieldQoS     = "qos"
	retainedFieldSource  = "source"
	retainedFieldPayload = "payload" // the first part; then payload_1, payload_2
	retainedParts        = 3
)

// DefaultMQTTRetainedMaxBytes is the default bound of the node's store of
// MQTT retained messages (nats_mqtt_retained_max_bytes).
const DefaultMQTTRetainedMaxBytes = 64 << 20

const (
	minMQTTRetainedBytes = 1 << 20
	maxMQTTRetainedBytes = 1 << 40
)

// MaxRetainedPayload is the largest retained payload the mesh carries (a
// row's payload parts); a larger one stays on its node, refused as
// too_large.
const MaxRetainedPayload = retainedParts * rows.MaxValueLen

func retainedPart(i int) string {
	if i == 0 {
		return retainedFieldPayload
	}
	return retainedFieldPayload + "_" + strconv.Itoa(i)
}

// retainedRow is the row key of subject: the subject itself where it is
// a row key (and does not start with '='), else '=' and its SHA-256.
func retainedRow(subject string) string {
	if !strings.HasPrefix(subject, "=") && rows.ValidRow(subject) == nil {
		return subject
	}
	sum := sha256.Sum256([]byte(subject))
	return "=" + hex.EncodeToString(sum[:])
}

// retainedWrite is the write of r's row.
func retainedWrite(r localnats.Retained) (set map[string][]byte, del []string) {
	set = map[string][]byte{
		retainedFieldSubject: []byte(r.Subject),
		retainedFieldQoS:     []byte(strconv.Itoa(int(r.QoS))),
		retainedFieldSource:  []byte(r.Source),
	}
	p := r.Payload
	for i := range retainedParts {
		if len(p) == 0 {
			del = append(del, retainedPart(i))
			continue
		}
		n := min(len(p), rows.MaxValueLen)
		set[retainedPart(i)] = p[:n]
		p = p[n:]
	}
	return set, del
}

// retainedFields are the fields every write of a row sets or deletes.
var retainedFields = func() []string {
	f := []string{retainedFieldSubject, retainedFieldQoS, retainedFieldSource}
	for i := range retainedParts {
		f = append(f, retainedPart(i))
	}
	return f
}()

// retainedSubjectOK reports why subject cannot be a retained message of
// the mesh (nil: it can): an event's subject (evt.), literal (no empty
// token, no wildcard), valid UTF-8 without control characters or white
// space (which no MQTT topic the server takes has).
func retainedSubjectOK(subject string) error {
	if !strings.HasPrefix(subject, wire.EvtPrefix) {
		return fmt.Errorf("subject %q is not an event's", subject)
	}
	if !utf8.ValidString(subject) {
		return fmt.Errorf("subject %q is not UTF-8", subject)
	}
	for i := 0; i < len(subject); i++ {
		if c := subject[i]; c <= ' ' || c == 0x7f {
			return fmt.Errorf("subject %q holds a control character or white space", subject)
		}
	}
	if !server.IsValidLiteralSubject(subject) {
		return fmt.Errorf("subject %q is not a literal subject", subject)
	}
	return nil
}

// retainedOf reads a row: the retained message it holds (an empty payload
// when cleared) and the version of its write, which names the writer.
//
// A row is one write: every field a write names (subject, qos, source,
// each payload part, set or deleted) must carry the same stamp and node.
// A row whose fields come from different writes (a peer that wrote some
// fields only, over another node's write) is refused as a whole, under
// bad_row, and attributed to the writer of its newest field: taking the
// fields one by one would mix two writes and name the wrong writer. The
// next whole write of the topic (a later retain) replaces it.
func retainedOf(row string, cells map[string]rows.Cell) (localnats.Retained, rows.Cell, error) {
	sc, ok := cells[retainedFieldSubject]
	newest := sc
	for _, f := range retainedFields {
		if c, ok := cells[f]; ok && c.Wins(newest) {
			newest = c
		}
	}
	if !ok || sc.Deleted {
		return localnats.Retained{}, newest, fmt.Errorf("row %s has no subject", row)
	}
	for _, f := range retainedFields {
		c, ok := cells[f]
		if !ok {
			return localnats.Retained{}, newest, fmt.Errorf("row %s lacks field %s: no whole write", row, f)
		}
		if c.Stamp != sc.Stamp || c.Node != sc.Node {
			return localnats.Retained{}, newest, fmt.Errorf("row %s: field %s was written by %s at %d, its subject by %s at %d: fields of different writes", row, f, c.Node, c.Stamp, sc.Node, sc.Stamp)
		}
	}
	r := localnats.Retained{Subject: string(sc.Value)}
	if retainedRow(r.Subject) != row {
		return r, sc, fmt.Errorf("row %s names subject %q, which is not its own", row, r.Subject)
	}
	if err := retainedSubjectOK(r.Subject); err != nil {
		return r, sc, fmt.Errorf("row %s: %w", row, err)
	}
	if q := cells[retainedFieldQoS]; !q.Deleted {
		n, err := strconv.Atoi(string(q.Value))
		if err != nil || n < 0 || n > 2 {
			return r, sc, fmt.Errorf("row %s: qos %q is not 0, 1 or 2", row, q.Value)
		}
		r.QoS = byte(n)
	}
	if s := cells[retainedFieldSource]; !s.Deleted {
		r.Source = string(s.Value)
	}
	for i := range retainedParts {
		c := cells[retainedPart(i)]
		if c.Deleted {
			break
		}
		r.Payload = append(r.Payload, c.Value...)
	}
	return r, sc, nil
}

// sameRetained reports whether a and b hold the same retained message
// (two clears are the same whatever their QoS).
func sameRetained(a, b localnats.Retained) bool {
	if len(a.Payload) == 0 || len(b.Payload) == 0 {
		return len(a.Payload) == len(b.Payload)
	}
	return a.QoS == b.QoS && bytes.Equal(a.Payload, b.Payload)
}

func retainedHash(r localnats.Retained) [sha256.Size]byte {
	if len(r.Payload) == 0 {
		return sha256.Sum256(nil)
	}
	return sha256.Sum256(append([]byte{r.QoS}, r.Payload...))
}

// retainedMetrics count what the mirror did and refused.
type retainedMetrics struct {
	recorded, applied prometheus.Counter
	refused, errors   *prometheus.CounterVec
	reg               prometheus.Registerer
}

func newRetainedMetrics(reg prometheus.Registerer) (*retainedMetrics, error) {
	m := &retainedMetrics{
		recorded: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshbox_mqtt_retained_recorded_total",
			Help: "Retained MQTT publishes of this node's devices written to the table mqtt_retained (the mesh's retained state)."}),
		applied: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshbox_mqtt_retained_applied_total",
			Help: "Retained messages of other nodes put into this node's MQTT store (a clear included)."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshbox_mqtt_retained_refused_total",
			Help: "Retained messages not carried, by cause (not_allowed: its publisher may not publish the topic; not_event: a topic outside evt/, kept on its node; too_large: a payload past the mesh's bound, kept on its node; malformed: a message of the store the node cannot read; bad_row: a row of the table that is no retained message; forged: a message on the store's subjects that is no store request of the node's server; unverified: a message of the store at start the node did not see a device publish; over_quota: a row of another node past its quota in this node's store)."},
			[]string{"cause"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshbox_mqtt_retained_errors_total",
			Help: "Failures of carrying the retained state, by kind (table: a write of the table; store: the MQTT store), retried."}, []string{"kind"}),
		reg: reg,
	}
	for _, c := range []prometheus.Collector{m.recorded, m.applied, m.refused, m.errors} {
		if err := reg.Register(c); err != nil {
			m.unregister()
			return nil, fmt.Errorf("mqtt retained metrics: %w", err)
		}
	}
	return m, nil
}

func (m *retainedMetrics) unregister() {
	for _, c := range []prometheus.Collector{m.recorded, m.applied, m.refused, m.errors} {
		m.reg.Unregister(c)
	}
}

// retainedMirror joins the table mqtt_retained and the NATS server's
// store of retained messages (see above). It owns one goroutine, the
// settler, which exits when Close is called; the subscription's callback
// runs on the NATS connection's goroutine for it.
type retainedMirror struct {
	node   string
	eng    *rows.Engine
	nc     *nats.Conn
	js     jetstream.JetStream
	stream jetstream.Stream
	rights *localnats.Rights
	log    *slog.Logger
	m      *retainedMetrics
	sub    *nats.Subscription

	// server is the NATS server's node name: the origin its own store
	// requests carry, and the token after $MQTT.JSA. in their reply
	// subjects (storeReply is that reply's prefix).
	server, storeReply string
	// pendingPath keeps pending's hashes across restarts ("": not kept).
	pendingPath string
	maxBytes    int64 // the store's bound (nats_mqtt_retained_max_bytes)

	// quota bounds, per writer (another node), the rows and payload bytes
	// of the table the mirror puts into the store; use is what each
	// writer's rows put there take, charged is per row its writer and
	// size. The settler alone touches use and charged.
	quota   retainedUse
	use     map[string]retainedUse
	charged map[string]retainedCharge

	// mu guards recorded and pending and serialises recording local
	// publishes; it is never held across a call on the network. recorded
	// is, per subject, the local publish last written to the table (or
	// found there, or refused): a local message of the store that is not
	// it is a publish whose recording is on its way, which the settler
	// leaves alone. pending holds, per subject, a local publish heard
	// live whose write of the table failed (retry: the message, retried
	// by the settler; pending: its hash, kept at pendingPath, which the
	// next start's reconcile trusts).
	mu       sync.Mutex
	recorded map[string][sha256.Size]byte
	// distrusted is, per subject, the message of the store last refused
	// as forged or unverified, and when: settle replaces it even by this
	// node's own write.
	distrusted map[string]distrustedMsg
	pending    map[string][sha256.Size]byte
	retry      map[string]heardRetained

	dmu   sync.Mutex
	dirty map[string]bool // rows to settle
	wake  chan struct{}   // cap 1

	logged  sync.Map     // cause and party pairs logged (refuse)
	nlogged atomic.Int32 // how many
	quit    chan struct{}
	done    chan struct{}
}

// distrustedMsg is a message of the store refused as forged or
// unverified, and when.
type distrustedMsg struct {
	hash [sha256.Size]byte
	at   time.Time
}

// errRetainedRecheck: a message refused as forged is heard before the
// stream stores it; settle looks again a little later.
var errRetainedRecheck = errors.New("the store does not hold the message refused yet")

// retainedRecheck is how soon, and how long, settle looks again for a
// message refused as forged that the store does not hold yet.
const (
	retainedRecheck    = 100 * time.Millisecond
	retainedRecheckFor = 2 * time.Second
)

// retainedUse is what a writer's rows take in the store.
type retainedUse struct{ rows, bytes int }

// retainedCharge is a row's writer and size in the store.
type retainedCharge struct {
	writer string
	bytes  int
}

// The default quota of each other node in a node's store: at most so
// many topics and payload bytes of its retained messages. Past it, its
// further rows stay in the table but not in the store (over_quota).
const (
	retainedQuotaRows  = 10000
	retainedQuotaBytes = 16 << 20
)

// heardRetained is a local publish heard live, and when.
type heardRetained struct {
	r     localnats.Retained
	heard time.Time
}

// retainedRefusedLogs bounds the refusals logged.
const retainedRefusedLogs = 1024

// Pauses of the settler: a row whose settle failed is tried again after
// a pause that doubles up to retainedBackoffMax (the other rows go on);
// the failed writes of the table are tried again every retainedRetry.
const (
	retainedBackoffMin = time.Second
	retainedBackoffMax = 30 * time.Second
	retainedRetry      = 5 * time.Second
)

// retainedPendingFile, in the data directory, keeps the hashes of the
// local publishes heard but not yet written to the table.
const retainedPendingFile = "mqtt-retained-pending.json"

// newRetainedMirror makes a mirror; start starts it.
func newRetainedMirror(node, server, pendingPath string, eng *rows.Engine, nc *nats.Conn, rights *localnats.Rights, log *slog.Logger, m *retainedMetrics) *retainedMirror {
	return &retainedMirror{
		node: node, server: server, storeReply: "$MQTT.JSA." + server + ".MS.", pendingPath: pendingPath,
		eng: eng, nc: nc, rights: rights, log: log, m: m,
		maxBytes: DefaultMQTTRetainedMaxBytes, recorded: map[string][sha256.Size]byte{}, pending: map[string][sha256.Size]byte{},
		distrusted: map[string]distrustedMsg{},
		retry:      map[string]heardRetained{}, dirty: map[string]bool{},
		quota: retainedUse{rows: retainedQuotaRows, bytes: retainedQuotaBytes},
		use:   map[string]retainedUse{}, charged: map[string]retainedCharge{},
		wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{}),
	}
}

// startRetained starts the mirror of the MQTT retained state when the
// node has an MQTT listener and tables that reach the mesh. a.mu is held.
func (a *Appliance) startRetained(ctx context.Context) error {
	r := a.parts()
	if !a.retainedOn() || r.rows == nil {
		return nil
	}
	m, err := newRetainedMetrics(a.tel.registry)
	if err != nil {
		return err
	}
	nc, err := r.nats.Connect(ownConnPrefix+"mqtt-retained", nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		// A slow consumer drops what the server stored: the next start
		// does not take it from the store either (reconcile trusts only
		// what it saw), so it reaches the mesh at its topic's next retain.
		m.errors.WithLabelValues("store").Inc()
		a.logger.Warn("mqtt retained: the node's connection to its MQTT store failed; a retained publish may reach the mesh only when its device publishes it again", "component", "mqtt-retained", "err", err)
	}))
	if err != nil {
		m.unregister()
		return fmt.Errorf("mqtt retained: nats connect: %w", err)
	}
	r.interest.exclude(nc)
	mr := newRetainedMirror(a.cfg.Node, r.nats.NATS().NodeName(), filepath.Join(a.cfg.DataDir, retainedPendingFile),
		r.rows, nc, r.nats.Rights(), a.logger.With("component", "mqtt-retained"), m)
	mr.maxBytes = a.cfg.NATSMQTTRetainedMaxBytes
	if err := mr.start(ctx); err != nil {
		close(mr.done)
		_ = mr.Close()
		return fmt.Errorf("mqtt retained: %w", err)
	}
	a.update(func(r *running) { r.retained = mr })
	return nil
}

// retainedOn reports whether this node carries the MQTT retained state
// of the mesh: it has an MQTT listener, and keys (a mesh).
func (a *Appliance) retainedOn() bool {
	r := a.parts()
	return r.keys != nil && r.nats != nil && r.nats.MQTTURL() != ""
}

// stopRetained stops the mirror. a.mu is held.
func (a *Appliance) stopRetained() {
	if mr := a.parts().retained; mr != nil {
		a.update(func(r *running) { r.retained = nil })
		_ = mr.Close()
	}
}

// errRetainedReadOnly is why the rows API does not write the table.
var errRetainedReadOnly = errors.New("it holds the MQTT retained state, written from the devices' retained publishes: publish a retained MQTT message instead (an empty one clears the topic)")

// retainedReadOnly is the rows API's ServeConfig.ReadOnly.
func retainedReadOnly(table string) error {
	if table == wire.TableMQTTRetained {
		return errRetainedReadOnly
	}
	return nil
}

// start makes the store's stream if the server has none yet, hears the
// server store, reads the store as it is (reconcile) and starts the
// settler.
func (mr *retainedMirror) start(ctx context.Context) error {
	var err error
	if mr.js, err = jetstream.New(mr.nc); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if mr.stream, err = localnats.EnsureRetainedStream(ctx, mr.js, mr.maxBytes); err != nil {
		return err
	}
	mr.loadPending()
	mr.eng.OnChange(func(a rows.Applied) {
		if a.Table == wire.TableMQTTRetained {
			mr.markDirty(a.Row)
		}
	})
	if mr.sub, err = mr.nc.Subscribe(localnats.RetainedSubjectPrefix+">", mr.hear); err != nil {
		return err
	}
	_ = mr.sub.SetPendingLimits(-1, 256<<20)
	if err := mr.nc.Flush(); err != nil {
		return err
	}
	if err := mr.reconcile(ctx); err != nil {
		return err
	}
	go mr.settler() // exits when Close closes quit
	return nil
}

// Close stops the mirror; it returns when its goroutine is gone.
func (mr *retainedMirror) Close() error {
	select {
	case <-mr.quit:
	default:
		close(mr.quit)
	}
	mr.nc.Close() // no callback runs after it returns
	<-mr.done
	mr.m.unregister()
	return nil
}

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

func (mr *retainedMirror) markDirty(row string) {
	mr.dmu.Lock()
	mr.dirty[row] = true
	mr.dmu.Unlock()
	select {
	case mr.wake <- struct{}{}:
	default:
	}
}

// settler settles the rows that changed and tries the failed writes of
// the table again, until Close. A row whose settle fails is tried again
// after a pause of its own (retainedBackoffMin, doubling up to
// retainedBackoffMax): the other rows do not wait for it.
func (mr *retainedMirror) settler() {
	defer close(mr.done)
	retryAt := map[string]time.Time{}
	backoff := map[string]time.Duration{}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := time.Hour
		now := time.Now()
		for _, at := range retryAt {
			next = min(next, at.Sub(now))
		}
		mr.mu.Lock()
		if len(mr.retry) > 0 {
			next = min(next, retainedRetry)
		}
		mr.mu.Unlock()
		timer.Reset(max(next, 0))
		select {
		case <-mr.quit:
			return
		case <-mr.wake:
		case <-timer.C:
		}
		mr.retryRecords()
		mr.dmu.Lock()
		dirty := mr.dirty
		mr.dirty = map[string]bool{}
		mr.dmu.Unlock()
		now = time.Now()
		for row, at := range retryAt {
			if !now.Before(at) {
				dirty[row] = true
				delete(retryAt, row)
			}
		}
		for row := range dirty {
			if _, waiting := retryAt[row]; waiting {
				continue // tried again after its pause
			}
			err := mr.settle(row)
			if err == nil {
				delete(backoff, row)
				continue
			}
			select {
			case <-mr.quit:
				return // the connection closed under it
			default:
			}
			if errors.Is(err, errRetainedRecheck) {
				retryAt[row] = time.Now().Add(retainedRecheck)
				continue
			}
			b := backoff[row]
			if b == 0 {
				mr.log.Warn("a retained message of the mesh was not put into this node's MQTT store; retrying", "row", row, "err", err)
			}
			b = min(max(2*b, retainedBackoffMin), retainedBackoffMax)
			backoff[row], retryAt[row] = b, time.Now().Add(b)
			mr.m.errors.WithLabelValues("store").Inc()
		}
	}
}

// settle puts row's winner into the store when the store holds another
// retained message for its subject. It holds mr.mu only to read
// recorded, not across its calls on the store.
func (mr *retainedMirror) settle(row string) error {
	cells, err := mr.eng.Store().Row(wire.TableMQTTRetained, row)
	if err != nil {
		return err
	}
	if len(cells) == 0 {
		return nil
	}
	want, sc, err := retainedOf(row, cells)
	if err != nil {
		mr.refuse("bad_row", sc.Node, err)
		return nil
	}
	if err := mr.charge(row, sc.Node, len(want.Payload)); err != nil {
		mr.refuse("over_quota", sc.Node, err)
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var cur localnats.Retained
	msg, err := mr.stream.GetLastMsgForSubject(ctx, localnats.RetainedSubjectPrefix+want.Subject)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		// none, or a device's clear (the server deletes its own)
	case err != nil:
		return err
	default:
		if cur, err = localnats.DecodeRetained(msg.Subject, msg.Header, msg.Data); err != nil {
			mr.refuse("malformed", "", err)
		}
	}
	mr.mu.Lock()
	seen := mr.recorded[want.Subject] == retainedHash(cur)
	d, ok := mr.distrusted[want.Subject]
	distrusted := ok && d.hash == retainedHash(cur) && len(cur.Payload) > 0
	if ok && !distrusted && time.Since(d.at) > retainedRecheckFor {
		delete(mr.distrusted, want.Subject)
	}
	mr.mu.Unlock()
	if ok && !distrusted && time.Since(d.at) <= retainedRecheckFor {
		return errRetainedRecheck // heard before the stream stored it
	}
	if sameRetained(cur, want) {
		return nil
	}
	if cur.Origin != localnats.MeshOrigin && len(cur.Payload) > 0 && !seen {
		return nil // a device's publish not yet recorded: record writes it, and it wins
	}
	if sc.Node == mr.node && cur.Origin != localnats.MeshOrigin && !distrusted {
		return nil // this node's write came from this store
	}
	put := want
	put.Origin, put.Source = localnats.MeshOrigin, "node:"+sc.Node
	if _, err := mr.js.PublishMsg(ctx, localnats.EncodeRetained(put)); err != nil {
		return err
	}
	if distrusted {
		mr.mu.Lock()
		if mr.distrusted[want.Subject] == d {
			delete(mr.distrusted, want.Subject)
		}
		mr.mu.Unlock()
	}
	mr.m.applied.Inc()
	return nil
}

// charge charges row, of size bytes, to writer's quota, and frees what
// the row's earlier winner took; an error when it is past the quota. The
// node's own rows (its devices') are bounded by the store alone. Only
// the settler calls it.
func (mr *retainedMirror) charge(row, writer string, bytes int) error {
	if old, ok := mr.charged[row]; ok {
		u := mr.use[old.writer]
		u.rows, u.bytes = u.rows-1, u.bytes-old.bytes
		mr.use[old.writer] = u
		delete(mr.charged, row)
	}
	if writer == mr.node {
		return nil
	}
	u := mr.use[writer]
	if u.rows+1 > mr.quota.rows || u.bytes+bytes > mr.quota.bytes {
		return fmt.Errorf("row %s: node %s's retained messages in this node's store would pass its quota of %d topics and %d bytes: it is not put there", row, writer, mr.quota.rows, mr.quota.bytes)
	}
	u.rows, u.bytes = u.rows+1, u.bytes+bytes
	mr.use[writer] = u
	mr.charged[row] = retainedCharge{writer: writer, bytes: bytes}
	return nil
}

// logOnce logs a warning once per key (bounded, with refuse's).
func (mr *retainedMirror) logOnce(key, msg string, args ...any) {
	if mr.nlogged.Load() >= retainedRefusedLogs {
		return
	}
	if _, seen := mr.logged.LoadOrStore(key, true); !seen {
		mr.nlogged.Add(1)
		mr.log.Warn(msg, args...)
	}
}

// errKind names the kind of a failure of the table, for logOnce.
func errKind(err error) string {
	switch {
	case errors.Is(err, rows.ErrNoKey):
		return "no_key"
	case errors.Is(err, rows.ErrNoTable):
		return "no_table"
	case errors.Is(err, rows.ErrBadInput):
		return "bad_input"
	}
	return "store"
}

// refuse counts a retained message not carried, under cause, and logs it
// once per cause and party (a program or a node).
func (mr *retainedMirror) refuse(cause, party string, err error) {
	mr.m.refused.WithLabelValues(cause).Inc()
	mr.logOnce(cause+"\x00"+party, "a retained message is not carried across the mesh (logged once per cause and party)", "cause", cause, "party", party, "err", err)
}
