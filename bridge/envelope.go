package bridge

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/internal/wire"
)

// Limits on what crosses the bridge, besides Config.MaxPayload and the
// limits on ids and header keys (wire.MaxIDLen, wire.MaxHeaderKey).
const (
	maxHeaderBytes = 64 << 10           // all header keys and values of one message
	sealSlack      = 64 + seal.Overhead // a sealed body's framing beyond its headers and body
)

// brokerHeaders are AMQP headers the broker owns; they are read where they
// mean something (x-delivery-count) and never passed on to NATS.
var brokerHeaders = []string{
	"x-death", "x-first-death-", "x-last-death-", "x-delivery-count", "x-received-from",
}

func isBrokerHeader(k string) bool {
	lk := strings.ToLower(k)
	for _, p := range brokerHeaders {
		if strings.HasPrefix(lk, p) {
			return true
		}
	}
	return false
}

// callerHeaders checks the headers of a message from a local program and
// returns the ones that travel: every key except the node's own Meshbox-*
// headers and the NATS status pseudo-headers. Content-Type and
// Content-Encoding travel as AMQP properties.
func callerHeaders(h nats.Header) (nats.Header, error) {
	if len(h) == 0 {
		return nil, nil
	}
	out := make(nats.Header, len(h))
	size := 0
	for k, vs := range h {
		if hasPrefixFold(k, headerPrefixMeshbox) || k == "Status" || k == "Description" || serverHeader(k) {
			continue
		}
		if k == "CC" || k == "BCC" {
			return nil, fmt.Errorf("%w: header %s is reserved by the broker", ErrBadInput, k)
		}
		if !wire.ValidHeaderKey(k) {
			return nil, fmt.Errorf("%w: header key %q is not valid", ErrBadInput, k)
		}
		for _, v := range vs {
			if !wire.ValidHeaderValue(v) {
				return nil, fmt.Errorf("%w: header %s has a line break", ErrBadInput, k)
			}
			size += len(k) + len(v)
		}
		out[k] = append([]string(nil), vs...)
	}
	if size > maxHeaderBytes {
		return nil, fmt.Errorf("%w: headers are %d bytes, more than %d", ErrBadInput, size, maxHeaderBytes)
	}
	return out, nil
}

// headerPrefixMQTT starts the headers the embedded NATS server puts on
// the messages of its MQTT clients (the QoS and retain flags of a
// publish, its topic): its own bookkeeping on this node, which decides
// how it delivers the message to MQTT subscribers here. Carried to
// another node it would misdirect that node's server (a QoS 1 MQTT
// subscriber there skips a message marked QoS 1, waiting for a stored
// copy that node never made), so it never leaves a node nor enters one.
const headerPrefixMQTT = "Nmqtt-"

// serverHeader reports whether k is such a header.
func serverHeader(k string) bool { return hasPrefixFold(k, headerPrefixMQTT) }

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// envelope is a validated message from the broker.
type envelope struct {
	kind        string
	name        string // capability, stage, topic or system key
	msgID       string
	corrID      string
	replyTo     string
	origin      string
	timeout     time.Duration // requests: the caller's time left (0: none given)
	attempt     int           // commands: 1 for the first delivery
	redelivered bool
	verified    bool        // origin is the publisher's broker user (user_id), not a header
	keyID       string      // sealed with this content key (Meshbox-Key)
	scope       string      // the scope of that key ("": the mesh's)
	header      nats.Header // for NATS: caller headers, Content-Type, Content-Encoding
	body        []byte
	sent        time.Time
	retry       earlier // commands: what an earlier attempt left (retry.go)
	resultTopic string  // Meshbox-Result-Topic
	// Events: when the sender sealed it (zero: unsealed, or sealed by an
	// older node, which did not stamp it; replay.go).
	sealedAt time.Time
}

// earlier is what the earlier attempts of a command left in its message
// (retry.go): failed counts the attempts that failed before this message
// was published (a retry copy's Meshbox-Attempts); the rest are the node
// headers that travel with it.
type earlier struct {
	failed      int
	firstFail   string // Meshbox-First-Failure
	lastFail    string // Meshbox-Last-Failure
	lastReason  string // Meshbox-Last-Reason (in a mesh that seals, its class)
	firstOrigin string // Meshbox-First-Origin
	replayed    string // Meshbox-Replayed (in a mesh that seals, its class)
	// The sealed companions of lastReason and replayed, as they came
	// (reasons.go), and the Meshbox-Replayed the handler sees: replayed,
	// or its sealed text once opened.
	lastReasonSealed string
	replayedSealed   string
	replayedText     string
}

