package codec

import (
	"errors"
	"strings"
	"time"

	"github.com/meshbox/meshbox/internal/names"
	"github.com/meshbox/meshbox/internal/wire"
)

// Local NATS subjects.
const (
	SubjCapPrefix  = wire.CapPrefix  // cap.<name>: call a capability wherever it runs
	SubjNodePrefix = wire.NodePrefix // node.<node>.cap.<name>: call it on a named node
	SubjCmdPrefix  = wire.CmdPrefix  // cmd.<stage>: submit a command
	SubjWorkPrefix = wire.WorkPrefix // work.<stage>: local handlers of a stage
	SubjEvtPrefix  = wire.EvtPrefix  // evt.<topic>: events
)

// Broker names. Every name the bridge declares starts with "mesh", "node.",
// "cmd.", "retry." or "dead.": a node name has no dots, so node.<n>.* never
// collides with another node's names or with a stage's queue, and a stage's
// retry and dead-letter queues have prefixes of their own (a stage name may
// hold dots, so cmd.<stage>.retry could be another stage's queue).
const (
	ExchangeMesh  = wire.MeshExchange       // topic: cmd.*, evt.*, sys.*, retry.*, dead.*, to.<node>.*
	ExchangeDLX   = wire.DeadLetterExchange // topic: dead letters, routed by their original key
	QueueDead     = wire.DeadLetterQueue
	QueueCmdPfx   = wire.CmdPrefix
	QueueRetryPfx = "retry."
	QueueDeadPfx  = "dead."
)

// Headers the node reads or adds (the protocol's: wire).
const (
	HeaderOrigin      = wire.HeaderOrigin
	HeaderMsgID       = wire.HeaderMsgID
	HeaderAttempt     = wire.HeaderAttempt
	HeaderRedelivered = wire.HeaderRedelivered
	HeaderProgress    = wire.HeaderProgress
	HeaderTimeout     = wire.HeaderTimeout
	HeaderCapability  = wire.HeaderCapability
	HeaderAccepted    = wire.HeaderAccepted
	HeaderDeadReason  = wire.HeaderDeadReason
	HeaderDeadNode    = wire.HeaderDeadNode
	HeaderDeadQueue   = wire.HeaderDeadQueue
	HeaderDeadAt      = wire.HeaderDeadAt
	HeaderAttempts    = wire.HeaderAttempts
	HeaderFirstFail   = wire.HeaderFirstFail
	HeaderLastFail    = wire.HeaderLastFail
	HeaderLastReason  = wire.HeaderLastReason
	HeaderFirstOrigin = wire.HeaderFirstOrigin
	HeaderReplayed    = wire.HeaderReplayed
	HeaderResultTopic = wire.HeaderResultTopic
	HeaderOrderKey    = wire.HeaderOrderKey
	CodePermanent     = wire.CodePermanent

	HeaderServiceError     = wire.HeaderServiceError
	HeaderServiceErrorCode = wire.HeaderServiceErrorCode
	HeaderContentType      = "Content-Type"
	HeaderContentEncoding  = "Content-Encoding"
	HeaderPrefixMeshbox    = wire.HeaderPrefix
	HeaderDeliveryCount    = "x-delivery-count" // set by quorum queues on redelivery
)

// Message types in the AMQP type property.
const (
	TypeRequest = "request"
	TypeReply   = "reply"
	TypeCommand = "command"
	TypeEvent   = "event"
	TypeSystem  = "system"
)

// ValidNodeName reports whether s is a node name (see package names).
func ValidNodeName(s string) bool { return names.Node(s) == nil }

// ValidName reports whether s can name a capability, stage, topic or system
// key; package names gives the four kinds one grammar.
func ValidName(s string) bool { return names.Capability(s) == nil }

// NodeExchange is the topic exchange of node n.
func NodeExchange(n string) string { return wire.NodeExchange(n) }

// RequestQueue is the queue node n's requests arrive on.
func RequestQueue(n string) string { return wire.RequestQueue(n) }

// ReplyQueue is the queue replies to node n's requests arrive on.
func ReplyQueue(n string) string { return wire.ReplyQueue(n) }

