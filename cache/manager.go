package cache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshbox/meshbox/internal/backoff"
)

// Database connection states shown in Status.DB.
const (
	DBConnected    = "connected"
	DBDisconnected = "disconnected"
	DBNone         = "none" // no database configured
)

// Defaults for ManagerConfig.
const (
	DefaultLoadTimeout      = 2 * time.Second
	DefaultRetryInterval    = time.Second
	DefaultMaxRetryInterval = 30 * time.Second
	DefaultRefreshInterval  = time.Minute
)

// Source is where bindings come from: the mesh database (cache/meshdb).
type Source interface {
	// Load reads node's bindings in one consistent snapshot with the mesh
	// revision. It honours ctx's deadline.
	Load(ctx context.Context, node string) (Snapshot, error)
	// Watch follows changes until ctx is done, then returns. It calls
	// changed after every (re)connect of its listening connection and on
	// every change notification, and lost each time the connection fails
	// or a connection attempt fails; it reconnects by itself. Both callbacks
	// must return quickly.
	Watch(ctx context.Context, changed func(), lost func(error)) error
}

// ManagerConfig configures a Manager.
type ManagerConfig struct {
	// Node is this node's mesh name (required, see ValidateNodeName).
	Node string
	// Store is the bindings cache (required). The Manager does not close it.
	Store *Store
	// Source is the mesh database; nil runs from the cache alone. The
	// Manager does not close it.
	Source Source
	// LoadTimeout bounds each load from Source, the first one included
	// (default 2s).
	LoadTimeout time.Duration
	// RetryInterval is the first wait after a failed load; it doubles up to
	// MaxRetryInterval (defaults 1s and 30s).
	RetryInterval    time.Duration
	MaxRetryInterval time.Duration
	// RefreshInterval is how often bindings are re-read while connected, a
	// safety net under notifications (default 1m).
	RefreshInterval time.Duration
	// MaxAge raises a warning when the bindings in use have not been
	// confirmed by the database for longer (0 = never).
	MaxAge time.Duration
	// Logger receives state changes (default: discard).
	Logger *slog.Logger
	// Metrics registers the manager's metrics (nil = not registered).
	Metrics prometheus.Registerer
}

// Status is the bindings part of the node's status.
type Status struct {
	Source      string            `json:"source"` // db, cache or none
	Revision    int64             `json:"revision"`
	Hash        string            `json:"hash"`
	FetchedAt   *time.Time        `json:"fetched_at"`  // when the bindings in use were last read from the database
	AgeSeconds  float64           `json:"age_seconds"` // 0 while live-connected; time since FetchedAt otherwise
	DB          string            `json:"db"`          // connected, disconnected or none
	Warning     string            `json:"warning"`     // max age exceeded, node not registered, no bindings
	Divergence  *DivergenceReport `json:"divergence"`  // the last change applied, or nil
	Quarantined string            `json:"quarantined,omitempty"`
	LastError   string            `json:"last_error,omitempty"` // the last load or cache error, cleared by success
}

// DivergenceReport records one change of the bindings in use: what the
// node ran before, what it runs now, and every row that differs.
type DivergenceReport struct {
	At           time.Time  `json:"at"`
	FromRevision int64      `json:"from_revision"`
	ToRevision   int64      `json:"to_revision"`
	FromSource   string     `json:"from_source"`  // where the bindings replaced came from: db or cache
	OnReconnect  bool       `json:"on_reconnect"` // found when the database became reachable, not by a live notification
	Summary      string     `json:"summary"`
	Changes      Divergence `json:"changes"`
}

// Manager keeps a node's bindings: it chooses the database or the cache at
// start, follows the database while it is reachable, reports and applies
// differences, and stores every new version. See the package comment for
// its goroutines.
type Manager struct {
	cfg     ManagerConfig
	log     *slog.Logger
	metrics *managerMetrics
	kick    chan struct{} // buffered(1): a load is wanted
	aging   chan struct{} // buffered(1): the bindings may have started to age

	lifeMu  sync.Mutex // guards started, closed, cancel
	started bool
	closed  bool
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu         sync.Mutex // guards the fields below
	cur        Snapshot
	have       bool
	source     string
	db         string
	verifiedAt time.Time // when the database last confirmed cur
	report     *DivergenceReport
	lastErr    string
	stale      bool // age beyond MaxAge, logged once per transition
	listeners  []func(Snapshot, Divergence)
}

