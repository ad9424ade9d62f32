package appliance

import (
	"encoding/json"
	"fmt"
	"net/url"

	"github.com/meshbox/meshbox/appliance/localnats"
	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats.go"
)

// The appliance's side of its local NATS server (package localnats): the
// server's options from the configuration, the programs' API, and the
// answers to local clients.

const (
	// SubjectReloadPrograms asks the node to read its programs again (the
	// meshbox CLI does after program add and remove). The reply is a
	// ProgramsReport.
	SubjectReloadPrograms = wire.SubjectReloadPrograms
)

// ProgramsReport is what the node knows of its programs after a (re)load.
type ProgramsReport = localnats.ProgramsReport

// Auth modes of the embedded NATS server, as the status reports them.
const (
	AuthCredentials = localnats.AuthCredentials // every client needs a credential
	AuthOpen        = localnats.AuthOpen        // clients without one are let in too
)

// startLocalNATS starts the local NATS server as the configuration says.
// a.mu is held; the HTTP listener, whose pages may use the WebSocket
// listener, runs.
func (a *Appliance) startLocalNATS() (*localnats.Server, error) {
	o := localnats.Options{
		Addr:      a.cfg.NATS,
		Node:      a.cfg.Node,
		DataDir:   a.cfg.DataDir,
		Anonymous: !a.cfg.InMesh() || a.cfg.NATSAnonymous,
		Logger:    a.logger.With("component", "nats"),
	}
	if a.cfg.Blobs.Enabled {
		o.BlobMaxBytes = a.cfg.Blobs.MaxBytes
	}
	if a.cfg.NATSWebSocket != "" {
		o.WebSocket = &localnats.WebSocketOptions{
			Addr: a.cfg.NATSWebSocket, Cert: a.cfg.NATSWebSocketCert, Key: a.cfg.NATSWebSocketKey,
			Origins:     append(ownOrigins(a.HTTPURL()), a.cfg.NATSWebSocketOrigins...),
			OffLoopback: !LoopbackAddr(a.cfg.NATSWebSocket),
		}
	}
	if a.cfg.NATSMQTT != "" {
		o.MQTT = &localnats.MQTTOptions{
			Addr: a.cfg.NATSMQTT, Cert: a.cfg.NATSMQTTCert, Key: a.cfg.NATSMQTTKey,
			OffLoopback: !LoopbackAddr(a.cfg.NATSMQTT),
		}
	}
	switch { // the status says it for as long as it lasts, at the same level
	case o.Anonymous && a.cfg.InMesh():
		a.logger.Warn(localnats.WarnOpen, "component", "nats")
	case o.Anonymous:
		a.logger.Info(localnats.WarnOpen, "component", "nats") // a standalone node is open by design
	}
	return localnats.Start(o)
}

// ownOrigins are the origins of the node's own pages, which may use the
// WebSocket listener: its HTTP listener's address (httpURL, "" when off),
// and localhost for a loopback one.
func ownOrigins(httpURL string) []string {
	u, err := url.Parse(httpURL)
	if httpURL == "" || err != nil || u.Host == "" {
		return nil
	}
	out := []string{u.Scheme + "://" + u.Host}
	if LoopbackAddr(u.Host) {
		out = append(out, u.Scheme+"://localhost:"+u.Port())
	}
	return out
}

// ReloadPrograms reads the programs' definitions again and applies them to
// the running NATS server: new programs may connect, changed ones get
// their new permissions, removed ones are disconnected.
func (a *Appliance) ReloadPrograms() (ProgramsReport, error) {
	n := a.parts().nats
	if n == nil {
		return ProgramsReport{}, ErrNotRunning
	}
	rep, err := n.Reload()
	a.logPrograms(rep)
	return rep, err
}

// PutProgram creates or changes program p in the node's store, applies it
// to the running server, and returns the path of its credential file (an
// nkey seed file any NATS client reads). The same key stays with the
// program across changes.
func (a *Appliance) PutProgram(p programs.Program) (credsPath string, err error) {
	n := a.parts().nats
	if n == nil {
		return "", ErrNotRunning
	}
	path, err := n.PutProgram(p)
	if err != nil {
		return "", err
	}
	if _, err := a.ReloadPrograms(); err != nil {
		return path, err
	}
	return path, nil
}

// RemoveProgram deletes program name and disconnects its clients.
func (a *Appliance) RemoveProgram(name string) error {
	n := a.parts().nats
	if n == nil {
		return ErrNotRunning
	}
	if err := n.RemoveProgram(name); err != nil {
		return err
	}
	_, err := a.ReloadPrograms()
	return err
}

// logPrograms logs each bad program definition and the programs whose
// MQTT devices were disconnected to reconnect under their new rights.
func (a *Appliance) logPrograms(rep ProgramsReport) {
	for _, e := range rep.Errors {
		a.logger.Warn("local program left out", "component", "nats", "err", e)
	}
	for _, name := range rep.Reconnected {
		a.logger.Info("program's MQTT devices disconnected: its subscribe rights changed, and they reconnect under the new ones", "component", "nats", "program", name)
	}
}

// serveReload answers SubjectReloadPrograms on the node's own connection.
// a.mu is held.
func (a *Appliance) serveReload() error {
	_, err := a.parts().nc.Subscribe(SubjectReloadPrograms, func(m *nats.Msg) {
		if !a.adminRequest(m) {
			return
		}
		rep, err := a.ReloadPrograms()
		if err != nil {
			rep.Errors = append(rep.Errors, err.Error())
		}
		data, _ := json.Marshal(rep) // plain strings: cannot fail
		a.respond(m, data)
	})
	if err != nil {
		return fmt.Errorf("serve %s: %w", SubjectReloadPrograms, err)
	}
	return nil
}

// adminRequest reports whether m, on one of the node's own subjects that
// make it act, is a request it may act on (localnats.Responder.AdminRequest).
func (a *Appliance) adminRequest(m *nats.Msg) bool {
	rp := a.parts().replies
	return rp != nil && rp.AdminRequest(m)
}

// respond answers a request to one of the node's own subjects ($MESH.*)
// on the responder connection, and only on an inbox
// (localnats.Responder); not once Close took the responder away.
func (a *Appliance) respond(m *nats.Msg, data []byte) {
	if rp := a.parts().replies; rp != nil {
		rp.Respond(m, data)
	}
}
