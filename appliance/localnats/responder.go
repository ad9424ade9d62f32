package localnats

import (
	"log/slog"
	"sync"

	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats.go"
)

// Responder answers the requests of local clients to the node's own
// subjects ($MESH.*, meshbox.micro) on the node's responder connection,
// which may publish on _INBOX.> and nothing else, and only on an inbox:
// a reply subject that is none is refused and logged once per subject.
// Its methods are safe for concurrent use.
type Responder struct {
	conn *nats.Conn
	log  *slog.Logger
	// logged are the subjects (and other keys, see once) whose refusals
	// were logged.
	logged sync.Map
}

// Responder opens the node's responder connection, named name (in
// process). Requests refused are logged to logger, publishes the server
// refuses to logger as the component "nats".
func (n *Server) Responder(name string, logger *slog.Logger) (*Responder, error) {
	nc, err := n.connectResponder(name, logger.With("component", "nats"))
	if err != nil {
		return nil, err
	}
	return &Responder{conn: nc, log: logger}, nil
}

// Conn is the responder connection, for the parts of the node that
// answer local clients themselves (the bridge, the node, blobs, rows).
func (r *Responder) Conn() *nats.Conn { return r.conn }

// Close closes the responder connection.
func (r *Responder) Close() { r.conn.Close() }

// once reports whether key is logged for the first time.
func (r *Responder) once(key string) bool {
	_, seen := r.logged.LoadOrStore(key, true)
	return !seen
}

// AdminRequest reports whether m, on one of the node's own subjects that
// make it act (module control, dead letters, program reload), is a
// request it may act on: one with an inbox to answer. The node's CLI
// always asks so; what JetStream publishes where a client told it to (a
// direct get's answer, which has no reply subject, a push consumer's
// delivery, whose reply is $JS.ACK.…) never is. Refused: logged once per
// subject.
func (r *Responder) AdminRequest(m *nats.Msg) bool {
	err := checkInbox(m.Reply)
	if err == nil {
		return true
	}
	if r.once(m.Subject) {
		r.log.Warn("request refused: the node acts only on requests with an inbox to answer (logged once per subject)", "subject", m.Subject, "err", err)
	}
	return false
}

// Respond answers m with data.
func (r *Responder) Respond(m *nats.Msg, data []byte) {
	r.respondMsg(m, &nats.Msg{Data: data})
}

// RespondError answers m with an error reply (code and text in the
// headers, no body).
func (r *Responder) RespondError(m *nats.Msg, code int, text string) {
	out := &nats.Msg{Header: nats.Header{}}
	wire.SetError(out.Header, code, text)
	r.respondMsg(m, out)
}

// respondMsg is Respond's work: out goes to m's reply subject.
func (r *Responder) respondMsg(m, out *nats.Msg) {
	if m.Reply == "" {
		return
	}
	if err := checkInbox(m.Reply); err != nil {
		if r.once(m.Subject) {
			r.log.Warn("request refused: its reply subject is no inbox (logged once per subject)", "subject", m.Subject, "err", err)
		}
		return
	}
	out.Subject = m.Reply
	_ = r.conn.PublishMsg(out) // the caller may have gone; nothing to do then
}
