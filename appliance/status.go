package appliance

import (
	"fmt"
	"strings"
	"time"

	"github.com/meshbox/meshbox/appliance/localnats"
	"github.com/meshbox/meshbox/appliance/modules"
	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/node"
)

// Status is everything the node says about itself: the JSON of GET /status
// and of the $MESH.status request, and what `meshbox status` prints.
type Status struct {
	Node          string               `json:"node"`
	PublicName    string               `json:"public_name,omitempty"` // of the node's record in the bindings it uses
	Version       string               `json:"version"`
	Commit        string               `json:"commit,omitempty"`
	BuildDate     string               `json:"build_date,omitempty"`
	GoVersion     string               `json:"go_version"`
	Arch          string               `json:"arch"`
	StartedAt     time.Time            `json:"started_at"`
	UptimeSeconds float64              `json:"uptime_seconds"`
	NATS          NATSStatus           `json:"nats"`
	HTTP          EndpointStatus       `json:"http"`
	Broker        bridge.BrokerStatus  `json:"broker"`
	Identity      *IdentityStatus      `json:"identity,omitempty"` // the node's broker user and credential
	Outbox        bridge.OutboxStatus  `json:"outbox"`
	Stalls        []bridge.StallStatus `json:"stalls"`
	// Commands are the commands in flight on this node (bridge.Status).
	Commands []bridge.CommandStatus `json:"commands"`
	// DeadLetters counts the dead letters of each stage hosted here
	// (`meshbox dlq list STAGE` shows them).
	DeadLetters  map[string]int     `json:"dead_letters"`
	Peers        []node.Peer        `json:"peers"`
	Capabilities node.Capabilities  `json:"capabilities"`
	Bindings     cache.Status       `json:"bindings"`
	Modules      []modules.Status   `json:"modules"`
	Keys         *KeysStatus        `json:"keys,omitempty"`  // in a mesh with a database
	Blobs        *BlobsStatus       `json:"blobs,omitempty"` // the blob store, once it runs
	Rows         []rows.TableStatus `json:"rows,omitempty"`  // the mesh's tables of rows, this node's replica of each
	// Restored: the data directory was restored from a backup
	// (meshbox restore); it says how old the backup was.
	Restored *RestoredStatus `json:"restored,omitempty"`
	// Errors are the last warnings and errors the node logged, newest
	// first, at the level it logged them; one about a condition that has
	// ended is gone from them (errorlog.go).
	Errors []ErrorEntry `json:"errors"`
	// Standalone says the node runs on its own: no mesh database and no
	// broker. A mode, not a fault.
	Standalone bool `json:"standalone"`
	// Problems are what keeps the node from its work in its mesh now,
	// each naming its cause and where to fix it (problems.go): the mesh
	// database refusing the node's login, the broker refusing its
	// credential and where that comes from, no broker and why. A problem
	// leaves the list when its cause ends.
	Problems []string `json:"problems"`
	// Warnings are standing conditions an operator should know about: a
	// local NATS server open in a mesh, a link to the broker or the
	// database that is not protected on the network, a broker user with an
	// older mesh's permissions.
	Warnings []string `json:"warnings"`
	// Notes are standing conditions by design, logged at INFO: a
	// standalone node's local NATS server open to every program.
	Notes []string `json:"notes,omitempty"`
}

// NATSStatus says where the embedded NATS server listens and who may
// connect to it.
type NATSStatus struct {
	URL string `json:"url"`
	// WebSocket is the WebSocket listener's URL (ws:// or wss://); empty
	// without one (Config.NATSWebSocket).
	WebSocket string `json:"websocket,omitempty"`
	// MQTT is the MQTT listener's URL (mqtt:// or mqtts://); empty without
	// one (Config.NATSMQTT).
	MQTT string `json:"mqtt,omitempty"`
	// Auth is "credentials" (every client needs one) or "open" (clients
	// without one are let in: a standalone node, or nats_anonymous).
	Auth string `json:"auth,omitempty"`
	// Programs are the local programs with a credential; ProgramErrors the
	// definitions left out, each naming its file.
	Programs      []string `json:"programs"`
	ProgramErrors []string `json:"program_errors,omitempty"`
	// MQTTRefused counts, by program and cause, what the MQTT door
	// refused past a program's limits (meshbox_mqtt_refused_total).
	MQTTRefused MQTTProgramStatus `json:"mqtt_refused,omitempty"`
	// MQTTAcceptErrors counts, by cause, the MQTT listener's failed
	// accepts of devices' connections (meshbox_mqtt_accept_errors_total).
	MQTTAcceptErrors map[string]uint64 `json:"mqtt_accept_errors,omitempty"`
}

