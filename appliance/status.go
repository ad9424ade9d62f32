package appliance

import (
	"time"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/node"
)

// Status is everything the node says about itself: the JSON of GET /status
// and of the $MESH.status request, and what `meshbox status` prints.
type Status struct {
	Node          string               `json:"node"`
	Version       string               `json:"version"`
	Commit        string               `json:"commit,omitempty"`
	StartedAt     time.Time            `json:"started_at"`
	UptimeSeconds float64              `json:"uptime_seconds"`
	NATS          EndpointStatus       `json:"nats"`
	HTTP          EndpointStatus       `json:"http"`
	Broker        bridge.BrokerStatus  `json:"broker"`
	Outbox        bridge.OutboxStatus  `json:"outbox"`
	Stalls        []bridge.StallStatus `json:"stalls"`
	Peers         []node.Peer          `json:"peers"`
	Capabilities  node.Capabilities    `json:"capabilities"`
	Bindings      cache.Status         `json:"bindings"`
	Errors        []ErrorEntry         `json:"errors"`
}

// EndpointStatus says where a listener is.
type EndpointStatus struct {
	URL string `json:"url"`
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
		Broker:        bridge.BrokerStatus{State: bridge.StateNone, Since: a.startedAt, History: []bridge.StateChange{}},
		Stalls:        []bridge.StallStatus{},
		Errors:        a.errs.recent(),
	}
	if a.natsSrv != nil {
		st.NATS.URL = a.natsSrv.URL()
	}
	if b := a.bridge.Load(); b != nil {
		bs := b.Status()
		st.Broker, st.Outbox, st.Stalls = bs.Broker, bs.Outbox, bs.Stalls
	}
	if n := a.node.Load(); n != nil {
		ns := n.Status()
		st.Peers, st.Capabilities = ns.Peers, ns.Capabilities
	}
	if st.Peers == nil {
		st.Peers = []node.Peer{}
	}
	if a.bindings != nil {
		st.Bindings = a.bindings.manager.Status()
	} else {
		st.Bindings = cache.Status{Source: "none", DB: "none"}
	}
	return st
}
