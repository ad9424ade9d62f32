package cache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Database connection states shown in Status.DB.
const (
	DBConnected    = "connected"
	DBDisconnected = "disconnected"
	DBNone         = "none" // no database configured
)

// Defaults for ManagerConfig.
const (
	// DefaultLoadTimeout is below 2 s so that, with a database that drops
	// packets rather than refusing, the node is still ready from its cache
	// within 2 s.
	DefaultLoadTimeout = 1500 * time.Millisecond
	// DefaultReloadTimeout bounds a load nothing waits on: a connect, TLS
	// and a dozen statements over a home link at 80 ms take over a second.
	DefaultReloadTimeout = 15 * time.Second
	DefaultRetryInterval = 5 * time.Second
	// DefaultMaxAge is the age of the bindings in use past which a node
	// warns (MaxAge; the manager itself warns only when it is set).
	DefaultMaxAge           = 24 * time.Hour
	DefaultMaxRetryInterval = 30 * time.Second
	DefaultRefreshInterval  = time.Minute
	DefaultMaxNotifyDelay   = time.Second
	// NotifyDelayPerNode is how much of the spread after a notification
	// each node record of the mesh adds (see ManagerConfig.MaxNotifyDelay).
	NotifyDelayPerNode = time.Millisecond
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

// RevisionSource is a Source that can read the mesh revision alone, far
// more cheaply than a Load. The Manager uses it, when the Source has it,
// to skip a Load that would find the revision it already runs: a
// notification it already caught up with, a reconnect of the listening
// connection, the periodic refresh.
type RevisionSource interface {
	Source
	// Revision returns the mesh revision. It honours ctx's deadline.
	Revision(ctx context.Context) (int64, error)
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
	// LoadTimeout bounds how long Start waits for the first load from
	// Source before it starts from the cache (default 1.5s); the load goes
	// on in the background up to ReloadTimeout.
	LoadTimeout time.Duration
	// ReloadTimeout bounds each load from Source that nothing waits on:
	// the first one past LoadTimeout, and every reload (default 15s).
	ReloadTimeout time.Duration
	// RetryInterval is the first wait after a failed load; it doubles up to
	// MaxRetryInterval (defaults 1s and 30s).
	RetryInterval    time.Duration
	MaxRetryInterval time.Duration
	// RefreshInterval is how often bindings are re-read while connected, a
	// safety net under notifications (default 1m, less up to a fifth at
	// random, so nodes do not refresh in step; with a RevisionSource a
	// refresh that finds the revision unchanged reads one row).
	RefreshInterval time.Duration
	// MaxNotifyDelay bounds the random wait between a change notification
	// and the reload it causes (default 1s). Every node of the mesh is
	// notified of the same change at once; waiting a random part of
	// NotifyDelayPerNode × the node records in the bindings, but at most
	// this, spreads their reloads, so a small mesh still reloads within
	// milliseconds and 1,000 nodes spread over a second. Negative: never
	// wait.
	MaxNotifyDelay time.Duration
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
	newer      string // the last load's ErrSourceNewer error, "" once a load succeeds
	stale      bool   // age beyond MaxAge, logged once per transition
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
		{"reload timeout", &cfg.ReloadTimeout, DefaultReloadTimeout},
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
	switch {
	case cfg.MaxNotifyDelay == 0:
		cfg.MaxNotifyDelay = DefaultMaxNotifyDelay
	case cfg.MaxNotifyDelay < 0:
		cfg.MaxNotifyDelay = 0
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

	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m.cancel = cancel
	var live Snapshot
	liveErr := errNoSource
	// The first load gets ReloadTimeout, but start waits for it only
	// LoadTimeout: a database that is slow to answer (a loaded machine, a
	// far link) delays neither readiness nor the bindings, which the
	// manager applies the moment the load ends (run takes it over).
	var pending chan loadResult
	if m.cfg.Source != nil {
		pending = make(chan loadResult, 1)
		lctx, lcancel := context.WithTimeout(runCtx, m.cfg.ReloadTimeout)
		go func() { // ends within ReloadTimeout, or when Close cancels runCtx
			defer lcancel()
			snap, err := m.cfg.Source.Load(lctx, m.cfg.Node)
			pending <- loadResult{snap, err}
		}()
		wait := time.NewTimer(m.cfg.LoadTimeout)
		select {
		case r := <-pending:
			live, liveErr, pending = r.snap, r.err, nil
		case <-wait.C:
			liveErr = fmt.Errorf("%w: the mesh database did not answer within %s (cache.load_timeout); still loading in the background", ErrStillLoading, m.cfg.LoadTimeout)
		case <-ctx.Done():
			liveErr = fmt.Errorf("start bindings: %w", ctx.Err())
		}
		wait.Stop()
	}
	cached, cachedErr := m.cfg.Store.Latest()
	choice := chooseStart(m.cfg.Node, live, liveErr, cached, cachedErr)
	m.startWith(choice, liveErr, cached, cachedErr)

	if m.cfg.Source != nil {
		m.wg.Add(2)
		go func() { // exits when Close cancels runCtx
			defer m.wg.Done()
			m.watch(runCtx)
		}()
		go func() { // exits when Close cancels runCtx
			defer m.wg.Done()
			m.run(runCtx, liveErr != nil, pending)
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

// Refresh asks for the bindings to be read again now, as a change
// notification does (a reload under way takes it as one more). It does
// not wait. Without a Source it does nothing.
func (m *Manager) Refresh() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
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

// ErrStillLoading is the start error when the first load missed
// LoadTimeout and goes on in the background.
var ErrStillLoading = errors.New("still loading")

// loadResult is the outcome of one load from Source.
type loadResult struct {
	snap Snapshot
	err  error
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
			m.noteNewerLocked(liveErr)
		}
		m.mu.Unlock()
		m.metrics.applied(c.snap, SourceCache, false)
		if liveErr == errNoSource {
			m.log.Info("no mesh database configured; using cached bindings",
				"snapshot", c.snap, "age", now.Sub(c.snap.FetchedAt).Round(time.Second))
		} else if !errors.Is(liveErr, ErrSourceNewer) { // that one was logged by noteNewerLocked
			m.log.Warn("cannot load the bindings from the mesh database at start; using cached bindings",
				"err", liveErr, "snapshot", c.snap, "age", now.Sub(c.snap.FetchedAt).Round(time.Second))
		}
	default:
		if liveErr != errNoSource {
			m.lastErr = liveErr.Error()
			m.noteNewerLocked(liveErr)
		}
		m.mu.Unlock()
		m.metrics.applied(Snapshot{}, SourceNone, false)
		if liveErr == errNoSource {
			m.log.Info("no mesh database configured and no cached bindings; running without bindings", "cache", c.reason)
		} else {
			m.log.Warn("cannot load the bindings from the mesh database at start and no usable cache; running without bindings",
				"err", liveErr, "cache", c.reason)
		}
	}
}