// NewManager validates cfg and returns a Manager; nothing runs until Start.
func NewManager(cfg ManagerConfig) (*Manager, error) {
	if err := ValidateNodeName(cfg.Node); err != nil {
		return nil, fmt.Errorf("%w: node: %w", ErrConfig, err)
	}
	if cfg.Store == nil {
		return nil, fmt.Errorf("%w: store is required", ErrConfig)
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"load timeout", &cfg.LoadTimeout, DefaultLoadTimeout},
		{"retry interval", &cfg.RetryInterval, DefaultRetryInterval},
		{"max retry interval", &cfg.MaxRetryInterval, DefaultMaxRetryInterval},
		{"refresh interval", &cfg.RefreshInterval, DefaultRefreshInterval},
	} {
		if *d.v < 0 {
			return nil, fmt.Errorf("%w: %s must not be negative", ErrConfig, d.name)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if cfg.MaxRetryInterval < cfg.RetryInterval {
		cfg.MaxRetryInterval = cfg.RetryInterval
	}
	if cfg.MaxAge < 0 {
		return nil, fmt.Errorf("%w: max age must not be negative", ErrConfig)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	m := &Manager{
		cfg:    cfg,
		log:    cfg.Logger.With("component", "bindings"),
		kick:   make(chan struct{}, 1),
		aging:  make(chan struct{}, 1),
		source: SourceNone,
		db:     DBNone,
	}
	if cfg.Source != nil {
		m.db = DBDisconnected
	}
	m.metrics = newManagerMetrics(m)
	if cfg.Metrics != nil {
		if err := m.metrics.register(cfg.Metrics); err != nil {
			return nil, fmt.Errorf("%w: metrics: %w", ErrConfig, err)
		}
	}
	if q := cfg.Store.Quarantined(); q != "" {
		m.metrics.quarantined.Inc()
	}
	return m, nil
}

// Start chooses the bindings to start with — the database if it answers
// within LoadTimeout, else the newest cached snapshot for this node, else
// none — and starts following the database in the background. It returns
// an error only for misuse; an unreachable database or an empty cache is
// a state shown in Status, not an error.
func (m *Manager) Start(ctx context.Context) error {
	m.lifeMu.Lock()
	defer m.lifeMu.Unlock()
	if m.closed {
		return fmt.Errorf("start bindings: %w", ErrClosed)
	}
	if m.started {
		return errors.New("start bindings: already started")
	}
	m.started = true

	if q := m.cfg.Store.Quarantined(); q != "" {
		m.log.Error("damaged bindings cache set aside; rebuilding it from the database",
			"moved_to", q, "damage", m.cfg.Store.Damage())
	}

	var live Snapshot
	liveErr := errNoSource
	if m.cfg.Source != nil {
		lctx, cancel := context.WithTimeout(ctx, m.cfg.LoadTimeout)
		live, liveErr = m.cfg.Source.Load(lctx, m.cfg.Node)
		cancel()
	}
	cached, cachedErr := m.cfg.Store.Latest()
	choice := chooseStart(m.cfg.Node, live, liveErr, cached, cachedErr)
	m.startWith(choice, liveErr, cached, cachedErr)

	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m.cancel = cancel
	if m.cfg.Source != nil {
		m.wg.Add(2)
		go func() { // exits when Close cancels runCtx
			defer m.wg.Done()
			m.watch(runCtx)
		}()
		go func() { // exits when Close cancels runCtx
			defer m.wg.Done()
			m.run(runCtx, liveErr != nil)
		}()
	} else if m.cfg.MaxAge > 0 {
		m.wg.Add(1)
		go func() { // exits when Close cancels runCtx
			defer m.wg.Done()
			m.ageLoop(runCtx)
		}()
	}
	return nil
}

// Close stops the background goroutines and returns when they are gone. It
// is idempotent and safe before Start. It closes neither Store nor Source.
func (m *Manager) Close() error {
	m.lifeMu.Lock()
	m.closed = true
	cancel := m.cancel
	m.cancel = nil
	m.lifeMu.Unlock()
	if cancel != nil {
		cancel()
	}
	m.wg.Wait()
	return nil
}

// Current returns the bindings in use and whether there are any.
func (m *Manager) Current() (Snapshot, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cur, m.have
}

// OnChange registers fn to be called, on the manager's goroutine, after
// every applied change of the bindings' content (not for the bindings
// chosen at Start; read those with Current). fn must not call Close.
func (m *Manager) OnChange(fn func(Snapshot, Divergence)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.listeners = append(m.listeners, fn)
}

// Status reports the bindings' source, revision, age, database state,
// warnings and the last divergence.
func (m *Manager) Status() Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	m.checkAgeLocked(now)
	st := Status{
		Source:      m.source,
		DB:          m.db,
		Divergence:  m.report,
		Quarantined: m.cfg.Store.Quarantined(),
		LastError:   m.lastErr,
	}
	if m.have {
		st.Revision = m.cur.Revision
		st.Hash = m.cur.Hash
		fetched := m.verifiedAt
		st.FetchedAt = &fetched
		st.AgeSeconds = m.ageLocked(now).Seconds()
	}
	st.Warning = m.warningLocked(now)
	return st
}

var errNoSource = errors.New("no mesh database configured")

// startChoice is the outcome of chooseStart.
type startChoice struct {
	snap   Snapshot
	source string // SourceDB, SourceCache or SourceNone
	reason string // why the cache was not used, for the log
}

// chooseStart picks the bindings to start with: the live snapshot if the
// database answered, else the cached one if it is for this node, else none.
func chooseStart(node string, live Snapshot, liveErr error, cached Snapshot, cachedErr error) startChoice {
	if liveErr == nil {
		return startChoice{snap: live, source: SourceDB}
	}
	switch {
	case errors.Is(cachedErr, ErrNoSnapshot):
		return startChoice{source: SourceNone, reason: "the cache holds no snapshot"}
	case cachedErr != nil:
		return startChoice{source: SourceNone, reason: "the cache could not be read: " + cachedErr.Error()}
	case cached.Bindings.Node != node:
		return startChoice{source: SourceNone, reason: fmt.Sprintf("the cached snapshot is for node %q", cached.Bindings.Node)}
	}
	return startChoice{snap: cached, source: SourceCache}
}

// reloadAction is what a freshly loaded snapshot means for the one in use.
type reloadAction int

const (
	reloadApply     reloadAction = iota // content differs (or nothing was in use): report and apply
	reloadRefresh                       // same content at another revision: record the revision
	reloadUnchanged                     // same revision, same content
)

// chooseReload compares a loaded snapshot with the one in use.
func chooseReload(cur Snapshot, have bool, loaded Snapshot) reloadAction {
	switch {
	case !have || cur.Hash != loaded.Hash || cur.Bindings.Node != loaded.Bindings.Node:
		return reloadApply
	case cur.Revision != loaded.Revision:
		return reloadRefresh
	default:
		return reloadUnchanged
	}
}

// startWith installs the start choice and logs it (one line).
func (m *Manager) startWith(c startChoice, liveErr error, cached Snapshot, cachedErr error) {
	now := time.Now()
	m.mu.Lock()
	m.source = c.source
	switch c.source {
	case SourceDB:
		m.cur, m.have = c.snap, true
		m.db = DBConnected
		m.verifiedAt = c.snap.FetchedAt
		var d Divergence
		if cachedErr == nil && cached.Bindings.Node == m.cfg.Node && cached.Hash != c.snap.Hash {
			d = Diff(cached.Bindings, c.snap.Bindings)
			m.report = &DivergenceReport{At: now, FromRevision: cached.Revision, ToRevision: c.snap.Revision,
				FromSource: SourceCache, OnReconnect: true, Summary: d.Summary(), Changes: d}
		}
		m.mu.Unlock()
		m.metrics.applied(c.snap, SourceDB, true)
		if d != nil {
			m.metrics.divergences.Inc()
			m.log.Warn("bindings loaded from the database differ from the cache",
				"from_revision", cached.Revision, "to_revision", c.snap.Revision, "divergence", d)
		} else {
			m.log.Info("bindings loaded from the database", "snapshot", c.snap, "bindings", c.snap.Bindings)
		}
		m.storeSnapshot(c.snap)
		return
	case SourceCache:
		m.cur, m.have = c.snap, true
		m.verifiedAt = c.snap.FetchedAt
		if liveErr != errNoSource {
			m.lastErr = liveErr.Error()
		}
		m.mu.Unlock()
		m.metrics.applied(c.snap, SourceCache, false)
		if liveErr == errNoSource {
			m.log.Info("no mesh database configured; using cached bindings",
				"snapshot", c.snap, "age", now.Sub(c.snap.FetchedAt).Round(time.Second))
		} else {
			m.log.Warn("mesh database unreachable at start; using cached bindings",
				"err", liveErr, "snapshot", c.snap, "age", now.Sub(c.snap.FetchedAt).Round(time.Second))
		}
	default:
		if liveErr != errNoSource {
			m.lastErr = liveErr.Error()
		}
		m.mu.Unlock()
		m.metrics.applied(Snapshot{}, SourceNone, false)
		if liveErr == errNoSource {
			m.log.Info("no mesh database configured and no cached bindings; running without bindings", "cache", c.reason)
		} else {
			m.log.Warn("mesh database unreachable at start and no usable cache; running without bindings",
				"err", liveErr, "cache", c.reason)
		}
	}
}

// watch runs Source.Watch until ctx is done.
func (m *Manager) watch(ctx context.Context) {
	changed := func() {
		select {
		case m.kick <- struct{}{}:
		default:
		}
	}
	lost := func(err error) { m.setDisconnected(err) }
	_ = m.cfg.Source.Watch(ctx, changed, lost) // returns only when ctx is done
}

// run performs every load and applies every change until ctx is done.
// Between loads it sleeps until the next retry, the next refresh, or the
// moment the bindings pass MaxAge, whichever comes first.
func (m *Manager) run(ctx context.Context, retrySoon bool) {
	// Jittered, so that nodes that lost the database together do not all
	// come back to it at the same instant.
	pause := backoff.Policy{Min: m.cfg.RetryInterval, Max: m.cfg.MaxRetryInterval}
	failures := 0
	retry := time.NewTimer(m.cfg.RetryInterval)
	if !retrySoon {
		retry.Stop()
	}
	defer retry.Stop()
	refresh := time.NewTimer(m.cfg.RefreshInterval)
	defer refresh.Stop()
	stale := time.NewTimer(0)
	defer stale.Stop()
	m.resetAgeTimer(stale)
	for {
		select {
		case <-ctx.Done():
			return
		case <-stale.C:
			m.checkAge()
			m.resetAgeTimer(stale)
			continue
		case <-m.aging:
			m.resetAgeTimer(stale)
			continue
		case <-m.kick:
		case <-retry.C:
		case <-refresh.C:
		}
		err := m.reload(ctx)
		m.checkAge() // a load may end the aging, or start it
		m.resetAgeTimer(stale)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			retry.Reset(pause.Delay(failures))
			continue
		}
		failures = 0
		retry.Stop()
		refresh.Reset(m.cfg.RefreshInterval)
	}
}

