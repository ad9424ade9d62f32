package node

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/meshbox/meshbox/internal/names"
	"github.com/meshbox/meshbox/internal/wire"
)

// Discovery protocol versions. A message's "v" is the lowest version a
// receiver must speak to understand it, so a message every version
// understands goes out as version 1 and an older node keeps understanding
// it; "proto" says the highest version the sender speaks. A node accepts
// every version from MinProtocolVersion to ProtocolVersion and rejects
// anything else clearly (ErrVersion).
const (
	ProtocolVersion    = 8 // the highest version this package speaks
	MinProtocolVersion = 1 // the lowest version it still understands

	// BatchProtocolVersion is the first version whose nodes read command
	// batches (package bridge): version 3 adds no discovery message, only
	// that.
	BatchProtocolVersion = 3

	// ProbeProtocolVersion is the first version whose links drop a probe
	// (Link.ProbeNode) addressed to them: version 5 adds no discovery
	// message, and its peers probe it with those instead of pings.
	ProbeProtocolVersion = 5
	// OrderKeyProtocolVersion is the first version whose nodes read a
	// command's Meshbox-Order-Key (sealed with it) and keep the order.
	OrderKeyProtocolVersion = 5
	// EventLaneProtocolVersion is the first version whose nodes publish
	// every event with its lane (evo.<origin>.<topic>, package wire) and
	// bind only the lanes of other nodes: version 6 adds no discovery
	// message.
	EventLaneProtocolVersion = 6
	// ListenProtocolVersion is the first version whose host record says
	// which events the node's programs listen to ("events"; absent: none),
	// so that a publisher sends an event to the broker only when another
	// node listens to its topic (Config.OnEventListeners). A peer of an
	// older version may listen to anything.
	ListenProtocolVersion = 7
	// RowsBinaryProtocolVersion is the first version whose nodes read a
	// table's snapshot parts in binary (package rows): a node writes them
	// so only while every node it knows of speaks it (OnKnownProtocols).
	RowsBinaryProtocolVersion = 8
)

// PeerProtocolSettle is how long after its first discovery message a node
// first reports its peers' lowest protocol version (Config.OnPeerProtocols).
const PeerProtocolSettle = time.Second

// Limits on discovery messages. A message beyond them is rejected whole.
const (
	MaxMessageBytes   = 256 << 10       // body size
	MaxCapabilities   = 1024            // entries in "capabilities"
	MaxStages         = 1024            // entries in "stages"
	MaxEvents         = 1024            // entries in "events"
	MaxNodeNameLen    = names.MaxNode   // node names (see package names)
	MaxCapNameLen     = names.MaxDotted // capability and stage names (see package names)
	MaxVersionLen     = 64              // the "version" string
	MaxHashLen        = 64              // the "hash" string (hex)
	maxProto          = 1000            // the highest "proto" accepted (a later version than ours is fine)
	minHeartbeatMS    = 10
	maxHeartbeatMS    = 3600 * 1000
	capSubjectPrefix  = wire.CapPrefix
	workSubjectPrefix = wire.WorkPrefix
)

// Discovery message types (the "type" field).
const (
	TypeHello     = "hello"     // a node joined; carries its host record
	TypeQuery     = "query"     // "what do you host?"; answered with info
	TypeInfo      = "info"      // an answer to a query; carries the host record
	TypeUpdate    = "update"    // the sender's capabilities or stages changed
	TypeHeartbeat = "heartbeat" // the sender is alive; carries the record's hash
	TypeBye       = "bye"       // the sender leaves cleanly
	TypePing      = "ping"      // version 2, addressed: is the addressee still connected?
	TypeGone      = "gone"      // version 2: the sender found peer's system queue gone
)

// typeVersion is the protocol version that introduced message type t: the
// "v" a message of that type is sent with.
func typeVersion(t string) int {
	switch t {
	case TypePing, TypeGone:
		return 2
	}
	return 1
}

// Message is one discovery message: the JSON body of a system message the
// bridge carries with the message type as its key. The same struct serves
// every type; fields a type does not use are left empty.
type Message struct {
	V            int       `json:"v"`
	Type         string    `json:"type"`
	Node         string    `json:"node"`
	To           string    `json:"to,omitempty"`
	StartedAt    time.Time `json:"started_at"`
	Seq          uint64    `json:"seq"`
	Version      string    `json:"version,omitempty"`
	Revision     int64     `json:"revision,omitempty"`
	Capabilities []string  `json:"capabilities,omitempty"`
	Stages       []string  `json:"stages,omitempty"`
	// Events are the topic patterns (AMQP syntax, after evt.: "*" one
	// token, "#" any) the sender's programs listen to (version 7; hello,
	// info, update). Older nodes ignore it.
	Events      []string `json:"events,omitempty"`
	Hash        string   `json:"hash,omitempty"`
	HeartbeatMS int64    `json:"heartbeat_ms,omitempty"`
	Proto       int      `json:"proto,omitempty"`
	Peer        string   `json:"peer,omitempty"`
	// Health is the sender's health summary (hello, info, update; a
	// heartbeat when it changed). Older nodes ignore it.
	Health *Health `json:"health,omitempty"`
	// HealthHash is the hash of the sender's health summary (Health.hash)
	// on a heartbeat that does not carry the summary: a peer whose copy
	// differs missed a change and asks for it (a query). Older nodes
	// ignore it.
	HealthHash string `json:"health_hash,omitempty"`
	// Sig is the sender's signature of the message (version 4, see
	// signing.go). It is the last member of the JSON object, as
	// EncodeMessage writes it.
	Sig string `json:"sig,omitempty"`
}

