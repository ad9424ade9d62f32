package appliance

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

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
