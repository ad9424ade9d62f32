package bridge

import (
	"strings"

	"github.com/meshbox/meshbox/internal/names"
	"github.com/meshbox/meshbox/internal/wire"
)

// Local NATS subjects.
const (
	subjCapPrefix  = wire.CapPrefix  // cap.<name>: call a capability wherever it runs
	subjNodePrefix = wire.NodePrefix // node.<node>.cap.<name>: call it on a named node
	subjCmdPrefix  = wire.CmdPrefix  // cmd.<stage>: submit a command
	subjWorkPrefix = wire.WorkPrefix // work.<stage>: local handlers of a stage
	subjEvtPrefix  = wire.EvtPrefix  // evt.<topic>: events
)

// Broker names. Every name the bridge declares starts with "mesh", "node.",
// "cmd.", "retry." or "dead.": a node name has no dots, so node.<n>.* never
// collides with another node's names or with a stage's queue, and a stage's
// retry and dead-letter queues have prefixes of their own (a stage name may
// hold dots, so cmd.<stage>.retry could be another stage's queue).
const (
	exchangeMesh  = wire.MeshExchange       // topic: cmd.*, evt.*, sys.*, retry.*, dead.*, to.<node>.*
	exchangeDLX   = wire.DeadLetterExchange // topic: dead letters, routed by their original key
	queueDead     = wire.DeadLetterQueue
	queueCmdPfx   = wire.CmdPrefix
	queueRetryPfx = "retry."
	queueDeadPfx  = "dead."
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

	headerServiceError     = wire.HeaderServiceError
	headerServiceErrorCode = wire.HeaderServiceErrorCode
	headerContentType      = "Content-Type"
	headerContentEncoding  = "Content-Encoding"
	headerPrefixMeshbox    = wire.HeaderPrefix
	headerDeliveryCount    = "x-delivery-count" // set by quorum queues on redelivery
)

// Message types in the AMQP type property.
const (
	typeRequest = "request"
	typeReply   = "reply"
	typeCommand = "command"
	typeEvent   = "event"
	typeSystem  = "system"
)

// validNodeName reports whether s is a node name (see package names).
func validNodeName(s string) bool { return names.Node(s) == nil }

// validName reports whether s can name a capability, stage, topic or system
// key; package names gives the four kinds one grammar.
func validName(s string) bool { return names.Capability(s) == nil }

// nodeExchange is the topic exchange of node n.
func nodeExchange(n string) string { return wire.NodeExchange(n) }

// requestQueue is the queue node n's requests arrive on.
func requestQueue(n string) string { return wire.RequestQueue(n) }

// replyQueue is the queue replies to node n's requests arrive on.
func replyQueue(n string) string { return wire.ReplyQueue(n) }

// eventQueue is the queue mesh events for node n wait in.
func eventQueue(n string) string { return wire.EventQueue(n) }

// claimQueue is the queue whose exclusive declaration is node n's claim
// on its name (topology.go, claim).
func claimQueue(n string) string { return wire.ClaimQueue(n) }

// systemQueue is the queue system messages for node n arrive on.
func systemQueue(n string) string { return wire.SystemQueue(n) }

// stageQueue is the command queue of a stage.
func stageQueue(stage string) string { return wire.StageQueue(stage) }

// retryQueue is the queue a stage's failed commands wait in for their
// next attempt; retryKey binds it to mesh.
func retryQueue(stage string) string { return wire.RetryQueue(stage) }
func retryKey(stage string) string   { return wire.RetryKey(stage) }

// deadQueue is the queue of a stage's dead letters; deadKey binds it to
// mesh.
func deadQueue(stage string) string { return wire.DeadQueue(stage) }
func deadKey(stage string) string   { return wire.DeadKey(stage) }

// requestKey is the routing key of a request for capability name on node n.
func requestKey(n, name string) string { return "to." + n + ".req." + name }

// requestBindingKey binds node n's request queue: every capability.
func requestBindingKey(n string) string { return "to." + n + ".req.#" }

// parseRequestKey returns the node and capability of a request routing key.
func parseRequestKey(key string) (node, name string, ok bool) {
	rest, ok := strings.CutPrefix(key, "to.")
	if !ok {
		return "", "", false
	}
	node, name, ok = strings.Cut(rest, ".req.")
	if !ok || !validNodeName(node) || !validName(name) {
		return "", "", false
	}
	return node, name, true
}

// parseReplyQueue returns the node of a reply queue name.
func parseReplyQueue(q string) (node string, ok bool) {
	rest, ok := strings.CutPrefix(q, wire.NodePrefix)
	if !ok {
		return "", false
	}
	node, ok = strings.CutSuffix(rest, ".replies")
	if !ok || !validNodeName(node) {
		return "", false
	}
	return node, true
}

// replyKey is the routing key of a reply to node n's requests.
func replyKey(n string) string { return "to." + n + ".reply" }

// commandKey is the routing key of a command for stage.
func commandKey(stage string) string { return wire.CommandKey(stage) }

// eventKey is the routing key of an event on topic.
func eventKey(topic string) string { return wire.EventKey(topic) }

// systemKey is the routing key of a broadcast system message.
func systemKey(key string) string { return "sys." + key }

// addressedSystemKey is the routing key of a system message for node n.
func addressedSystemKey(n, key string) string { return "to." + n + ".sys." + key }

// parseNamed returns the name after prefix in key, if it is a valid name.
func parseNamed(key, prefix string) (string, bool) {
	name, ok := strings.CutPrefix(key, prefix)
	if !ok || !validName(name) {
		return "", false
	}
	return name, true
}

// parseSystemKey returns the system key of a broadcast or addressed system
// message routing key.
func parseSystemKey(key string) (string, bool) {
	if name, ok := parseNamed(key, "sys."); ok {
		return name, true
	}
	rest, ok := strings.CutPrefix(key, "to.")
	if !ok {
		return "", false
	}
	node, name, ok := strings.Cut(rest, ".sys.")
	if !ok || !validNodeName(node) || !validName(name) {
		return "", false
	}
	return name, true
}

// parseNodeCapSubject splits node.<node>.cap.<name>.
func parseNodeCapSubject(subj string) (node, name string, ok bool) {
	rest, ok := strings.CutPrefix(subj, subjNodePrefix)
	if !ok {
		return "", "", false
	}
	node, name, ok = strings.Cut(rest, ".cap.")
	if !ok || !validNodeName(node) || !validName(name) {
		return "", "", false
	}
	return node, name, true
}
