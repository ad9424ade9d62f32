package appliance

import (
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshbox/meshbox/appliance/localnats"
	"github.com/meshbox/meshbox/internal/wire"
)

// The appliance's side of the MQTT door's bounds (localnats, mqttdoor.go):
// the admin's requests to list and clear a program's MQTT state, and the
// refusals' metric.

// SubjectProgramMQTT asks the node for a program's MQTT state, or to
// clear it: a ProgramMQTTRequest, answered with a ProgramMQTTReply.
const SubjectProgramMQTT = wire.SubjectProgramMQTT

// ProgramMQTTRequest names a program (localnats.Anonymous: clients
// without a credential) and what to clear of its MQTT state (nothing:
// only list it).
type ProgramMQTTRequest struct {
	Program       string `json:"program"`
	ClearRetained bool   `json:"clear_retained,omitempty"`
	ClearSessions bool   `json:"clear_sessions,omitempty"`
}

// ProgramMQTTReply is a program's MQTT state after what the request
// cleared (ClearedRetained retained messages, ClearedSessions sessions),
// or Error.
type ProgramMQTTReply struct {
	State           localnats.MQTTProgramState `json:"state"`
	ClearedRetained int                        `json:"cleared_retained,omitempty"`
	ClearedSessions int                        `json:"cleared_sessions,omitempty"`
	Error           string                     `json:"error,omitempty"`
}

// MQTTProgramStatus is what the status says of the MQTT door's refusals:
// by program, the count of each cause.
type MQTTProgramStatus = map[string]map[string]uint64

// serveProgramMQTT answers SubjectProgramMQTT on the node's own
// connection. a.mu is held.
func (a *Appliance) serveProgramMQTT() error {
	_, err := a.parts().nc.Subscribe(SubjectProgramMQTT, func(m *nats.Msg) {
		if !a.adminRequest(m) {
			return
		}
		data, _ := json.Marshal(a.programMQTT(m.Data)) // plain values: cannot fail
		a.respond(m, data)
	})
	if err != nil {
		return fmt.Errorf("serve %s: %w", SubjectProgramMQTT, err)
	}
	return nil
}

func (a *Appliance) programMQTT(data []byte) ProgramMQTTReply {
	var req ProgramMQTTRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return ProgramMQTTReply{Error: "bad request: " + err.Error()}
	}
	n := a.parts().nats
	if n == nil {
		return ProgramMQTTReply{Error: ErrNotRunning.Error()}
	}
	var rep ProgramMQTTReply
	if req.ClearRetained || req.ClearSessions {
		var err error
		rep.ClearedRetained, rep.ClearedSessions, err = n.ClearMQTT(req.Program, req.ClearRetained, req.ClearSessions)
		if err != nil {
			rep.Error = err.Error()
		} else {
			a.logger.Info("program's MQTT state cleared by the admin", "component", "nats", "program", req.Program,
				"retained", rep.ClearedRetained, "sessions", rep.ClearedSessions)
		}
	}
	st, err := n.MQTTProgram(req.Program)
	if err != nil && rep.Error == "" {
		rep.Error = err.Error()
	}
	rep.State = st
	return rep
}

var descMQTTRefused = prometheus.NewDesc("meshbox_mqtt_refused_total",
	"MQTT publishes and connections the node's MQTT door refused, by program and cause (retained_msgs, retained_bytes: a retain past the program's limit, delivered but not kept; inflight: a QoS 2 publish past its unreleased ones, its connection closed; sessions: a new client ID past its sessions; client_id: a client ID another program holds).",
	[]string{"program", "cause"}, nil)

// mqttRefusalsCollector exports the door's refusals, read at scrape time.
type mqttRefusalsCollector struct {
	nats func() *localnats.Server
}

// Describe implements prometheus.Collector.
func (c mqttRefusalsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descMQTTRefused }

// Collect implements prometheus.Collector.
func (c mqttRefusalsCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.nats()
	if n == nil {
		return
	}
	for prog, causes := range n.MQTTRefusals() {
		for cause, v := range causes {
			ch <- prometheus.MustNewConstMetric(descMQTTRefused, prometheus.CounterValue, float64(v), prog, cause)
		}
	}
}

var descMQTTAcceptErrors = prometheus.NewDesc("meshbox_mqtt_accept_errors_total",
	"Failed accepts of devices' connections on the node's MQTT listener, by cause (fd_limit: out of file descriptors; no_memory: out of kernel buffers or memory; other); the listener goes on accepting after each.",
	[]string{"cause"}, nil)

// mqttAcceptCollector exports the MQTT listener's failed accepts, read
// at scrape time.
type mqttAcceptCollector struct {
	nats func() *localnats.Server
}

// Describe implements prometheus.Collector.
func (c mqttAcceptCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descMQTTAcceptErrors }

// Collect implements prometheus.Collector.
func (c mqttAcceptCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.nats()
	if n == nil {
		return
	}
	for cause, v := range n.MQTTAcceptErrors() {
		ch <- prometheus.MustNewConstMetric(descMQTTAcceptErrors, prometheus.CounterValue, float64(v), cause)
	}
}