// delivery is the part of an amqp.Delivery that decode reads.
type delivery struct {
	Headers         amqp.Table
	ContentType     string
	ContentEncoding string
	CorrelationId   string
	ReplyTo         string
	MessageId       string
	Timestamp       time.Time
	Type            string
	RoutingKey      string
	Redelivered     bool
	UserId          string // set by the publisher, checked by the broker against its connection's user
	Body            []byte
}

func fromAMQP(d *amqp.Delivery) delivery {
	return delivery{
		Headers: d.Headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo, MessageId: d.MessageId,
		Timestamp: d.Timestamp, Type: d.Type, RoutingKey: d.RoutingKey,
		Redelivered: d.Redelivered, UserId: d.UserId, Body: d.Body,
	}
}

// malformed is a message the bridge cannot use; it is dead-lettered with
// the reason.
type malformed struct{ reason string }

func (e *malformed) Error() string { return "malformed message: " + e.reason }

func bad(format string, args ...any) error { return &malformed{reason: fmt.Sprintf(format, args...)} }

// decode validates a delivery of the given kind and returns its envelope.
// It never panics, whatever the delivery holds.
func decode(kind string, d delivery, maxPayload int) (*envelope, error) {
	if d.Type != kind {
		return nil, bad("type %q, want %q", d.Type, kind)
	}
	if err := checkDeaths(kind, d.RoutingKey, d.Headers); err != nil {
		return nil, err // dead-lettered by the broker where meshbox does not (replay.go)
	}
	// A sealed body holds the headers too (checked again once opened).
	if len(d.Body) > maxPayload+maxHeaderBytes+sealSlack {
		return nil, bad("payload of %d bytes exceeds the limit of %d", len(d.Body), maxPayload)
	}
	e := &envelope{kind: kind, body: d.Body, sent: d.Timestamp, redelivered: d.Redelivered, attempt: 1}
	var ok bool
	switch kind {
	case typeRequest:
		// Published straight to the node's request queue (the capability in
		// a header) or through mesh with to.<node>.req.<capability>.
		if _, e.name, ok = parseRequestKey(d.RoutingKey); !ok && !strings.HasPrefix(d.RoutingKey, wire.NodePrefix) {
			return nil, bad("routing key %q is not a request key", d.RoutingKey)
		}
		if !wire.ValidID(d.CorrelationId) {
			return nil, bad("missing or invalid correlation id")
		}
		if _, ok := parseReplyQueue(d.ReplyTo); !ok {
			return nil, bad("reply-to %q is not a node's reply queue", d.ReplyTo)
		}
	case typeReply:
		if !wire.ValidID(d.CorrelationId) {
			return nil, bad("missing or invalid correlation id")
		}
	case typeCommand:
		if e.name, ok = parseNamed(d.RoutingKey, wire.CmdPrefix); !ok {
			return nil, bad("routing key %q is not a command key", d.RoutingKey)
		}
		if !wire.ValidID(d.MessageId) {
			return nil, bad("missing or invalid message id")
		}
	case typeEvent:
		if e.name, ok = parseNamed(d.RoutingKey, wire.EvtPrefix); !ok {
			return nil, bad("routing key %q is not an event key", d.RoutingKey)
		}
		if !wire.ValidID(d.MessageId) {
			return nil, bad("missing or invalid message id")
		}
	case typeSystem:
		if e.name, ok = parseSystemKey(d.RoutingKey); !ok {
			return nil, bad("routing key %q is not a system key", d.RoutingKey)
		}
	default:
		return nil, bad("unknown kind %q", kind)
	}
	e.msgID, e.corrID, e.replyTo = d.MessageId, d.CorrelationId, d.ReplyTo
	if err := e.decodeHeaders(d); err != nil {
		return nil, err
	}
	if e.keyID == "" && len(d.Body) > maxPayload {
		return nil, bad("payload of %d bytes exceeds the limit of %d", len(d.Body), maxPayload)
	}
	// The origin is the node of the publisher's broker user whenever it
	// is one: RabbitMQ refuses a user_id that is not the connection's user,
	// so nobody can claim it. The Meshbox-Origin header counts only in a
	// mesh run on one credential (see session.checkOrigin).
	if node, _, ok := ParseBrokerUser(d.UserId); ok {
		e.origin, e.verified = node, true
	}
	if kind == typeRequest && e.name == "" {
		return nil, bad("missing or invalid %s header", HeaderCapability)
	}
	if kind != typeReply && !validNodeName(e.origin) {
		return nil, bad("missing or invalid %s header", HeaderOrigin)
	}
	return e, nil
}