// ageLoop logs the max-age warning when there is no database to follow:
// it sleeps until the cached bindings pass MaxAge, once.
func (m *Manager) ageLoop(ctx context.Context) {
	stale := time.NewTimer(0)
	defer stale.Stop()
	m.resetAgeTimer(stale)
	for {
		select {
		case <-ctx.Done():
			return
		case <-stale.C:
			m.checkAge()
			m.resetAgeTimer(stale)
		}
	}
}

// resetAgeTimer sets t to fire when the bindings in use pass MaxAge, or
// stops it when they cannot (no MaxAge, no bindings, confirmed by a
// connected database, or already past it).
func (m *Manager) resetAgeTimer(t *time.Timer) {
	m.mu.Lock()
	d, ok := m.untilStaleLocked(time.Now())
	m.mu.Unlock()
	if ok {
		t.Reset(d)
	} else {
		t.Stop()
	}
}

// untilStaleLocked is how long until the bindings in use pass MaxAge, and
// whether they will without a change of state. Caller holds mu.
func (m *Manager) untilStaleLocked(now time.Time) (time.Duration, bool) {
	if m.cfg.MaxAge <= 0 || m.stale || !m.have || (m.db == DBConnected && m.source == SourceDB) {
		return 0, false
	}
	// stale means age > MaxAge: the deadline lies just past it.
	return max(m.verifiedAt.Add(m.cfg.MaxAge+1).Sub(now), 0), true
}

