package localnats

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/internal/names"
	"github.com/meshbox/meshbox/internal/wire"
)

// NATS micro discovery across the mesh. A NATS micro service answers the
// discovery requests of its own server ($SRV.PING, $SRV.INFO, $SRV.STATS,
// each also per service name and per instance); `nats micro ls` on one
// node would see that node's services only, though their endpoints are
// callable from every node. So each node:
//
//   - hosts the node capability meshbox.micro (on its own connection,
//     like the blob store's): a peer sends it a discovery request, and
//     it asks its local services and answers with what they said, each
//     answer's metadata marked with the node's name (meshbox_node);
//   - takes the discovery requests of its local clients ($SRV.>, beside
//     the local services, which answer them themselves) and asks every
//     peer that is up, through the bridge (sealed, with a deadline, like
//     any request), then passes each service's answer on to the client.
//
// Only a client that may ask the whole mesh asks: a discovery request is a
// publish on $SRV.*, which a program's rights do not grant (its host and
// call rights are on cap.*), so the askers are the node's administrator
// (the meshbox CLI, `nats --nkey admin.nk`) and, on an open node, clients
// without a credential, who may call anything there anyway.
const (
	microCap = programs.NodeCapPrefix + "micro"
	// microInbox starts the inboxes of the node's own discovery requests
	// to its local services, which its handler of local requests ignores.
	// No program's inbox starts so: a program name has no '$'.
	microInbox = "_INBOX.$meshbox-micro."
	// microCollect is how long a node listens for its local services'
	// answers: they are on the same server and answer within
	// milliseconds, and `nats micro ls` stops listening 300 ms after
	// the last answer it got.
	microCollect = 150 * time.Millisecond
	// microDeadline bounds the peers' answers, and each peer is told so
	// (Meshbox-Timeout); microParallel bounds the peers asked at once, a
	// mesh's worth, so that peers that are slow to answer do not keep the
	// others from being asked before the deadline.
	microDeadline = 2 * time.Second
	microParallel = 64
	// microMetaNode is the metadata key naming the node that runs the
	// instance.
	microMetaNode = "meshbox_node"
	// maxMicroAnswers bounds the answers a node passes on for one peer,
	// maxMicroAnswerBytes one answer (a service's INFO or STATS: a few
	// KiB), and maxMicroBytes all of a node's answers together, well
	// within a message: a local client that answers the node's discovery
	// request with much or many (any program that may answer one) cannot
	// crowd out the others or make the node's answer too large to send.
	maxMicroAnswers     = 256
	maxMicroAnswerBytes = 64 << 10
	maxMicroBytes       = 512 << 10
)

// Why the node refused a discovery request or left out an answer
// (meshbox_micro_refused_total).
const (
	microRefusedProgram  = "program"   // a program called meshbox.micro itself
	microRefusedTooLarge = "too_large" // an answer over maxMicroAnswerBytes or past maxMicroBytes
	microRefusedTooMany  = "too_many"  // an answer past maxMicroAnswers
	microRefusedBadJSON  = "malformed" // an answer that is no JSON object
)

// microQuery is a discovery request sent to a peer: the verb and the
// optional service name and instance id of the subject it came on.
type microQuery struct {
	Verb string `json:"verb"`
	Name string `json:"name,omitempty"`
	ID   string `json:"id,omitempty"`
}

// microAnswer is a peer's answer: what its local services said.
type microAnswer struct {
	Node      string            `json:"node"`
	Responses []json.RawMessage `json:"responses"`
}

