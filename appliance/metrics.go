package appliance

import (
	"github.com/prometheus/client_golang/prometheus"
)

// The appliance's own metrics. The components (cache, bridge, node) register
// theirs through the Metrics field of their configs; the README lists them all.
var (
	descUp = prometheus.NewDesc("meshbox_up",
		"1 while the node's process is running and serving metrics.", nil, nil)
	descBuildInfo = prometheus.NewDesc("meshbox_build_info",
		"Always 1; the labels say which build of meshbox runs.", []string{"version", "commit", "goversion", "arch"}, nil)
	descLogged = prometheus.NewDesc("meshbox_log_messages_total",
		"Warnings and errors the node logged (lower levels are not counted), by level and component; the last ones are in the status.",
		[]string{"level", "component"}, nil)
)

// loggedKey counts log records by level and component.
type loggedKey struct{ level, component string }

// nodeCollector exports the appliance's own metrics. It reads the error
// ring at scrape time, so the counts and the status never disagree.
type nodeCollector struct {
	ring  *errorRing
	build BuildInfo
}

// newNodeCollector returns the collector of the appliance's own metrics.
func newNodeCollector(ring *errorRing) *nodeCollector {
	return &nodeCollector{ring: ring, build: Build()}
}

// Describe implements prometheus.Collector.
func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descUp
	ch <- descBuildInfo
	ch <- descLogged
}

// Collect implements prometheus.Collector.
func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, 1)
	ch <- prometheus.MustNewConstMetric(descBuildInfo, prometheus.GaugeValue, 1, c.build.Version, c.build.Commit, c.build.Go, c.build.Arch)
	for k, n := range c.ring.loggedCounts() {
		ch <- prometheus.MustNewConstMetric(descLogged, prometheus.CounterValue, float64(n), k.level, k.component)
	}
}

// loggedCounts returns how many warnings and errors were added, by level and
// component, since the ring was made.
func (r *errorRing) loggedCounts() map[loggedKey]uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[loggedKey]uint64, len(r.logged))
	for k, n := range r.logged {
		out[k] = n
	}
	return out
}