// reload loads from the source and applies the result.
func (m *Manager) reload(ctx context.Context) error {
	lctx, cancel := context.WithTimeout(ctx, m.cfg.LoadTimeout)
	snap, err := m.cfg.Source.Load(lctx, m.cfg.Node)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			m.metrics.loadErrors.Inc()
			m.setDisconnected(err)
		}
		return err
	}
	m.apply(snap)
	return nil
}

// setDisconnected records a failed load or a lost connection; it logs only
// when the state changes.
func (m *Manager) setDisconnected(err error) {
	m.mu.Lock()
	was := m.db
	m.db = DBDisconnected
	m.lastErr = err.Error()
	since := m.verifiedAt
	m.mu.Unlock()
	m.metrics.dbUp.Set(0)
	select { // the bindings age from now: the run loop sets its age timer
	case m.aging <- struct{}{}:
	default:
	}
	if was == DBConnected {
		m.log.Warn("lost the mesh database; bindings now age", "err", err, "confirmed_at", since)
	}
}

// apply stores a snapshot just loaded from the database, then installs
// it. Only one goroutine applies at a time (Start, then run).
func (m *Manager) apply(snap Snapshot) {
	now := time.Now()
	m.mu.Lock()
	prev, had, prevSource, wasDB := m.cur, m.have, m.source, m.db
	m.mu.Unlock()
	action := chooseReload(prev, had, snap)
	var storeErr error
	if action != reloadUnchanged || wasDB != DBConnected || prevSource != SourceDB {
		storeErr = m.putSnapshot(snap)
	}

	m.mu.Lock()
	m.db = DBConnected
	m.lastErr = ""
	if storeErr != nil {
		m.lastErr = storeErr.Error()
	}
	m.verifiedAt = snap.FetchedAt
	m.source = SourceDB
	if action != reloadApply {
		m.cur.Revision, m.cur.FetchedAt, m.cur.Source = snap.Revision, snap.FetchedAt, snap.Source
		m.mu.Unlock()
		m.metrics.applied(snap, SourceDB, true)
		if wasDB != DBConnected || prevSource != SourceDB {
			m.log.Info("mesh database reachable; bindings unchanged", "snapshot", snap)
		}
		return
	}
	// A live change, or a divergence found when the database came back.
	reconnect := prevSource != SourceDB || wasDB != DBConnected
	d := Diff(prev.Bindings, snap.Bindings)
	if had {
		m.report = &DivergenceReport{At: now, FromRevision: prev.Revision, ToRevision: snap.Revision,
			FromSource: prevSource, OnReconnect: reconnect, Summary: d.Summary(), Changes: d}
	}
	m.cur, m.have = snap, true
	listeners := slices.Clone(m.listeners)
	m.mu.Unlock()

	m.metrics.applied(snap, SourceDB, true)
	m.metrics.changes.Inc()
	switch {
	case !had:
		m.log.Info("bindings loaded from the database", "snapshot", snap, "bindings", snap.Bindings)
	case reconnect:
		m.metrics.divergences.Inc()
		m.log.Warn("mesh database reachable again and ahead of the bindings in use; applying",
			"from_revision", prev.Revision, "to_revision", snap.Revision, "divergence", d)
	default:
		m.log.Info("bindings changed; applying",
			"from_revision", prev.Revision, "to_revision", snap.Revision, "divergence", d)
	}
	for _, fn := range listeners {
		fn(snap, d)
	}
}