// MicroConfig is what micro discovery needs of the node.
type MicroConfig struct {
	Node string // the node's name, marked on its services' answers
	// Conn is the node's own connection (Server.Connect): discovery
	// subscribes and asks on it. Closing it ends discovery.
	Conn    *nats.Conn
	Replies *Responder
	// Peers returns the peers that are up now (none: the local services
	// are all there is).
	Peers      func() []string
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// discovery is micro discovery's state; its handlers run on cfg.Conn's
// goroutine.
type discovery struct {
	cfg     MicroConfig
	rights  *Rights
	refused *prometheus.CounterVec // meshbox_micro_refused_total
}

// ServeMicro takes the discovery requests, the mesh's and the local
// clients', on cfg.Conn, until it closes.
func (n *Server) ServeMicro(cfg MicroConfig) error {
	d := &discovery{cfg: cfg, rights: n.Rights(), refused: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "meshbox_micro_refused_total",
		Help: "NATS micro discovery: requests to meshbox.micro refused (program: a local program's call; the node answers its peers and its administrator) and answers of local services left out (too_large, too_many, malformed).",
	}, []string{"reason"})}
	if err := cfg.Registerer.Register(d.refused); err != nil {
		return fmt.Errorf("register micro discovery metrics: %w", err)
	}
	nc := cfg.Conn
	for subj, h := range map[string]nats.MsgHandler{
		wire.CapPrefix + microCap: d.onMicroQuery,
		"$SRV.>":                  d.onMicroDiscovery,
	} {
		if _, err := nc.Subscribe(subj, h); err != nil {
			return fmt.Errorf("serve %s: %w", subj, err)
		}
	}
	return nil
}

// parseMicroSubject reads $SRV.<VERB>[.<name>[.<id>]].
func parseMicroSubject(subj string) (microQuery, bool) {
	toks := strings.Split(subj, ".")
	if len(toks) < 2 || len(toks) > 4 || toks[0] != "$SRV" {
		return microQuery{}, false
	}
	q := microQuery{Verb: toks[1]}
	if len(toks) > 2 {
		q.Name = toks[2]
	}
	if len(toks) > 3 {
		q.ID = toks[3]
	}
	return q, q.valid()
}

// valid checks a query: a known verb, a service name by the micro rules,
// an id only with a name.
func (q microQuery) valid() bool {
	switch q.Verb {
	case micro.PingVerb.String(), micro.InfoVerb.String(), micro.StatsVerb.String():
	default:
		return false
	}
	if q.Name != "" && names.Service(q.Name) != nil {
		return false
	}
	if q.ID != "" && (q.Name == "" || !wire.ValidID(q.ID) || strings.ContainsAny(q.ID, ".*>")) {
		return false
	}
	return true
}

func (q microQuery) subject() string {
	verb := map[string]micro.Verb{"PING": micro.PingVerb, "INFO": micro.InfoVerb, "STATS": micro.StatsVerb}[q.Verb]
	subj, _ := micro.ControlSubject(verb, q.Name, q.ID) // valid() holds
	return subj
}

// onMicroDiscovery passes a local client's discovery request on to every
// peer that is up and each of their services' answers back to the
// client. The node's own requests to its local services are not passed
// on: they are what a peer asked.
func (d *discovery) onMicroDiscovery(m *nats.Msg) {
	if m.Reply == "" || strings.HasPrefix(m.Reply, microInbox) {
		return
	}
	q, ok := parseMicroSubject(m.Subject)
	if !ok {
		return
	}
	peers := d.cfg.Peers()
	if len(peers) == 0 {
		return // standalone, or no peer up: the local services are all there is
	}
	body, _ := json.Marshal(q)         // strings: cannot fail
	go d.askPeersMicro(m, peers, body) // ends within microDeadline
}

// askPeersMicro asks peers (microParallel at a time) and answers m with
// what each said.
func (d *discovery) askPeersMicro(m *nats.Msg, peers []string, body []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), microDeadline)
	defer cancel()
	sem := make(chan struct{}, microParallel)
	var wg sync.WaitGroup
	for _, peer := range peers {
		wg.Add(1)
		sem <- struct{}{}
		go func() { // ends with its request, within ctx
			defer wg.Done()
			defer func() { <-sem }()
			req := nats.NewMsg(wire.NodePrefix + peer + ".cap." + microCap)
			req.Data = body
			req.Header.Set(wire.HeaderTimeout, microDeadline.String())
			resp, err := d.cfg.Conn.RequestMsgWithContext(ctx, req)
			if err != nil {
				d.cfg.Logger.Debug("micro discovery: a peer did not answer", "peer", peer, "err", err)
				return
			}
			var ans microAnswer
			if err := json.Unmarshal(resp.Data, &ans); err != nil || ans.Node != peer {
				return // an error reply, or a node of a version without it
			}
			for i, r := range ans.Responses {
				if i == maxMicroAnswers {
					break
				}
				// Marked again here: the node that answered is the one
				// asked (the bridge opened its sealed answer from it),
				// whatever its answer claims.
				if marked, ok := markMicroNode(r, peer); ok {
					d.cfg.Replies.Respond(m, marked)
				}
			}
		}()
	}
	wg.Wait()
}