// decodeHeaders maps the AMQP headers and properties to NATS headers and
// reads the node's own headers.
func (e *envelope) decodeHeaders(d delivery) error {
	var h nats.Header // made at the first header: a sealed message has none outside
	size := 0
	add := func(k, v string) error {
		if !wire.ValidHeaderValue(v) {
			return bad("header %s has a line break", k)
		}
		size += len(k) + len(v)
		if size > maxHeaderBytes {
			return bad("headers exceed %d bytes", maxHeaderBytes)
		}
		if h == nil {
			h = make(nats.Header, len(d.Headers)+2)
		}
		h[k] = append(h[k], v)
		return nil
	}
	if d.ContentType != "" {
		if err := add(headerContentType, d.ContentType); err != nil {
			return err
		}
	}
	if d.ContentEncoding != "" {
		if err := add(headerContentEncoding, d.ContentEncoding); err != nil {
			return err
		}
	}
	// Sorted, so that the same delivery always fails the same way.
	var buf [8]string // no allocation for the usual few headers
	keys := buf[:0]
	for k := range d.Headers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := d.Headers[k]
		if strings.EqualFold(k, headerDeliveryCount) {
			if !d.Redelivered {
				// Only the broker's count of a redelivery counts: a
				// publisher cannot make a command look like a retry.
				continue
			}
			n, ok := asInt(v)
			if !ok || n < 0 {
				return bad("header %s has type %T, want a non-negative integer", k, v)
			}
			if n < 1<<20 {
				e.attempt = int(n) + 1
			}
			continue
		}
		if isBrokerHeader(k) {
			continue
		}
		if strings.EqualFold(k, HeaderOrderKey) && e.kind == typeCommand {
			// A command's order key, in a mesh that does not seal (sealed,
			// it travels in the seal): the handler sees it.
			if s, ok := v.(string); !ok || !wire.ValidID(s) {
				return bad("header %s: %v is not a valid order key", k, v)
			} else if err := add(HeaderOrderKey, s); err != nil {
				return err
			}
			continue
		}
		if hasPrefixFold(k, headerPrefixMeshbox) {
			s, ok := v.(string)
			if !ok {
				return bad("header %s has type %T, want string", k, v)
			}
			switch {
			case strings.EqualFold(k, HeaderOrigin):
				e.origin = s
			case strings.EqualFold(k, HeaderTimeout):
				t, err := time.ParseDuration(s)
				if err != nil || t <= 0 {
					return bad("header %s: %q is not a positive duration", k, s)
				}
				e.timeout = t
			case strings.EqualFold(k, HeaderKey):
				if seal.ValidateKeyID(s) != nil {
					return bad("header %s: %q is not a key id", k, s)
				}
				e.keyID = s
			case strings.EqualFold(k, HeaderRedelivered):
				e.redelivered = e.redelivered || s == "true"
			case e.kind == typeCommand:
				if err := e.commandHeader(k, s); err != nil {
					return err
				}
			case strings.EqualFold(k, HeaderCapability) && e.kind == typeRequest:
				if !validName(s) {
					return bad("header %s: %q is not a capability name", k, s)
				}
				if e.name == "" {
					e.name = s
				}
			}
			continue
		}
		if !wire.ValidHeaderKey(k) || k == "Status" || k == "Description" {
			return bad("header key %q is not allowed", k)
		}
		switch v := v.(type) {
		case string:
			if err := add(k, v); err != nil {
				return err
			}
		case []any:
			for _, item := range v {
				s, ok := item.(string)
				if !ok {
					return bad("header %s holds a %T, want strings", k, item)
				}
				if err := add(k, s); err != nil {
					return err
				}
			}
		default:
			return bad("header %s has type %T, want string", k, v)
		}
	}
	if d.Redelivered && e.attempt < 2 {
		e.attempt = 2 // a classic queue does not count; at least the second
	}
	e.attempt += e.retry.failed
	if len(h) > 0 {
		e.header = h
	}
	return nil
}

func asInt(v any) (int64, bool) {
	switch n := v.(type) {
	case int:
		return int64(n), true
	case int8:
		return int64(n), true
	case int16:
		return int64(n), true
	case int32:
		return int64(n), true
	case int64:
		return n, true
	case uint8:
		return int64(n), true
	case uint16:
		return int64(n), true
	case uint32:
		return int64(n), true
	}
	return 0, false
}

// natsMsg builds the NATS message for subject from an envelope, with the
// node's headers in meta.
func (e *envelope) natsMsg(subject string, meta map[string]string) *nats.Msg {
	m := &nats.Msg{Subject: subject, Data: e.body}
	if len(e.header) > 0 || len(meta) > 0 {
		m.Header = make(nats.Header, len(e.header)+len(meta))
		for k, vs := range e.header {
			if !serverHeader(k) { // a peer's word: never the local server's bookkeeping
				m.Header[k] = vs
			}
		}
		for k, v := range meta {
			m.Header.Set(k, v)
		}
	}
	return m
}
