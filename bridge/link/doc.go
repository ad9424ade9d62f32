// Package link is the one way in to the broker and the state of a node's
// broker link, below the bridge's session and shapes.
//
// Every AMQP connection of a node is dialled here (Dial, DialRaw,
// DialCorked): the bridge's link and the connections beside it (the
// tables of rows) as the doctor's check. The TLS settings, the CA file,
// the client certificate (SASL EXTERNAL, LoginUser), the timeouts and the
// connection names live here once. CorkConn batches the writes of a
// run of messages or acks into one system call.
//
// A Link is the link's state: the list of brokers and the one in use
// (failover moves to the next), the state with its history and failovers,
// the credential in use and a make-before-break switch under way
// (BeginHandover), the generations of sessions and the extra connections
// opened beside them. AwaitBroker probes a broker that does not answer
// TCP until it does.
//
// Caveats: a Link holds no session and opens none; the bridge's link loop
// owns the sessions and tells the Link what happened. Every URL of a list
// has the same user.
package link
