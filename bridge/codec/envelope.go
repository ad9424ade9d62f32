// Package codec is the bridge's messages on the wire, with no connection
// state: an Envelope is a delivery from the broker decoded and validated
// (Decode), an Outgoing a message on its way to it; batches carry several
// commands to a message. It holds the names (exchanges, queues, routing
// keys, Meshbox-* headers), the failure reasons and the checks that refuse
// replays (dead-lettered deliveries, events seen before, HandedOut: the
// command ids handed out lately). Nothing here dials, locks a session or
// logs.
//
// Caveats: a check sees one message; what the checks remember (an
// EventMemory, a HandedOut) is the process's memory, gone after a restart.
package codec

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Limits on what crosses the bridge, besides Config.MaxPayload and the
// limits on ids and header keys (wire.MaxIDLen, wire.MaxHeaderKey).
const (
	MaxHeaderBytes = 64 << 10           // all header keys and values of one message
	SealSlack      = 64 + seal.Overhead // a sealed body's framing beyond its headers and body
)

// BrokerHeaders are AMQP headers the broker owns; they are read where they
// mean something (x-delivery-count) and never passed on to NATS.
var BrokerHeaders = []string{
	"x-death", "x-first-death-", "x-last-death-", "x-delivery-count", "x-received-from",
}

func IsBrokerHeader(k string) bool {
	lk := strings.ToLower(k)
	for _, p := range BrokerHeaders {
		if strings.HasPrefix(lk, p) {
			return true
		}
	}
	return false
}

