package programs

import (
	"fmt"
	"slices"
	"strings"

	"github.com/meshbox/meshbox/appliance/blobs"
	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/internal/names"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// Program is one local program's definition: its name and what it may do
// on the node's NATS server. Key is the public half of its credential,
// set by Store.Put.
type Program struct {
	Name      string   `json:"name"`
	Host      []string `json:"host,omitempty"`      // capabilities it may host (subscribe cap.X)
	Call      []string `json:"call,omitempty"`      // capabilities it may call (publish cap.X, node.*.cap.X)
	Serve     []string `json:"serve,omitempty"`     // stages it may serve (subscribe work.X)
	Submit    []string `json:"submit,omitempty"`    // stages it may submit to (publish cmd.X)
	Publish   []string `json:"publish,omitempty"`   // event topics it may publish (evt.T)
	Subscribe []string `json:"subscribe,omitempty"` // event topics it may subscribe to (evt.T)
	// Service names the NATS micro services it may run: it may answer
	// their discovery requests ($SRV.PING, .INFO, .STATS; see
	// ServiceSubjects). A service's endpoints are the capabilities it
	// hosts and the stages it serves, so Service needs Host or Serve.
	Service []string `json:"service,omitempty"`
	// Blobs lets it use the node's blob store (the JetStream object store
	// blobs.Bucket, and no other stream) and fetch blobs from any node
	// (node.*.cap.meshbox.blob.>).
	Blobs bool `json:"blobs,omitempty"`
	// Read and Write name the tables of rows it may read (get, list,
	// history, watch changes) and write (put, delete) through the node's
	// rows API ($MESH.rows.<table>.<op>, see rows.Subject); "*" is every
	// table.
	Read  []string `json:"read,omitempty"`
	Write []string `json:"write,omitempty"`
	Key   string   `json:"key,omitempty"` // public nkey (U...) of its credential
	// MQTT lets it sign in on the node's MQTT listener too, as user Name
	// with a password (MQTT clients cannot sign with an nkey), with the
	// same rights; MQTTPassword is the password's bcrypt hash, set by
	// Store.Put, which writes the password itself beside the seed.
	MQTT         bool   `json:"mqtt,omitempty"`
	MQTTPassword string `json:"mqtt_password,omitempty"`
	// MQTTLimits bound what its MQTT devices keep in the node's store
	// (nil: DefaultMQTTLimits).
	MQTTLimits *MQTTLimits `json:"mqtt_limits,omitempty"`
}

// NodeCapPrefix starts the capabilities the node itself hosts (its blob
// store's, meshbox.blob.*, and micro discovery's, meshbox.micro): no
// program hosts one, or it would answer the mesh in the node's name.
const NodeCapPrefix = "meshbox."

// Limits are its MQTT limits, defaults in place of the ones it does not
// set.
func (p Program) Limits() MQTTLimits {
	if p.MQTTLimits == nil {
		return DefaultMQTTLimits
	}
	return p.MQTTLimits.Effective()
}

// Local NATS subjects a program's permissions are made of (the bridge's
// and the node's subject layout).
const (
	subjCap   = wire.CapPrefix
	subjNode  = wire.NodePrefix + "*.cap."
	subjCmd   = wire.CmdPrefix
	subjWork  = wire.WorkPrefix
	subjEvt   = wire.EvtPrefix
	inboxRoot = "_INBOX."
)

// InboxPrefix is the prefix of the program's reply subjects: a client of
// the program sets it as its inbox prefix (nats.go:
// nats.CustomInboxPrefix, the nats CLI: --inbox-prefix).
func (p Program) InboxPrefix() string { return inboxRoot + p.Name }

// Validate checks the definition: a program name follows the rule of a
// node name (letters, digits, '-', '_'); hosted capabilities and served
// stages are plain names, and so are its services (names.Service); the
// names it calls, submits to, publishes and subscribes to may hold the
// wildcard tokens * and > (> last). A service needs a hosted capability
// or a served stage.
func (p Program) Validate() error {
	if err := CheckName(p.Name); err != nil {
		return err
	}
	lists := []struct {
		flag      string
		kind      names.Kind
		values    []string
		wildcards bool
	}{
		{"host", names.KindCapability, p.Host, false},
		{"call", names.KindCapability, p.Call, true},
		{"serve", names.KindStage, p.Serve, false},
		{"submit", names.KindStage, p.Submit, true},
		{"publish", names.KindTopic, p.Publish, true},
		{"subscribe", names.KindTopic, p.Subscribe, true},
		{"service", names.KindService, p.Service, false},
	}
	for _, h := range p.Host {
		if strings.HasPrefix(h, NodeCapPrefix) {
			return fmt.Errorf("%w %s: host: %s is the node's own capability (the names under %s are the node's)", ErrInvalid, p.Name, h, NodeCapPrefix)
		}
	}
	for _, l := range lists {
		for _, v := range l.values {
			if err := checkPattern(l.kind, v, l.wildcards); err != nil {
				return fmt.Errorf("%w %s: %s: %w", ErrInvalid, p.Name, l.flag, err)
			}
		}
	}
	for _, l := range []struct {
		flag   string
		tables []string
	}{{"read", p.Read}, {"write", p.Write}} {
		for _, t := range l.tables {
			if t == "*" {
				continue
			}
			if err := rows.ValidTable(t); err != nil {
				return fmt.Errorf("%w %s: %s: %w (or * for every table)", ErrInvalid, p.Name, l.flag, err)
			}
		}
	}
	if len(p.Service) > 0 && len(p.Host) == 0 && len(p.Serve) == 0 {
		return fmt.Errorf("%w %s: service: a micro service answers on the capabilities it hosts or the stages it serves: give host or serve too", ErrInvalid, p.Name)
	}
	if p.MQTTPassword != "" && (!p.MQTT || !isBcrypt(p.MQTTPassword)) {
		return fmt.Errorf("%w %s: mqtt_password must be the bcrypt hash of its MQTT password, set by meshbox program add --mqtt", ErrInvalid, p.Name)
	}
	if p.MQTTLimits != nil {
		if !p.MQTT {
			return fmt.Errorf("%w %s: MQTT limits are for a program with --mqtt", ErrInvalid, p.Name)
		}
		if err := p.MQTTLimits.validate(); err != nil {
			return fmt.Errorf("%w %s: %w", ErrInvalid, p.Name, err)
		}
	}
	if p.Key != "" && !nkeys.IsValidPublicUserKey(p.Key) {
		return fmt.Errorf("%w %s: key %q is not a public user nkey", ErrInvalid, p.Name, p.Key)
	}
	return nil
}

// CheckName checks a program's name: the rule of a node name, since it
// becomes a subject token (its inbox) and a file name.
func CheckName(name string) error {
	if err := names.Node(name); err != nil {
		return fmt.Errorf("%w: program name: %w", ErrInvalid, err)
	}
	return nil
}

// checkPattern checks a name of kind k that may, when wildcards is true,
// hold the tokens * and > (the latter only last).
func checkPattern(k names.Kind, s string, wildcards bool) error {
	if !wildcards || !strings.ContainsAny(s, "*>") {
		return names.Check(k, s)
	}
	tokens := strings.Split(s, ".")
	for i, t := range tokens {
		switch {
		case t == "*":
			tokens[i] = "x"
		case t == ">" && i == len(tokens)-1:
			tokens[i] = "x"
		case t == ">":
			return fmt.Errorf("%s %q: > may only be the last token", k, s)
		}
	}
	// What remains must be a name once the wildcards are plain tokens.
	if err := names.Check(k, strings.Join(tokens, ".")); err != nil {
		return fmt.Errorf("%s %q: %w", k, s, err)
	}
	return nil
}

// Permissions are the program's rights on the node's NATS server. Allow
// lists are never nil: an empty list allows nothing.
func (p Program) Permissions() *server.Permissions {
	pub := []string{}
	for _, c := range p.Call {
		pub = append(pub, subjCap+c, subjNode+c)
	}
	for _, s := range p.Submit {
		pub = append(pub, subjCmd+s)
	}
	for _, t := range p.Publish {
		pub = append(pub, subjEvt+t)
	}
	if p.Blobs {
		pub = append(pub, blobSubjects()...)
	}
	for _, t := range p.Read {
		for _, op := range rows.ReadOps {
			pub = append(pub, rows.Subject(t, op))
		}
	}
	for _, t := range p.Write {
		for _, op := range rows.WriteOps {
			pub = append(pub, rows.Subject(t, op))
		}
	}
	sub := []string{p.InboxPrefix() + ".>"}
	for _, t := range p.Read {
		sub = append(sub, rows.ChangedSubject(t, ">"))
	}
	for _, c := range p.Host {
		sub = append(sub, subjCap+c)
	}
	for _, name := range p.Service {
		sub = append(sub, ServiceSubjects(name)...)
	}
	for _, s := range p.Serve {
		sub = append(sub, subjWork+s)
	}
	for _, t := range p.Subscribe {
		sub = append(sub, subjEvt+t)
	}
	if len(p.Host) > 0 || len(p.Serve) > 0 {
		// A host answers calls, a handler commands: both on inboxes.
		// Not the server's allow_responses: it lets a client publish on
		// the reply subject of any message it receives, whatever its
		// other rights say, and a caller chooses its reply subject
		// freely: a program that may call and host the same capability
		// (or publish and subscribe an event topic) could make itself
		// any reply subject it likes ($JS.API..., $MESH..., cmd.<any>).
		// Inboxes carry unguessable tokens, so the right to publish
		// under _INBOX. reaches only the callers whose calls it received.
		pub = append(pub, inboxRoot+">")
	}
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: append([]string{}, dedupe(pub)...)},
		Subscribe: &server.SubjectPermission{Allow: dedupe(sub)},
	}
}

