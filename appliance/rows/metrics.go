package rows

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	writes    prometheus.Counter
	applied   prometheus.Counter
	published prometheus.Counter
	snapshots prometheus.Counter
	refused   *prometheus.CounterVec
	errors    *prometheus.CounterVec
	gauges    []prometheus.Collector
	reg       prometheus.Registerer
	done      []prometheus.Collector
}

func newMetrics(e *Engine) *metrics {
	m := &metrics{
		writes: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshbox_rows_writes_total",
			Help: "Row writes of this node (puts and deletes), each committed on its disk before it was acknowledged."}),
		applied: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshbox_rows_applied_total",
			Help: "Field versions read from the tables' logs that replaced the version this node held."}),
		published: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshbox_rows_published_total",
			Help: "Local row writes the broker confirmed into a table's log."}),
		snapshots: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshbox_rows_snapshots_total",
			Help: "Snapshots of a table this node wrote into its log (compaction)."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshbox_rows_refused_total",
			Help: "Changes of a table's log this node did not apply, by table and cause (unopened: sealed with a key it lacks or tampered; wrong_scope: sealed with a key of another scope than the table's; forged_writer: naming another writer than its publisher; future: stamped too far ahead of its clock, held on disk until its clock reaches it; far_future: more than a day ahead, dropped; over_bound: held changes past their bound, dropped; snapshot_disagrees: the snapshot this node joined from lacked changes of the log before it)."},
			[]string{"table", "cause"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshbox_rows_errors_total",
			Help: "Failures of the rows engine, by kind (store, broker, no_key, no_log, reply_refused, read_only: a write of the API to a table the node alone writes)."}, []string{"kind"}),
	}
	status := func(f func(TableStatus) float64) func() float64 {
		return func() float64 {
			var n float64
			for _, t := range e.Status() {
				n += f(t)
			}
			return n
		}
	}
	m.gauges = []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "meshbox_rows_pending",
			Help: "Local row writes not yet confirmed by the broker, all tables."}, status(func(t TableStatus) float64 { return float64(t.Pending) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "meshbox_rows_tables_alarmed",
			Help: "Tables with a refused change (status rows[].alarm): this replica may differ from the others."}, status(func(t TableStatus) float64 {
			if t.Alarm != "" {
				return 1
			}
			return 0
		})),
	}
	return m
}

func (m *metrics) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	m.reg = reg
	for _, c := range append([]prometheus.Collector{m.writes, m.applied, m.published, m.snapshots, m.refused, m.errors}, m.gauges...) {
		if err := reg.Register(c); err != nil {
			m.unregister()
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return errors.New("register metrics: meshbox_rows_ metrics are already registered")
			}
			return err
		}
		m.done = append(m.done, c)
	}
	return nil
}

func (m *metrics) unregister() {
	for _, c := range m.done {
		m.reg.Unregister(c)
	}
	m.done = nil
}
