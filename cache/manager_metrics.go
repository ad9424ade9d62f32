package cache

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The bindings manager's metrics.

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
	// revisionChecks counts reloads that read the revision alone and found
	// the bindings current (RevisionSource).
	revisionChecks prometheus.Counter
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
		revisionChecks: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshbox_bindings_revision_checks_total",
			Help: "Reloads skipped because the mesh revision alone showed the bindings current."}),
	}
}

func (mm *managerMetrics) register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{mm.revision, mm.age, mm.source, mm.dbUp, mm.stale,
		mm.divergences, mm.changes, mm.loadErrors, mm.cacheErrors, mm.quarantined, mm.revisionChecks} {
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