// blobSubjects are what a program with blob rights may publish: the
// node's request that makes the store when it has none yet, its fetches'
// progress reports, the JetStream
// API requests an object store client makes on the blob
// store's stream (and no other), the store's own subjects, its flow
// control replies, and calls of the blob capabilities on any node. The
// replies come to its inbox.
func blobSubjects() []string {
	const api, stream = "$JS.API.", blobs.StreamName
	return []string{
		api + "INFO",
		api + "STREAM.INFO." + stream,
		api + "STREAM.MSG.GET." + stream,
		api + "STREAM.PURGE." + stream,
		api + "DIRECT.GET." + stream,
		api + "DIRECT.GET." + stream + ".>",
		api + "CONSUMER.CREATE." + stream,
		api + "CONSUMER.CREATE." + stream + ".>",
		api + "CONSUMER.INFO." + stream + ".>",
		api + "CONSUMER.DELETE." + stream + ".>",
		api + "CONSUMER.MSG.NEXT." + stream + ".>",
		"$JS.FC." + stream + ".>",
		"$O." + blobs.Bucket + ".>",
		subjNode + blobs.CapPrefix + ">",
		blobs.SubjectOpen,
		blobs.SubjectFetches,
	}
}

// normalize sorts and dedupes the lists, so that a definition is stored
// and compared one way.
func (p *Program) normalize() {
	for _, l := range []*[]string{&p.Host, &p.Call, &p.Serve, &p.Submit, &p.Publish, &p.Subscribe, &p.Service, &p.Read, &p.Write} {
		*l = dedupe(*l)
		if len(*l) == 0 {
			*l = nil
		}
	}
	if p.MQTTLimits != nil && *p.MQTTLimits == (MQTTLimits{}) {
		p.MQTTLimits = nil
	}
}

func dedupe(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}
