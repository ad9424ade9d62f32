package appliance

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// handler serves the node's HTTP endpoints:
//
//	/healthz  the process is alive (always 200 while it serves)
//	/readyz   ready to serve local programs; 503 with the reasons when not
//	/status   the status as JSON
//	/trends   the node's recent history as JSON, for the status page's charts
//	/metrics  Prometheus metrics
//	/debug/pprof/  Go's profiles, with Config.Pprof (loopback listeners only)
func (a *Appliance) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		rd := a.Readiness()
		code := http.StatusOK
		if !rd.Ready {
			code = http.StatusServiceUnavailable
		}
		writeJSON(w, code, rd)
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, a.Status())
	})
	mux.HandleFunc("GET /trends", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, a.tel.trends.view(trendEvery))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.tel.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /{$}", a.serveStatusPage)
	if a.cfg.Pprof { // Validate allows it on a loopback listener only
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// Readiness says whether the node serves local programs, and why not. A
// degraded node (on cached bindings, broker offline) is ready: offline local
// operation is a feature. Degraded lists what is not at its best, each
// with its cause (the status's problems first).
type Readiness struct {
	Ready    bool     `json:"ready"`
	Reasons  []string `json:"reasons"`
	Degraded []string `json:"degraded"`
}

// Readiness returns the node's readiness now. Like Status it never waits on
// Start or Close.
func (a *Appliance) Readiness() Readiness {
	rd := Readiness{Ready: true, Reasons: []string{}, Degraded: []string{}}
	notReady := func(reason string) {
		rd.Ready = false
		rd.Reasons = append(rd.Reasons, reason)
	}
	switch a.phase.Load() {
	case phaseNew:
		notReady("node is not started")
	case phaseStarting:
		notReady("node is starting")
	case phaseStopping, phaseStopped:
		notReady("node is stopping")
	}
	r := a.parts()
	if n := r.nats; n == nil || !n.Running() {
		notReady("embedded NATS server is not running")
	}
	rd.Degraded = append(rd.Degraded, a.Status().Problems...)
	if sup := r.mods; sup != nil {
		rd.Degraded = append(rd.Degraded, modulesDegraded(sup.Status())...)
	}
	if kk := r.keys; kk != nil {
		for _, id := range kk.Status().Lacking {
			rd.Degraded = append(rd.Degraded, "lacks content key "+id+": cannot open messages sealed with it")
		}
	}
	return rd
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the client may have gone
}