// carriesRecord reports whether messages of type t carry a full host
// record (capabilities, stages and events).
func carriesRecord(t string) bool {
	return t == TypeHello || t == TypeInfo || t == TypeUpdate
}

// EncodeMessage returns m's JSON body.
func EncodeMessage(m *Message) ([]byte, error) {
	return json.Marshal(m)
}

// DecodeMessage parses and validates a discovery message received with
// system key key, which must be its type. origin is the sending node as the transport knows it
// ("" when unknown); when set it must equal the message's node. Lists are
// returned sorted and without duplicates. Every rejection is a *WireError.
func DecodeMessage(key string, body []byte, origin string) (*Message, error) {
	if len(body) > MaxMessageBytes {
		return nil, wireErr(ErrTooLarge, "", "%d bytes, limit %d", len(body), MaxMessageBytes)
	}
	var m Message
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&m); err != nil {
		return nil, wireErr(ErrMalformed, "", "%v", err)
	}
	if dec.More() {
		return nil, wireErr(ErrMalformed, "", "more than one JSON value")
	}
	if m.V < MinProtocolVersion || m.V > ProtocolVersion {
		return nil, wireErr(ErrVersion, "v", "got %d, want %d..%d", m.V, MinProtocolVersion, ProtocolVersion)
	}
	switch m.Type {
	case TypeHello, TypeQuery, TypeInfo, TypeUpdate, TypeHeartbeat, TypeBye, TypePing, TypeGone:
		if m.V < typeVersion(m.Type) {
			return nil, wireErr(ErrUnknownType, "type", "%s is not a version %d message", m.Type, m.V)
		}
	default:
		return nil, wireErr(ErrUnknownType, "type", "%.32q", m.Type)
	}
	if m.Proto != 0 && (m.Proto < m.V || m.Proto > maxProto) {
		return nil, wireErr(ErrBadField, "proto", "%d out of range %d..%d", m.Proto, m.V, maxProto)
	}
	if err := names.Node(m.Node); err != nil {
		return nil, wireErr(ErrBadName, "node", "%v", err)
	}
	if origin != "" && origin != m.Node {
		return nil, wireErr(ErrOrigin, "node", "message from %q claims to be from %q", origin, m.Node)
	}
	if m.To != "" {
		if err := names.Node(m.To); err != nil {
			return nil, wireErr(ErrBadName, "to", "%v", err)
		}
	}
	if (m.Type == TypeInfo || m.Type == TypePing) && m.To == "" {
		return nil, wireErr(ErrBadField, "to", "a %s message must be addressed", m.Type)
	}
	if m.To != "" && m.Type != TypeInfo && m.Type != TypeQuery && m.Type != TypePing {
		return nil, wireErr(ErrBadField, "to", "a %s message is never addressed", m.Type)
	}
	switch {
	case m.Type == TypeGone && m.Peer == "":
		return nil, wireErr(ErrBadField, "peer", "a gone message names the peer")
	case m.Type != TypeGone && m.Peer != "":
		return nil, wireErr(ErrBadField, "peer", "a %s message names no peer", m.Type)
	case m.Peer != "":
		if err := names.Node(m.Peer); err != nil {
			return nil, wireErr(ErrBadName, "peer", "%v", err)
		}
	}
	if key != m.Type {
		return nil, wireErr(ErrKeyMismatch, "", "key %.80q for a %s message", key, m.Type)
	}
	if m.StartedAt.IsZero() {
		return nil, wireErr(ErrBadField, "started_at", "missing")
	}
	if len(m.Version) > MaxVersionLen || !printable(m.Version) {
		return nil, wireErr(ErrBadField, "version", "not printable or longer than %d", MaxVersionLen)
	}
	if m.Revision < 0 {
		return nil, wireErr(ErrBadField, "revision", "negative")
	}
	if len(m.Hash) > MaxHashLen || !isHex(m.Hash) {
		return nil, wireErr(ErrBadField, "hash", "not hex or longer than %d", MaxHashLen)
	}
	if len(m.HealthHash) > MaxHashLen || !isHex(m.HealthHash) {
		return nil, wireErr(ErrBadField, "health_hash", "not hex or longer than %d", MaxHashLen)
	}
	if m.HealthHash != "" && m.Type != TypeHeartbeat {
		return nil, wireErr(ErrBadField, "health_hash", "only a heartbeat carries it")
	}
	if m.HeartbeatMS != 0 && (m.HeartbeatMS < minHeartbeatMS || m.HeartbeatMS > maxHeartbeatMS) {
		return nil, wireErr(ErrBadField, "heartbeat_ms", "%d out of range %d..%d", m.HeartbeatMS, minHeartbeatMS, maxHeartbeatMS)
	}
	if m.Health != nil && !carriesRecord(m.Type) && m.Type != TypeHeartbeat {
		return nil, wireErr(ErrBadField, "health", "a %s message carries no health", m.Type)
	}
	if err := checkHealth(m.Health); err != nil {
		return nil, err
	}
	if !carriesRecord(m.Type) && (len(m.Capabilities) > 0 || len(m.Stages) > 0 || len(m.Events) > 0) {
		return nil, wireErr(ErrBadField, "capabilities", "a %s message carries no lists", m.Type)
	}
	var err *WireError
	if m.Capabilities, err = checkList("capabilities", names.Capability, m.Capabilities, MaxCapabilities); err != nil {
		return nil, err
	}
	if m.Stages, err = checkList("stages", names.Stage, m.Stages, MaxStages); err != nil {
		return nil, err
	}
	if m.Events, err = checkList("events", wire.ValidEventPattern, m.Events, MaxEvents); err != nil {
		return nil, err
	}
	if len(m.Sig) > maxSigLen {
		return nil, wireErr(ErrBadField, "sig", "longer than %d", maxSigLen)
	}
	if carriesRecord(m.Type) && m.Hash == "" {
		m.Hash = HostHash(m.Capabilities, m.Stages, m.Events...)
	}
	return &m, nil
}