// EventQueue is the queue mesh events for node n wait in.
func EventQueue(n string) string { return wire.EventQueue(n) }

// ClaimQueue is the queue whose exclusive declaration is node n's claim
// on its name (topology.go, claim).
func ClaimQueue(n string) string { return wire.ClaimQueue(n) }

// SystemQueue is the queue system messages for node n arrive on.
func SystemQueue(n string) string { return wire.SystemQueue(n) }

// StageQueue is the command queue of a stage.
func StageQueue(stage string) string { return wire.StageQueue(stage) }

// RetryQueue is the queue a stage's failed commands wait in for their
// next attempt; RetryKey binds it to mesh.
func RetryQueue(stage string) string { return wire.RetryQueue(stage) }

func RetryKey(stage string) string { return wire.RetryKey(stage) }

// DeadQueue is the queue of a stage's dead letters; DeadKey binds it to
// mesh.
func DeadQueue(stage string) string { return wire.DeadQueue(stage) }

func DeadKey(stage string) string { return wire.DeadKey(stage) }

// RequestKey is the routing key of a request for capability name on node n.
func RequestKey(n, name string) string { return "to." + n + ".req." + name }

// RequestBindingKey binds node n's request queue: every capability.
func RequestBindingKey(n string) string { return "to." + n + ".req.#" }

// ParseRequestKey returns the node and capability of a request routing key.
func ParseRequestKey(key string) (node, name string, ok bool) {
	rest, ok := strings.CutPrefix(key, "to.")
	if !ok {
		return "", "", false
	}
	node, name, ok = strings.Cut(rest, ".req.")
	if !ok || !ValidNodeName(node) || !ValidName(name) {
		return "", "", false
	}
	return node, name, true
}

// ParseReplyQueue returns the node of a reply queue name.
func ParseReplyQueue(q string) (node string, ok bool) {
	rest, ok := strings.CutPrefix(q, wire.NodePrefix)
	if !ok {
		return "", false
	}
	node, ok = strings.CutSuffix(rest, ".replies")
	if !ok || !ValidNodeName(node) {
		return "", false
	}
	return node, true
}

// ReplyKey is the routing key of a reply to node n's requests.
func ReplyKey(n string) string { return "to." + n + ".reply" }

// CommandKey is the routing key of a command for stage.
func CommandKey(stage string) string { return wire.CommandKey(stage) }

// EventKey is the routing key of an event on topic.
func EventKey(topic string) string { return wire.EventKey(topic) }

// SystemKey is the routing key of a broadcast system message.
func SystemKey(key string) string { return "sys." + key }

// AddressedSystemKey is the routing key of a system message for node n.
func AddressedSystemKey(n, key string) string { return "to." + n + ".sys." + key }

// ParseNamed returns the name after prefix in key, if it is a valid name.
func ParseNamed(key, prefix string) (string, bool) {
	name, ok := strings.CutPrefix(key, prefix)
	if !ok || !ValidName(name) {
		return "", false
	}
	return name, true
}

// ParseSystemKey returns the system key of a broadcast or addressed system
// message routing key.
func ParseSystemKey(key string) (string, bool) {
	if name, ok := ParseNamed(key, "sys."); ok {
		return name, true
	}
	rest, ok := strings.CutPrefix(key, "to.")
	if !ok {
		return "", false
	}
	node, name, ok := strings.Cut(rest, ".sys.")
	if !ok || !ValidNodeName(node) || !ValidName(name) {
		return "", false
	}
	return name, true
}

// ParseNodeCapSubject splits node.<node>.cap.<name>.
func ParseNodeCapSubject(subj string) (node, name string, ok bool) {
	rest, ok := strings.CutPrefix(subj, SubjNodePrefix)
	if !ok {
		return "", "", false
	}
	node, name, ok = strings.Cut(rest, ".cap.")
	if !ok || !ValidNodeName(node) || !ValidName(name) {
		return "", "", false
	}
	return node, name, true
}

const (
	// EventQueueExpiry deletes the event queue of a node unused this long.
	EventQueueExpiry = 7 * 24 * time.Hour
)

var (
	// ErrBadInput means a message or a name was malformed.
	ErrBadInput = errors.New("bad input")
)