// EndpointStatus says where a listener is.
type EndpointStatus struct {
	URL string `json:"url"`
}

// Status returns the node's status now. It never waits on Start or Close:
// it reads what they have published.
func (a *Appliance) Status() Status {
	r := a.parts()
	startedAt := r.startedAt
	b := Build()
	st := Status{
		Node:          a.cfg.Node,
		Version:       b.Version,
		Commit:        b.Commit,
		BuildDate:     b.Date,
		GoVersion:     b.Go,
		Arch:          b.Arch,
		StartedAt:     startedAt,
		UptimeSeconds: time.Since(startedAt).Seconds(),
		HTTP:          EndpointStatus{URL: a.HTTPURL()},
		Broker:        bridge.BrokerStatus{LinkStatus: bridge.LinkStatus{State: bridge.StateNone, Since: startedAt, History: []bridge.StateChange{}}},
		Stalls:        []bridge.StallStatus{},
		Commands:      []bridge.CommandStatus{},
		DeadLetters:   map[string]int{},
		Errors:        a.tel.errs.recent(),
		Restored:      a.snaps.restored.Load(),
	}
	st.NATS.URL = a.NATSURL()
	st.NATS.Programs = []string{}
	st.Warnings = a.transportWarnings()
	if n := r.nats; n != nil {
		st.NATS.Auth = n.AuthMode()
		st.NATS.WebSocket, st.NATS.MQTT = n.WebSocketURL(), n.MQTTURL()
		if n.MQTTPlain() {
			st.Warnings = append(st.Warnings, fmt.Sprintf(localnats.WarnMQTTPlain, strings.TrimPrefix(n.MQTTURL(), "mqtt://")))
		}
		rep := n.Programs()
		st.NATS.Programs, st.NATS.ProgramErrors = rep.Programs, rep.Errors
		if r := n.MQTTRefusals(); len(r) > 0 {
			st.NATS.MQTTRefused = r
		}
		if e := n.MQTTAcceptErrors(); len(e) > 0 {
			st.NATS.MQTTAcceptErrors = e
		}
		if n.Anonymous() && a.cfg.InMesh() {
			st.Warnings = append(st.Warnings, localnats.WarnOpen)
		} else if n.Anonymous() {
			st.Notes = append(st.Notes, localnats.WarnOpen) // what a standalone node is
		}
	}
	if b := r.bridge; b != nil {
		bs := b.Status()
		st.Broker, st.Outbox, st.Stalls, st.Commands = bs.Broker, bs.Outbox, bs.Stalls, bs.Commands
		st.Warnings = append(st.Warnings, bs.Warnings...)
		if bs.DeadLetters != nil {
			st.DeadLetters = bs.DeadLetters
		}
	}
	if n := r.node; n != nil {
		ns := n.Status()
		st.Peers, st.Capabilities = ns.Peers, ns.Capabilities
	}
	if st.Peers == nil {
		st.Peers = []node.Peer{}
	}
	st.Blobs = a.blobsStatus()
	st.Rows = a.RowsStatus()
	st.Modules = []modules.Status{}
	if sup := r.mods; sup != nil {
		st.Modules = sup.Status()
	}
	if kk := r.keys; kk != nil {
		ks := kk.Status()
		st.Keys = &ks
	}
	if bd := r.bindings; bd != nil {
		st.Bindings = bd.manager.Status()
		var newest *cache.BrokerCredential
		if snap, ok := bd.manager.Current(); ok {
			newest = snap.Bindings.Broker
			if rec, ok := snap.Bindings.NodeRecord(a.cfg.Node); ok {
				st.PublicName = rec.PublicName
			}
		}
		st.Identity = identity(st.Broker.Credential, newest, time.Now())
		if b := r.bridge; b != nil && st.Identity != nil {
			st.Identity.Peers = b.PeerGenerations()
		}
	} else {
		st.Bindings = cache.Status{Source: "none", DB: "none"}
	}
	st.Standalone = st.Broker.State == bridge.StateNone && !a.cfg.InMesh()
	if st.Broker.State == bridge.StateNone && !st.Standalone {
		st.Broker.Reason = a.noBrokerReason(st.Bindings) // not "no broker configured": one is, and this is why there is none yet
	}
	st.Problems = a.problems(st)
	return st
}