// checkList validates (with check), sorts and deduplicates a list of names.
func checkList(field string, check func(string) error, list []string, limit int) ([]string, *WireError) {
	if len(list) > limit {
		return nil, wireErr(ErrTooMany, field, "%d entries, limit %d", len(list), limit)
	}
	for _, n := range list {
		if err := check(n); err != nil {
			return nil, wireErr(ErrBadName, field, "%v", err)
		}
	}
	out := slices.Clone(list)
	slices.Sort(out)
	return slices.Compact(out), nil
}

// ValidNodeName reports whether name can be a node's mesh name (see
// package names: 1 to 64 bytes of [A-Za-z0-9_-]).
func ValidNodeName(name string) bool { return names.Node(name) == nil }

// ValidCapabilityName reports whether name can be advertised as a
// capability or stage (see package names: at most 128 bytes, one or more
// dot-separated tokens of [A-Za-z0-9_-], so "echo" and "image.resize", not
// "a..b", "a.*", "a>" or "café").
func ValidCapabilityName(name string) bool { return names.Capability(name) == nil }

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		// Controls (C0, DEL, C1: a terminal takes \u009b as an escape)
		// and format characters (bidirectional overrides, zero widths),
		// which make what a terminal or page shows differ from the text.
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			return false
		}
	}
	return true
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// HostHash is the hash of a host record that heartbeats carry: the first
// 16 bytes, in lower-case hex, of the SHA-256 of "c:<capability>\n" for
// each capability, "s:<stage>\n" for each stage, then "e:<pattern>\n"
// for each event pattern listened to, each sorted (a record without
// events hashes as a version 6 node's did).
func HostHash(capabilities, stages []string, events ...string) string {
	h := sha256.New()
	write := func(prefix string, names []string) {
		s := slices.Clone(names)
		slices.Sort(s)
		for _, n := range slices.Compact(s) {
			h.Write([]byte(prefix))
			h.Write([]byte(n))
			h.Write([]byte{'\n'})
		}
	}
	write("c:", capabilities)
	write("s:", stages)
	write("e:", events)
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// localNames splits the subjects local programs subscribe to into the
// capabilities (cap.<name>) and stages (work.<name>) they host. Wildcard
// subscriptions and names that are not valid capability names do not
// count; the latter are returned in skipped. Results are sorted, without
// duplicates.
func localNames(subjects []string) (caps, stages, skipped []string) {
	for _, s := range subjects {
		var name string
		var into *[]string
		switch {
		case strings.HasPrefix(s, capSubjectPrefix):
			name, into = s[len(capSubjectPrefix):], &caps
		case strings.HasPrefix(s, workSubjectPrefix):
			name, into = s[len(workSubjectPrefix):], &stages
		default:
			continue
		}
		if strings.ContainsAny(name, "*>") || name == "" {
			continue // wildcards listen; they do not host
		}
		if !ValidCapabilityName(name) {
			skipped = append(skipped, s)
			continue
		}
		*into = append(*into, name)
	}
	for _, l := range []*[]string{&caps, &stages, &skipped} {
		slices.Sort(*l)
		*l = slices.Compact(*l)
	}
	return caps, stages, skipped
}
