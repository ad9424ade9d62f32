package appliance

import (
	"time"

	"github.com/meshbox/meshbox/cache"
)

// Status is everything the node says about itself: the JSON of GET /status
// and of the $MESH.status request, and what `meshbox status` prints.
type Status struct {
	Node          string         `json:"node"`
	Version       string         `json:"version"`
	Commit        string         `json:"commit,omitempty"`
	StartedAt     time.Time      `json:"started_at"`
	UptimeSeconds float64        `json:"uptime_seconds"`
	NATS          EndpointStatus `json:"nats"`
	HTTP          EndpointStatus `json:"http"`
	Broker        BrokerStatus   `json:"broker"`
	Bindings      cache.Status   `json:"bindings"`
	Errors        []ErrorEntry   `json:"errors"`
}

// EndpointStatus says where a listener is.
type EndpointStatus struct {
	URL string `json:"url"`
}

// BrokerStatus is the state of the link to the broker.
type BrokerStatus struct {
	State string    `json:"state"`
	Since time.Time `json:"since"`
	URL   string    `json:"url,omitempty"`
}

// Status returns the node's status now.
func (a *Appliance) Status() Status {
	a.mu.Lock()
	defer a.mu.Unlock()
	b := Build()
	st := Status{
		Node:          a.cfg.Node,
		Version:       b.Version,
		Commit:        b.Commit,
		StartedAt:     a.startedAt,
		UptimeSeconds: time.Since(a.startedAt).Seconds(),
		HTTP:          EndpointStatus{URL: a.httpURL},
		Broker:        BrokerStatus{State: "none", Since: a.startedAt},
		Errors:        a.errs.recent(),
	}
	if a.natsSrv != nil {
		st.NATS.URL = a.natsSrv.URL()
	}
	if a.bindings != nil {
		st.Bindings = a.bindings.manager.Status()
	} else {
		st.Bindings = cache.Status{Source: "none", DB: "none"}
	}
	return st
}