// putSnapshot writes snap to the cache; a failure is counted, logged and
// returned for the status.
func (m *Manager) putSnapshot(snap Snapshot) error {
	err := m.cfg.Store.Put(snap)
	if err != nil {
		m.metrics.cacheErrors.Inc()
		m.log.Error("could not write bindings to the cache", "err", err)
	}
	return err
}

// storeSnapshot writes snap to the cache; a failure is logged and shown.
func (m *Manager) storeSnapshot(snap Snapshot) {
	if err := m.cfg.Store.Put(snap); err != nil {
		m.metrics.cacheErrors.Inc()
		m.mu.Lock()
		m.lastErr = err.Error()
		m.mu.Unlock()
		m.log.Error("could not write bindings to the cache", "err", err)
	}
}

// ageLocked is how long the bindings in use have gone unconfirmed.
// Caller holds mu.
func (m *Manager) ageLocked(now time.Time) time.Duration {
	if !m.have || (m.db == DBConnected && m.source == SourceDB) {
		return 0
	}
	return max(now.Sub(m.verifiedAt), 0)
}

func (m *Manager) checkAge() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.checkAgeLocked(time.Now())
}

// checkAgeLocked updates the max-age warning and logs its transitions.
// Caller holds mu.
func (m *Manager) checkAgeLocked(now time.Time) {
	if m.cfg.MaxAge <= 0 {
		return
	}
	age := m.ageLocked(now)
	stale := age > m.cfg.MaxAge
	if stale == m.stale {
		return
	}
	m.stale = stale
	if stale {
		m.log.Warn("bindings older than the configured maximum age", "age", age.Round(time.Second),
			"max_age", m.cfg.MaxAge, "source", m.source, "db", m.db)
	} else {
		m.log.Info("bindings within the maximum age again", "source", m.source)
	}
}