// CallerHeaders checks the headers of a message from a local program and
// returns the ones that travel: every key except the node's own Meshbox-*
// headers and the NATS status pseudo-headers. Content-Type and
// Content-Encoding travel as AMQP properties.
func CallerHeaders(h nats.Header) (nats.Header, error) {
	if len(h) == 0 {
		return nil, nil
	}
	out := make(nats.Header, len(h))
	size := 0
	for k, vs := range h {
		if HasPrefixFold(k, HeaderPrefixMeshbox) || k == "Status" || k == "Description" || ServerHeader(k) {
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
	if size > MaxHeaderBytes {
		return nil, fmt.Errorf("%w: headers are %d bytes, more than %d", ErrBadInput, size, MaxHeaderBytes)
	}
	return out, nil
}

// HeaderPrefixMQTT starts the headers the embedded NATS server puts on
// the messages of its MQTT clients (the QoS and retain flags of a
// publish, its topic): its own bookkeeping on this node, which decides
// how it delivers the message to MQTT subscribers here. Carried to
// another node it would misdirect that node's server (a QoS 1 MQTT
// subscriber there skips a message marked QoS 1, waiting for a stored
// copy that node never made), so it never leaves a node nor enters one.
const HeaderPrefixMQTT = "Nmqtt-"

// ServerHeader reports whether k is such a header.
func ServerHeader(k string) bool { return HasPrefixFold(k, HeaderPrefixMQTT) }

func HasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// Envelope is a validated message from the broker.
type Envelope struct {
	Kind        string
	Name        string // capability, stage, topic or system key
	MsgID       string
	CorrID      string
	replyTo     string
	Origin      string
	Timeout     time.Duration // requests: the caller's time left (0: none given)
	Attempt     int           // commands: 1 for the first delivery
	Redelivered bool
	Verified    bool        // origin is the publisher's broker user (user_id), not a header
	KeyID       string      // sealed with this content key (Meshbox-Key)
	Scope       string      // the scope of that key ("": the mesh's)
	Header      nats.Header // for NATS: caller headers, Content-Type, Content-Encoding
	Body        []byte
	Sent        time.Time
	Retry       Earlier // commands: what an earlier attempt left (retry.go)
	ResultTopic string  // Meshbox-Result-Topic
	// Events: when the sender sealed it (zero: unsealed, or sealed by an
	// older node, which did not stamp it; replay.go).
	SealedAt time.Time
}

// Earlier is what the earlier attempts of a command left in its message
// (retry.go): failed counts the attempts that failed before this message
// was published (a retry copy's Meshbox-Attempts); the rest are the node
// headers that travel with it.
type Earlier struct {
	failed      int
	FirstFail   string // Meshbox-First-Failure
	LastFail    string // Meshbox-Last-Failure
	LastReason  string // Meshbox-Last-Reason (in a mesh that seals, its class)
	FirstOrigin string // Meshbox-First-Origin
	Replayed    string // Meshbox-Replayed (in a mesh that seals, its class)
	// The sealed companions of lastReason and replayed, as they came
	// (reasons.go), and the Meshbox-Replayed the handler sees: replayed,
	// or its sealed text once opened.
	LastReasonSealed string
	ReplayedSealed   string
	ReplayedText     string
}

// Delivery is the part of an amqp.Delivery that decode reads.
type Delivery struct {
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

func FromAMQP(d *amqp.Delivery) Delivery {
	return Delivery{
		Headers: d.Headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo, MessageId: d.MessageId,
		Timestamp: d.Timestamp, Type: d.Type, RoutingKey: d.RoutingKey,
		Redelivered: d.Redelivered, UserId: d.UserId, Body: d.Body,
	}
}

// Malformed is a message the bridge cannot use; it is dead-lettered with
// the reason.
type Malformed struct{ reason string }

func (e *Malformed) Error() string { return "malformed message: " + e.reason }

func Bad(format string, args ...any) error { return &Malformed{reason: fmt.Sprintf(format, args...)} }

// Decode validates a delivery of the given kind and returns its envelope.
// It never panics, whatever the delivery holds.
func Decode(kind string, d Delivery, maxPayload int) (*Envelope, error) {
	if d.Type != kind {
		return nil, Bad("type %q, want %q", d.Type, kind)
	}
	if err := CheckDeaths(kind, d.RoutingKey, d.Headers); err != nil {
		return nil, err // dead-lettered by the broker where meshbox does not (replay.go)
	}
	// A sealed body holds the headers too (checked again once opened).
	if len(d.Body) > maxPayload+MaxHeaderBytes+SealSlack {
		return nil, Bad("payload of %d bytes exceeds the limit of %d", len(d.Body), maxPayload)
	}
	e := &Envelope{Kind: kind, Body: d.Body, Sent: d.Timestamp, Redelivered: d.Redelivered, Attempt: 1}
	var ok bool
	switch kind {
	case TypeRequest:
		// Published straight to the node's request queue (the capability in
		// a header) or through mesh with to.<node>.req.<capability>.
		if _, e.Name, ok = ParseRequestKey(d.RoutingKey); !ok && !strings.HasPrefix(d.RoutingKey, wire.NodePrefix) {
			return nil, Bad("routing key %q is not a request key", d.RoutingKey)
		}
		if !wire.ValidID(d.CorrelationId) {
			return nil, Bad("missing or invalid correlation id")
		}
		if _, ok := ParseReplyQueue(d.ReplyTo); !ok {
			return nil, Bad("reply-to %q is not a node's reply queue", d.ReplyTo)
		}
	case TypeReply:
		if !wire.ValidID(d.CorrelationId) {
			return nil, Bad("missing or invalid correlation id")
		}
	case TypeCommand:
		if e.Name, ok = ParseNamed(d.RoutingKey, wire.CmdPrefix); !ok {
			return nil, Bad("routing key %q is not a command key", d.RoutingKey)
		}
		if !wire.ValidID(d.MessageId) {
			return nil, Bad("missing or invalid message id")
		}
	case TypeEvent:
		if e.Name, ok = ParseNamed(d.RoutingKey, wire.EvtPrefix); !ok {
			return nil, Bad("routing key %q is not an event key", d.RoutingKey)
		}
		if !wire.ValidID(d.MessageId) {
			return nil, Bad("missing or invalid message id")
		}
	case TypeSystem:
		if e.Name, ok = ParseSystemKey(d.RoutingKey); !ok {
			return nil, Bad("routing key %q is not a system key", d.RoutingKey)
		}
	default:
		return nil, Bad("unknown kind %q", kind)
	}
	e.MsgID, e.CorrID, e.replyTo = d.MessageId, d.CorrelationId, d.ReplyTo
	if err := e.decodeHeaders(d); err != nil {
		return nil, err
	}
	if e.KeyID == "" && len(d.Body) > maxPayload {
		return nil, Bad("payload of %d bytes exceeds the limit of %d", len(d.Body), maxPayload)
	}
	// The origin is the node of the publisher's broker user whenever it
	// is one: RabbitMQ refuses a user_id that is not the connection's user,
	// so nobody can claim it. The Meshbox-Origin header counts only in a
	// mesh run on one credential (see session.checkOrigin).
	if node, _, ok := wire.ParseBrokerUser(d.UserId); ok {
		e.Origin, e.Verified = node, true
	}
	if kind == TypeRequest && e.Name == "" {
		return nil, Bad("missing or invalid %s header", HeaderCapability)
	}
	if kind != TypeReply && !ValidNodeName(e.Origin) {
		return nil, Bad("missing or invalid %s header", HeaderOrigin)
	}
	return e, nil
}

// decodeHeaders maps the AMQP headers and properties to NATS headers and
// reads the node's own headers.
func (e *Envelope) decodeHeaders(d Delivery) error {
	var h nats.Header // made at the first header: a sealed message has none outside
	size := 0
	add := func(k, v string) error {
		if !wire.ValidHeaderValue(v) {
			return Bad("header %s has a line break", k)
		}
		size += len(k) + len(v)
		if size > MaxHeaderBytes {
			return Bad("headers exceed %d bytes", MaxHeaderBytes)
		}
		if h == nil {
			h = make(nats.Header, len(d.Headers)+2)
		}
		h[k] = append(h[k], v)
		return nil
	}
	if d.ContentType != "" {
		if err := add(HeaderContentType, d.ContentType); err != nil {
			return err
		}
	}
	if d.ContentEncoding != "" {
		if err := add(HeaderContentEncoding, d.ContentEncoding); err != nil {
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
		if strings.EqualFold(k, HeaderDeliveryCount) {
			if !d.Redelivered {
				// Only the broker's count of a redelivery counts: a
				// publisher cannot make a command look like a retry.
				continue
			}
			n, ok := AsInt(v)
			if !ok || n < 0 {
				return Bad("header %s has type %T, want a non-negative integer", k, v)
			}
			if n < 1<<20 {
				e.Attempt = int(n) + 1
			}
			continue
		}
		if IsBrokerHeader(k) {
			continue
		}
		if strings.EqualFold(k, HeaderOrderKey) && e.Kind == TypeCommand {
			// A command's order key, in a mesh that does not seal (sealed,
			// it travels in the seal): the handler sees it.
			if s, ok := v.(string); !ok || !wire.ValidID(s) {
				return Bad("header %s: %v is not a valid order key", k, v)
			} else if err := add(HeaderOrderKey, s); err != nil {
				return err
			}
			continue
		}
		if HasPrefixFold(k, HeaderPrefixMeshbox) {
			s, ok := v.(string)
			if !ok {
				return Bad("header %s has type %T, want string", k, v)
			}
			switch {
			case strings.EqualFold(k, HeaderOrigin):
				e.Origin = s
			case strings.EqualFold(k, HeaderTimeout):
				t, err := time.ParseDuration(s)
				if err != nil || t <= 0 {
					return Bad("header %s: %q is not a positive duration", k, s)
				}
				e.Timeout = t
			case strings.EqualFold(k, HeaderKey):
				if seal.ValidateKeyID(s) != nil {
					return Bad("header %s: %q is not a key id", k, s)
				}
				e.KeyID = s
			case strings.EqualFold(k, HeaderRedelivered):
				e.Redelivered = e.Redelivered || s == "true"
			case e.Kind == TypeCommand:
				if err := e.commandHeader(k, s); err != nil {
					return err
				}
			case strings.EqualFold(k, HeaderCapability) && e.Kind == TypeRequest:
				if !ValidName(s) {
					return Bad("header %s: %q is not a capability name", k, s)
				}
				if e.Name == "" {
					e.Name = s
				}
			}
			continue
		}
		if !wire.ValidHeaderKey(k) || k == "Status" || k == "Description" {
			return Bad("header key %q is not allowed", k)
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
					return Bad("header %s holds a %T, want strings", k, item)
				}
				if err := add(k, s); err != nil {
					return err
				}
			}
		default:
			return Bad("header %s has type %T, want string", k, v)
		}
	}
	if d.Redelivered && e.Attempt < 2 {
		e.Attempt = 2 // a classic queue does not count; at least the second
	}
	e.Attempt += e.Retry.failed
	if len(h) > 0 {
		e.Header = h
	}
	return nil
}

func AsInt(v any) (int64, bool) {
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
func (e *Envelope) NatsMsg(subject string, meta map[string]string) *nats.Msg {
	m := &nats.Msg{Subject: subject, Data: e.Body}
	if len(e.Header) > 0 || len(meta) > 0 {
		m.Header = make(nats.Header, len(e.Header)+len(meta))
		for k, vs := range e.Header {
			if !ServerHeader(k) { // a peer's word: never the local server's bookkeeping
				m.Header[k] = vs
			}
		}
		for k, v := range meta {
			m.Header.Set(k, v)
		}
	}
	return m
}
