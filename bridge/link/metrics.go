package link

import (
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the broker link's collectors: its state, its sessions after
// the first, its TCP connects, the broker's blocks of the publishing
// connection and its refusal of the credential. The bridge registers
// them (Collectors) with its own.
type Metrics struct {
	state      *prometheus.GaugeVec
	reconnects prometheus.Counter
	// dials counts the TCP connects of the link, by result (dialConnected,
	// dialFailed): a session's two connections, the probes of an
	// unreachable broker (probe.go) and the extra connections.
	dials   *prometheus.CounterVec
	blocks  prometheus.Counter
	revoked prometheus.Gauge
	// eventBindings is the number of keys the event queue is bound with;
	// eventBindFailures counts the failures to bind it, by cause
	// (EventBindRefused, EventBindBroker, EventBindRecord).
	eventBindings     prometheus.Gauge
	eventBindFailures *prometheus.CounterVec
	// eventsKept counts the events of local programs no other node
	// listens to, not sent to the broker (EventBinder.KeepLocal).
	eventsKept prometheus.Counter
}

// Results in meshbox_broker_dials_total{result}.
const (
	dialConnected = "connected"
	dialFailed    = "failed"
)

var allStates = []string{wire.StateNone, wire.StateConnecting, wire.StateConnected, wire.StateOffline, wire.StateBlocked}

// NewMetrics returns the link's collectors, not registered.
func NewMetrics() *Metrics {
	m := &Metrics{
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshbox_broker_state", Help: "1 for the broker link's current state, 0 for the others.",
		}, []string{"state"}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshbox_broker_reconnects_total", Help: "Connections to the broker after the first.",
		}),
		dials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshbox_broker_dials_total",
			Help: "TCP connects to the broker, by result (connected, failed): two per session, one per probe while the broker is unreachable, and one per extra connection (the tables of rows').",
		}, []string{"result"}),
		blocks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshbox_broker_blocked_total",
			Help: "Times the broker blocked this node's publishing connection (resource alarm); consuming goes on.",
		}),
		revoked: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshbox_broker_credential_revoked",
			Help: "1 while the broker refuses this node's credential at login (403 ACCESS_REFUSED), else 0.",
		}),
		eventBindings: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshbox_broker_event_bindings",
			Help: "Keys the node's event queue is bound with: the lanes of the other nodes for each topic pattern local programs listen to (and the shared keys while an older node may publish).",
		}),
		eventBindFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshbox_broker_event_bind_failures_total",
			Help: "Failures to bind the node's event queue to the events local programs listen to, by cause (refused: the node's broker permissions are an older mesh's and it binds every event; broker: the broker or the connection failed; record: the record of the keys bound could not be written).",
		}, []string{"cause"}),
		eventsKept: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshbox_broker_events_kept_local_total",
			Help: "Events of local programs that no other node of the mesh listens to: their local subscribers have them, and they are not sent to the broker.",
		}),
	}
	for _, c := range []string{EventBindRefused, EventBindBroker, EventBindRecord} {
		m.eventBindFailures.WithLabelValues(c)
	}
	for _, s := range allStates {
		m.state.WithLabelValues(s).Set(0)
	}
	for _, r := range []string{dialConnected, dialFailed} {
		m.dials.WithLabelValues(r)
	}
	return m
}

// Collectors returns the link's collectors, to register.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.state, m.reconnects, m.dials, m.blocks, m.revoked, m.eventBindings, m.eventBindFailures, m.eventsKept}
}

// SetState sets meshbox_broker_state: 1 for state, 0 for the others.
func (m *Metrics) SetState(state string) {
	for _, s := range allStates {
		v := 0.0
		if s == state {
			v = 1
		}
		m.state.WithLabelValues(s).Set(v)
	}
}

// Reconnected counts a session after the first.
func (m *Metrics) Reconnected() { m.reconnects.Inc() }

// Dialed counts a TCP connect of the link that ended with err.
func (m *Metrics) Dialed(err error) {
	r := dialConnected
	if err != nil {
		r = dialFailed
	}
	m.dials.WithLabelValues(r).Inc()
}

// Blocked counts a block of the publishing connection.
func (m *Metrics) Blocked() { m.blocks.Inc() }

// SetRevoked sets meshbox_broker_credential_revoked.
func (m *Metrics) SetRevoked(on bool) {
	v := 0.0
	if on {
		v = 1
	}
	m.revoked.Set(v)
}