// warningLocked composes Status.Warning. Caller holds mu.
func (m *Manager) warningLocked(now time.Time) string {
	var w []string
	if !m.have {
		w = append(w, "no bindings: neither the mesh database nor the cache could provide them")
	} else {
		if m.stale {
			w = append(w, fmt.Sprintf("bindings are %s old, more than the maximum age %s",
				m.ageLocked(now).Round(time.Second), m.cfg.MaxAge))
		}
		if _, ok := m.cur.Bindings.NodeRecord(m.cfg.Node); !ok {
			w = append(w, fmt.Sprintf("node %q has no record in the mesh database", m.cfg.Node))
		}
	}
	return strings.Join(w, "; ")
}

// managerMetrics are the Manager's Prometheus collectors.
type managerMetrics struct {
	revision    prometheus.Gauge
	age         prometheus.GaugeFunc
	source      *prometheus.GaugeVec
	dbUp        prometheus.Gauge
	stale       prometheus.GaugeFunc
	divergences prometheus.Counter
	changes     prometheus.Counter
	loadErrors  prometheus.Counter
	cacheErrors prometheus.Counter
	quarantined prometheus.Counter
}

func newManagerMetrics(m *Manager) *managerMetrics {
	return &managerMetrics{
		revision: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meshbox_bindings_revision",
			Help: "Mesh revision of the bindings in use (0 = none)."}),
		age: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "meshbox_bindings_age_seconds",
			Help: "Seconds since the database last confirmed the bindings in use (0 while connected)."},
			func() float64 {
				m.mu.Lock()
				defer m.mu.Unlock()
				return m.ageLocked(time.Now()).Seconds()
			}),
		source: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meshbox_bindings_source",
			Help: "1 for the source of the bindings in use (db, cache, none)."}, []string{"source"}),
		dbUp: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meshbox_bindings_db_up",
			Help: "1 while the mesh database answers."}),
		stale: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "meshbox_bindings_stale",
			Help: "1 while the bindings are older than the configured maximum age."},
			func() float64 {
				m.mu.Lock()
				defer m.mu.Unlock()
				if m.cfg.MaxAge > 0 && m.ageLocked(time.Now()) > m.cfg.MaxAge {
					return 1
				}
				return 0
			}),
		divergences: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshbox_bindings_divergences_total",
			Help: "Times the database was found to differ from cached bindings on (re)connect."}),
		changes: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshbox_bindings_changes_total",
			Help: "Changes of the bindings applied while running."}),
		loadErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshbox_bindings_load_errors_total",
			Help: "Failed loads from the mesh database."}),
		cacheErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshbox_cache_write_errors_total",
			Help: "Failed writes to the bindings cache."}),
		quarantined: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshbox_cache_quarantined_total",
			Help: "Damaged cache files set aside."}),
	}
}

func (mm *managerMetrics) register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{mm.revision, mm.age, mm.source, mm.dbUp, mm.stale,
		mm.divergences, mm.changes, mm.loadErrors, mm.cacheErrors, mm.quarantined} {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// applied records the bindings in use.
func (mm *managerMetrics) applied(snap Snapshot, source string, dbUp bool) {
	mm.revision.Set(float64(snap.Revision))
	for _, s := range []string{SourceDB, SourceCache, SourceNone} {
		v := 0.0
		if s == source {
			v = 1
		}
		mm.source.WithLabelValues(s).Set(v)
	}
	if dbUp {
		mm.dbUp.Set(1)
	} else {
		mm.dbUp.Set(0)
	}
}
