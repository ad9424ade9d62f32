package wire

import "time"

// Headers the node reads or adds, on NATS and AMQP alike: the words
// programs and peers read, so they are the protocol's.
const (
	HeaderPrefix = "Meshbox-"    // every header of meshbox's own
	HeaderKey    = "Meshbox-Key" // on the broker: the id of the key a message is sealed with

	HeaderOrigin      = "Meshbox-Origin"      // node that published the message
	HeaderMsgID       = "Meshbox-Msg-Id"      // stable message id of a command or event
	HeaderAttempt     = "Meshbox-Attempt"     // 1 for the first delivery of a command
	HeaderRedelivered = "Meshbox-Redelivered" // "true" when this delivery may be a duplicate
	HeaderProgress    = "Meshbox-Progress"    // in a handler's reply: not the result, the handler is still working (extends the lease)
	HeaderTimeout     = "Meshbox-Timeout"     // a request's deadline (Go duration): the caller's, shorter or longer than the node's default up to MaxTimeout; on a request a host receives, the time it has left
	HeaderCapability  = "Meshbox-Capability"  // on the broker: the capability of a request published straight to a node's queue (read, no longer sent: the routing key to.<n>.req.<name> says it, and every meshbox reads it there first)
	HeaderAccepted    = "Meshbox-Accepted"    // in a submit reply: "broker", "outbox" or "local"
	HeaderDeadReason  = "Meshbox-Dead-Reason" // why a message was dead-lettered (sealing: its class; reasons.go)
	HeaderDeadNode    = "Meshbox-Dead-Node"   // which node dead-lettered it
	HeaderDeadQueue   = "Meshbox-Dead-Queue"  // the queue it came from
	HeaderDeadAt      = "Meshbox-Dead-At"     // when it was dead-lettered (RFC 3339, ms): its last failure
	HeaderAttempts    = "Meshbox-Attempts"    // attempts that failed before this delivery (retry copies, dead letters)
	HeaderFirstFail   = "Meshbox-First-Failure"
	HeaderLastFail    = "Meshbox-Last-Failure"  // a retry copy's last failure (RFC 3339, ms)
	HeaderLastReason  = "Meshbox-Last-Reason"   // why a retry copy's last attempt failed (sealing: its class; reasons.go)
	HeaderFirstOrigin = "Meshbox-First-Origin"  // a retry copy or replay: the origin of the command it copies, as the copying node read it
	HeaderReplayed    = "Meshbox-Replayed"      // a replayed dead letter: "<time> by <node> (dead-lettered <time>: <reason>)" (sealing: its class; reasons.go)
	HeaderResultTopic = "Meshbox-Result-Topic"  // on a command: the event topic its handler's result is published on
	HeaderOrderKey    = "Meshbox-Order-Key"     // on a command: commands of one stage with the same key reach a node's handler one at a time, in queue order (sealed)
	HeaderRowsSnap    = "Meshbox-Rows-Snapshot" // on a table's log: the offset a node new to it reads from (the newest complete snapshot its writer knew, and the changes the snapshot may lack)
)

// MaxTimeout bounds the deadline a caller may ask for with HeaderTimeout
// when it is longer than the node's default (its bridge's request timeout): a
// large reply over a slow link, a blob's chunk from a home uplink, needs
// more than the default. A longer one is cut to the larger of this and
// the default.
const MaxTimeout = 2 * time.Minute

// Broker link states (a node's status, broker.state): what a client
// command or a page reads of the link.
const (
	StateNone       = "none"       // no broker configured: a standalone node
	StateConnecting = "connecting" // first attempt after start or a URL change
	StateConnected  = "connected"
	StateOffline    = "offline" // broker unreachable; retrying with backoff
	StateBlocked    = "blocked" // connected, but the broker blocks publishers (resource alarm)
)

// Broker credential states (a node's status, broker.credential.state).
const (
	CredentialInUse     = "in use"             // the link is connected with it
	CredentialSwitching = "switching"          // new connections with a new credential are being made
	CredentialRevoked   = "credential revoked" // the broker refuses at login (403 ACCESS_REFUSED) a user it accepted before
	CredentialRefused   = "credential refused" // the broker refuses at login a user it never accepted here: a wrong password, or no such user
	CredentialUnused    = "not connected"      // not connected yet, or the link is down for another reason
)
