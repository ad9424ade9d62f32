package appliance

import (
	"sync"
	"time"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/node"
)

// This file is the node's recent history for the status page's charts
// (GET /trends): a bounded ring in memory of samples of the node's own
// status, taken by one goroutine. Nothing is stored on disk; a restart
// starts a new history.

// trendEvery is how often the node samples its status, and trendSamples
// how many samples it keeps: the last 30 minutes.
const (
	trendEvery   = 5 * time.Second
	trendSamples = 360
)

// Trends is the node's recent history, one sample every EverySeconds,
// oldest first, as columns: index i of each slice is sample i. Rates are
// per second since the sample before (0 for the first).
type Trends struct {
	EverySeconds float64 `json:"every_seconds"`
	// At is when each sample was taken, in Unix milliseconds.
	At []int64 `json:"at"`
	// Outbox is the messages in the outbox.
	Outbox []int64 `json:"outbox"`
	// Requests, Commands and Events are the messages of each shape the
	// bridge carried to and from the broker per second.
	Requests []float64 `json:"requests_per_second"`
	Commands []float64 `json:"commands_per_second"`
	Events   []float64 `json:"events_per_second"`
	// RowsPending is the local writes to tables of rows the broker has
	// not confirmed, over every table.
	RowsPending []int `json:"rows_pending"`
	// PeersUp is the peers heard from within the heartbeat window.
	PeersUp []int `json:"peers_up"`
	// Broker is the broker link's state.
	Broker []string `json:"broker"`
}

// trendSample is one sample: what the status said, and the messages the
// bridge carried so far (requests, commands, events; Bridge.Carried) that
// rates are taken from.
type trendSample struct {
	at          time.Time
	outbox      int64
	rowsPending int
	peersUp     int
	broker      string
	carried     [3]float64
	rates       [3]float64 // set by add
}

// trendRing keeps the last max samples. mu guards samples.
type trendRing struct {
	mu      sync.Mutex
	max     int
	samples []trendSample // oldest first, at most max
}

func newTrendRing(max int) *trendRing { return &trendRing{max: max} }

// add appends s, with its rates since the sample before; a counter that
// went back (it cannot, but a rate is never negative) counts as none.
func (r *trendRing) add(s trendSample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := len(r.samples); n > 0 {
		prev := r.samples[n-1]
		if secs := s.at.Sub(prev.at).Seconds(); secs > 0 {
			for i := range s.carried {
				s.rates[i] = max(0, s.carried[i]-prev.carried[i]) / secs
			}
		}
	}
	if len(r.samples) == r.max {
		copy(r.samples, r.samples[1:])
		r.samples = r.samples[:r.max-1]
	}
	r.samples = append(r.samples, s)
}

// view returns the samples as Trends.
func (r *trendRing) view(every time.Duration) Trends {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(r.samples)
	t := Trends{EverySeconds: every.Seconds(), At: make([]int64, n), Outbox: make([]int64, n),
		Requests: make([]float64, n), Commands: make([]float64, n), Events: make([]float64, n),
		RowsPending: make([]int, n), PeersUp: make([]int, n), Broker: make([]string, n)}
	for i, s := range r.samples {
		t.At[i], t.Outbox[i], t.RowsPending[i], t.PeersUp[i], t.Broker[i] = s.at.UnixMilli(), s.outbox, s.rowsPending, s.peersUp, s.broker
		t.Requests[i], t.Commands[i], t.Events[i] = s.rates[0], s.rates[1], s.rates[2]
	}
	return t
}

// sampleOf takes a sample of the status st at now, with the messages b
// carried so far (b may be nil).
func sampleOf(st Status, b *bridge.Bridge, now time.Time) trendSample {
	s := trendSample{at: now, outbox: st.Outbox.Depth, broker: st.Broker.State}
	if b != nil {
		s.carried[0], s.carried[1], s.carried[2] = b.Carried()
	}
	for _, t := range st.Rows {
		s.rowsPending += t.Pending
	}
	for _, p := range st.Peers {
		if p.State == node.StateUp {
			s.peersUp++
		}
	}
	return s
}

// runTrends samples the node's status now and every trendEvery into
// a.tel.trends. It exits when the appliance closes.
func (a *Appliance) runTrends() {
	defer a.wg.Done()
	t := time.NewTicker(trendEvery)
	defer t.Stop()
	for {
		a.tel.trends.add(sampleOf(a.Status(), a.parts().bridge, time.Now()))
		select {
		case <-a.quit:
			return
		case <-t.C:
		}
	}
}
