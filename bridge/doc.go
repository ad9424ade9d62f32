// Package bridge carries a node's traffic between its embedded NATS server
// and the mesh's central RabbitMQ broker, over outbound AMQP connections,
// and keeps a durable outbox while the broker is away.
//
// Local programs speak NATS; the bridge gives three message shapes a
// meaning that survives the broker: requests (cap.<name>, at most once,
// bounded by a deadline), commands (cmd.<stage>, at least once, retried
// and dead-lettered) and events (evt.<topic>, delivered locally at once and
// at least once to the nodes whose programs listen to the topic, never back
// to their publisher, sent to the broker only when another node listens:
// SetEventInterest, SetEventPeers, SetEventListeners). In a mesh every
// message is sealed before it reaches the broker.
//
// A Bridge is built by New from a Config, started by Start and stopped by
// Close; Status reports the link, the outbox, stalls and the commands in
// flight. DeadLetters, ShowDeadLetter, ReplayDeadLetters and
// PurgeDeadLetters act on a stage's dead letters.
//
// The packages under it are its layers: bridge/codec (messages, names and
// checks, no connection state), bridge/link (every AMQP dial, the link's
// state and loop, a session's publisher, acker and own topology),
// bridge/flow (a stage's credit), bridge/completed (completed ids) and
// bridge/outbox (the durable store).
//
// Caveats: requests are at most once; commands are at least once and a
// handler may see a command twice, marked Meshbox-Redelivered for an id
// among the last 32,768 this node handed out; a stage's deduplication is
// per node, not across the mesh. Start fails with a *NodeNameInUseError
// when another process holds the node's name. A local program's Meshbox-*
// headers are never the node's word.
//
// How it works, the concurrency rules and a map of its files:
// docs/internals-bridge.md.
package bridge
