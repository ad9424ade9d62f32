// Package link is the one way in to the broker and the link to it, below
// the bridge's session and shapes: it knows AMQP connections, channels,
// queues and credentials, and nothing of what a message means.
//
// Every AMQP connection of a node is dialled here (Dial, DialCorked,
// DialPair for a session's two): the TLS settings, the CA file, the client
// certificate (SASL EXTERNAL, LoginUser), the timeouts and the connection
// names live here once. CorkConn batches the writes of a run of messages
// or acks into one system call.
//
// The types: a Link is the link's state (the list of brokers and the one
// in use, the state with its history and failovers, the credential, the
// generations of sessions and the extra connections); a Loop runs it
// (connect, reconnect with backoff, fail over, probe a broker that does
// not answer, hand over to a new credential) over the bridge's sessions.
// Inside a session, a Publisher owns the publishing connection, an Acker
// settles the acked consume channel, Workers track the work on
// deliveries, and Own declares the node's own topology (its claim on its
// name, its queues, the event queue), learning its permissions in Perms.
// Metrics are the link's collectors.
//
// Caveats: the Loop's, Publisher's and Acker's goroutines are their
// callers'; each says when it exits. What a message says, seals and means
// is the bridge's, asked through hooks (PublisherHooks, Loop): a hook must
// not block for long. Every URL of a broker list has the same user.
package link