// onMicroQuery answers a peer's discovery request with the answers of
// this node's local services, each marked with the node's name. The
// requests come from the bridge (a peer asks) and from the node's
// administrator; a program that may call meshbox.micro (a right such as
// --call '>') is refused: what services a program sees is what the mesh
// shows it through its own node, within its rights (onMicroDiscovery).
func (d *discovery) onMicroQuery(m *nats.Msg) {
	if prog, ok := d.rights.inboxOwner(m.Reply); ok {
		d.refused.WithLabelValues(microRefusedProgram).Inc()
		if d.cfg.Replies.once("micro/" + prog) {
			d.cfg.Logger.Warn("micro discovery: a program's call to meshbox.micro refused (the node answers its peers and its administrator; logged once per program)", "program", prog)
		}
		if d.rights.ReplyAllowed(m.Subject, m.Reply) == nil { // its own inbox, not another program's
			d.cfg.Replies.RespondError(m, wire.CodeForbidden, "meshbox.micro answers the node's peers and its administrator, not programs: ask with nats micro ls as the administrator")
		}
		return
	}
	var q microQuery
	if err := json.Unmarshal(m.Data, &q); err != nil || !q.valid() {
		d.cfg.Replies.Respond(m, nil)
		return
	}
	go d.answerMicro(m, q) // ends within microCollect: the connection's other handlers go on
}

// answerMicro asks the local services q and answers m with what they said.
func (d *discovery) answerMicro(m *nats.Msg, q microQuery) {
	nc := d.cfg.Conn
	inbox := microInbox + nats.NewInbox()[len("_INBOX."):]
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(q.subject(), inbox, nil); err != nil {
		return
	}
	ans := microAnswer{Node: d.cfg.Node, Responses: []json.RawMessage{}}
	until := time.Now().Add(microCollect)
	total := 0
	for {
		r, err := sub.NextMsg(time.Until(until))
		if err != nil {
			break
		}
		reason := ""
		var out json.RawMessage
		switch {
		case len(ans.Responses) == maxMicroAnswers:
			reason = microRefusedTooMany
		case len(r.Data) > maxMicroAnswerBytes:
			reason = microRefusedTooLarge
		default:
			var ok bool
			if out, ok = markMicroNode(r.Data, d.cfg.Node); !ok {
				reason = microRefusedBadJSON
			} else if total+len(out) > maxMicroBytes {
				reason = microRefusedTooLarge
			}
		}
		if reason != "" {
			d.refused.WithLabelValues(reason).Inc()
			if d.cfg.Replies.once("micro-answer/" + reason) {
				d.cfg.Logger.Warn("micro discovery: a local service's answer left out (logged once per reason; meshbox_micro_refused_total counts them)", "reason", reason,
					"limits", fmt.Sprintf("%d answers, %d bytes each, %d in all", maxMicroAnswers, maxMicroAnswerBytes, maxMicroBytes))
			}
			continue
		}
		total += len(out)
		ans.Responses = append(ans.Responses, out)
	}
	data, _ := json.Marshal(ans) // raw JSON already checked: cannot fail
	d.cfg.Replies.Respond(m, data)
}

// markMicroNode adds the node's name to a service's answer's metadata. An
// answer that is no JSON object is left out.
func markMicroNode(data []byte, nodeName string) (json.RawMessage, bool) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(data, &obj); err != nil {
		return nil, false
	}
	meta := map[string]string{}
	if raw, ok := obj["metadata"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &meta); err != nil {
			return nil, false
		}
	}
	meta[microMetaNode] = nodeName
	b, err := json.Marshal(meta)
	if err != nil {
		return nil, false
	}
	obj["metadata"] = b
	out, err := json.Marshal(obj)
	return out, err == nil
}
