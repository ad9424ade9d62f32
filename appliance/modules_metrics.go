package appliance

import (
	"github.com/meshbox/meshbox/appliance/modules"
	"github.com/prometheus/client_golang/prometheus"
)

// The modules' metrics, read from the supervisor's status at scrape time.
var (
	descModuleUp = prometheus.NewDesc("meshbox_module_up",
		"1 while the assigned module's process runs, else 0.", []string{"module"}, nil)
	descModuleRestarts = prometheus.NewDesc("meshbox_module_restarts_total",
		"Restarts of the assigned module after its process ended by itself, since the node started.", []string{"module"}, nil)
	descModuleState = prometheus.NewDesc("meshbox_module_state",
		"1 for the state the assigned module is in (running, starting, stopping, stopped, crash-looping, failed, not-in-catalog), 0 for the others.",
		[]string{"module", "state"}, nil)
)

var moduleStates = []string{modules.StateRunning, modules.StateStarting, modules.StateStopping, modules.StateStopped,
	modules.StateCrashLooping, modules.StateFailed, modules.StateNotInCatalog}

// modulesCollector exports the modules' metrics; sup returns the running
// supervisor (nil: none, no series).
type modulesCollector struct {
	sup func() *modules.Supervisor
}

func newModulesCollector(sup func() *modules.Supervisor) *modulesCollector {
	return &modulesCollector{sup: sup}
}

// Describe implements prometheus.Collector.
func (c *modulesCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descModuleUp
	ch <- descModuleRestarts
	ch <- descModuleState
}

// Collect implements prometheus.Collector.
func (c *modulesCollector) Collect(ch chan<- prometheus.Metric) {
	sup := c.sup()
	if sup == nil {
		return
	}
	for _, st := range sup.Status() {
		up := 0.0
		if st.State == modules.StateRunning {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(descModuleUp, prometheus.GaugeValue, up, st.Module)
		ch <- prometheus.MustNewConstMetric(descModuleRestarts, prometheus.CounterValue, float64(st.Restarts), st.Module)
		for _, s := range moduleStates {
			v := 0.0
			if s == st.State {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(descModuleState, prometheus.GaugeValue, v, st.Module, s)
		}
	}
}
