package node

import "github.com/prometheus/client_golang/prometheus"

// metrics are the node's Prometheus metrics.
type metrics struct {
	peers    *prometheus.GaugeVec   // state
	caps     *prometheus.GaugeVec   // where
	messages *prometheus.CounterVec // type, direction
	rejected *prometheus.CounterVec // reason
	errors   *prometheus.CounterVec // op
}

func newMetrics() *metrics {
	m := &metrics{
		peers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshbox_peers",
			Help: "Peers in the node's mesh view, by state (up, gone, expected-but-absent).",
		}, []string{"state"}),
		caps: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshbox_capabilities",
			Help: "Capabilities hosted locally and, distinct, by live peers.",
		}, []string{"where"}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshbox_discovery_messages_total",
			Help: "Discovery messages sent (out) and accepted (in), by type.",
		}, []string{"type", "direction"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshbox_discovery_rejected_total",
			Help: "Discovery messages received and dropped, by reason.",
		}, []string{"reason"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshbox_discovery_errors_total",
			Help: "Failed discovery operations: publish (a message could not be sent).",
		}, []string{"op"}),
	}
	for _, s := range []string{StateUp, StateGone, StateAbsent} {
		m.peers.WithLabelValues(s)
	}
	for _, w := range []string{"local", "remote"} {
		m.caps.WithLabelValues(w)
	}
	for _, op := range []string{"publish"} {
		m.errors.WithLabelValues(op)
	}
	return m
}

// register registers the metrics on reg; a nil reg registers nothing.
func (m *metrics) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{m.peers, m.caps, m.messages, m.rejected, m.errors} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
