// Package bridge carries a node's traffic between its embedded NATS server
// and the mesh's central RabbitMQ broker, over outbound AMQP connections
// (one for publishing, one for consuming), and keeps a durable outbox while
// the broker is away.
//
// # The model
//
// Local programs speak NATS to the node. The bridge gives three message
// shapes a meaning that survives the trip through the broker:
//
//   - Requests: a program calls cap.<name> (wherever it runs) or
//     node.<node>.cap.<name> (on a named node, this one included). A local
//     host always answers plain calls: the bridge subscribes cap.<name> (a
//     stand-in) only for capabilities routed to other nodes (Config.Routes,
//     SetRoutes) that no local program subscribes. The stand-in forwards the
//     request to the hosting node, whose bridge calls its local cap.<name>
//     and sends the reply back. Every request has a deadline (RequestTimeout,
//     or the caller's Meshbox-Timeout, shorter or longer up to
//     wire.MaxTimeout), which travels with it: the host's bridge gives its
//     program the time left in Meshbox-Timeout. When it passes, the caller gets
//     a 504 error reply; when the link is down, no node hosts the capability,
//     the target node is not connected or discovery marked it gone, the
//     caller gets a 503 error reply at once. Requests are at most once.
//   - Commands: a program requests cmd.<stage>; the reply comes once the
//     command is durable: confirmed by the broker (Meshbox-Accepted: broker)
//     or committed to the outbox (outbox), or, for a stage hosted here while
//     the link is down, committed for local execution (local). On nodes that
//     host the stage (a local program subscribes work.<stage>, or
//     Config.Stages) the bridge calls the handler and acks only after it
//     replied without an error header. A handler working on a long
//     command keeps it by replying first with progress messages (header
//     Meshbox-Progress; lease.go): each moves the attempt's deadline to
//     CommandTimeout from then, up to MaxLease after it was handed out.
//     A failure or a timeout (the deadline passed without a result)
//     requeues the command after a short pause; the next delivery counts
//     the attempt; after RetryBudget attempts it is dead-lettered with the
//     reason. A stage in Config.Retry waits longer instead (retry.go): the
//     failed attempt is published again to the stage's retry queue with
//     the policy's backoff as its expiration, and the broker moves it back
//     to the stage queue when it expires, up to the policy's attempts. A
//     handler's error reply with Nats-Service-Error-Code 422
//     (CodePermanent) is a permanent failure: dead-lettered at once with
//     the handler's error as the reason. Dead letters of a stage hosted
//     here go to its queue dead.<stage>, where DeadLetters,
//     ShowDeadLetter, ReplayDeadLetters and PurgeDeadLetters act on them
//     (deadletters.go). A command with a Meshbox-Result-Topic header has
//     its handler's result (a reply with a body) published as an event on
//     that topic with the command's message id (results.go). Commands are at least once: the handler sees Meshbox-Msg-Id
//     (stable, the submitter may set it), Meshbox-Attempt and
//     Meshbox-Redelivered ("true" whenever the delivery may be a duplicate:
//     the broker redelivered it, the publisher sent it again, or this node
//     handed the same id to a handler before — it remembers the last 8,192
//     ids, because a broker killed at the wrong moment can lose its record
//     of a delivery and redeliver it looking new). A stage in
//     Config.Dedupe has this node remember the ids that completed here
//     (completed.go, a bbolt file of its own): a delivery of one of them
//     within the stage's window is acked without calling the handler. That
//     is per node, not across the mesh.
//   - Events: a program publishes evt.<topic>; local subscribers get it from
//     the NATS server at once, and the bridge forwards it to the mesh. Other
//     nodes republish it to their local subscribers with Meshbox-Origin. A
//     node never sends a mesh event back to the mesh nor redelivers its own
//     event locally.
//
// A local program's Meshbox-* headers are never the node's word: the
// bridge drops them from what it takes from programs (calls, replies,
// commands, events) and sets its own. A program may set a request's
// deadline with Meshbox-Timeout, name its command or event with
// Meshbox-Msg-Id and name a command's result topic with
// Meshbox-Result-Topic; nothing else it sets in that namespace is read. An event
// a program publishes with another node's Meshbox-Origin still goes to the
// mesh, from this node. (Local subscribers see what a program published as
// it was published: on one node's NATS server, only the permissions of
// package programs keep one program from posing as another.)
//
// A local client's reply subject and result topic are its word too: the
// bridge publishes on a client's behalf only where the client could have
// published itself (localclients.go). Config.Local says what the parties
// that may have sent a message may do (the NATS server does not say who
// sent it): a reply subject must be an inbox one of them receives on, a
// result topic one every submitter of the stage may publish. A refused
// message is dropped or answered 403, counted under "forbidden" and
// logged once per cause. Answers go out on Config.Replies, the node's
// responder connection, which may publish on inboxes only.
//
// Error replies use the NATS micro headers Nats-Service-Error and
// Nats-Service-Error-Code: 400 bad input (invalid subject, header or
// timeout, oversized payload), 503 unreachable or no host, 504 deadline
// passed, 507 outbox full, 500 the node failed to store a message. In the
// other direction, a command handler's error reply with code 422 says the
// command must not be tried again.
//
// # Sealing
//
// In a mesh (Config.Keys set: the appliance does whenever a mesh database
// is configured) every request, reply, command and event is sealed before
// it reaches the broker (sealing.go): the body and every application
// header, Content-Type and Content-Encoding included, go inside an
// AES-256-GCM seal under the mesh's current content key (internal/seal),
// named by the Meshbox-Key header. Only what routing needs stays readable:
// the type, the routing key (target node, capability, stage or topic), the
// message and correlation ids, reply-to, expiration, timestamp, user_id and
// the node's own Meshbox-* headers. Those, with the validated origin and
// the key id, are the seal's associated data: a sealed message moved to
// another stage, node, capability or origin does not open. A request's
// deadline is sealed too; one that arrives more than 2 seconds (the clock
// skew nodes may have) after it is refused as expired: late or replayed.
// System messages (discovery, heartbeats) are the node's own and stay
// plain; dead letters keep the sealed body they came with. The reasons of
// a command's failures (Meshbox-Last-Reason, Meshbox-Dead-Reason, and the
// one Meshbox-Replayed quotes) may hold a handler's own error text: the
// header holds the reason's class, in the node's words only, and the text
// goes sealed beside it in <name>-Sealed, bound to the header, the class,
// cmd.<stage>, the message id and the key (reasons.go). A retry copy
// (retry.go) or a replayed dead letter is a new message from the node that
// sends it, sealed again by that node: the broker vouches only for the
// last publisher, which is the origin the seal binds.
//
// A message that does not open is refused by shape: a request gets an
// error reply (400, or 504 for an expired one), a reply fails its request
// at once, a command is dead-lettered with the reason (one sealed with a
// key this node does not hold is first given back, as a failed attempt,
// for a node that holds it or for this one once it has the key), an event
// is dropped. Each is counted in
// meshbox_unseal_failures_total{shape,reason} (reason tampered,
// unknown_key, not_sealed, expired, malformed, wrong_scope) and the first of each cause
// is logged. A node that holds no key to seal with refuses what it would
// send with 503 and says so. The outbox on the node's own disk holds
// messages before they are sealed: sealing happens when a message is
// published, with the key current then.
//
// # Replays
//
// A peer node may declare queues of its own with a dead-letter exchange
// and reject into mesh what they receive: the broker publishes each
// message again with its first publisher's user_id and seal, as often as
// the peer likes (replay.go). Every message dead-lettered carries the
// broker's x-death header, which no publisher can take off. meshbox's own
// topology dead-letters into live traffic only from a stage's retry queue
// back to cmd.<stage>, so a delivery with x-death is refused unless it is
// a command whose every death is "expired" in retry.<stage> of its own
// stage and which carries the retry copy's Meshbox-Attempts: events,
// requests, replies, system messages, batches and every other command
// are dropped (never dead-lettered: a dead letter per replay would let
// the replayer fill the dead-letter queues), counted in
// meshbox_replays_refused_total{shape,reason="dead_lettered"} and logged
// once per cause. A dead letter read by the dead-letter operations keeps
// its x-death: it is the dead letter's, and a replay of it is a new
// message.
//
// What RabbitMQ cannot mark is a message published again with its
// sender's own credential (the broker's operator can set any user's
// password). Against that, in a mesh that seals, an event carries the
// time it was sealed inside its seal (the deadline field, which an older
// node does not read for events), and each node remembers the events it
// accepted, by origin and message id, for eventWindow (the event queue's
// 7-day expiry and the clock skew: the longest a legitimate event waits)
// and at most 131,072 of them: an event of an origin and id it accepted
// within the window is refused as a duplicate, one sealed before the
// window or before the oldest it still remembers as expired (same
// metric). So an event id names one event of its origin: a program that
// sends two events with one Meshbox-Msg-Id has the second dropped by
// every node that delivered the first, and an event the publisher sent
// again after a lost confirm reaches subscribers once. The memory is the
// process's: after a restart a node accepts once more an event it
// accepted before. Events of a node of the previous version carry no
// time: they are accepted (mixed versions keep working during an
// upgrade) and deduplicated by id, with the time they arrived.
//
// Commands are at least once and keep their duplicates marked
// (Meshbox-Redelivered): a replay through a dead-letter exchange is
// refused as above; a command published again with its sender's
// credential is marked as a possible duplicate by a node that handed the
// same id out among its last 8,192 (seen.go), and acked without calling
// the handler within the stage's window when the stage dedupes and the
// id completed on this node (completed.go). Neither spans nodes: on
// another node hosting the stage such a copy runs once more, marked
// only if that node handed the id out before.
//
// # Scopes
//
// A scope is a smaller trust boundary inside the mesh (scopes.go): content
// keys of its own, held by its member nodes only, and capabilities, stages
// and topics bound to it. The keyring (Config.Keys) holds the keys of
// every scope this node is in, tagged with their scope, and the bindings.
// A request, command or event of a bound name is sealed with the scope's
// current key, the scope added to the associated data; a reply is sealed
// with the scope of its request's key. On receipt, a request, command or
// event of a bound name must be sealed with a key of that scope, and one
// of an unbound name with the mesh's: anything else is refused as
// wrong_scope (no downgrade to the mesh's key), as is a bound name at a
// node outside the scope. A node outside a scope refuses its programs'
// calls of the scope's capabilities and submissions to its stages and
// topics with 403 naming the scope (meshbox_scope_refusals_total{kind}),
// and does not consume a scoped stage's queue although a program serves
// it. ScopesChanged re-checks the stages after the scopes change.
//
// # Offline operation and the outbox
//
// Commands and events go straight to the broker while the link is up and
// nothing older waits in the outbox; otherwise they are written to the
// outbox (bbolt, one fsync per group commit: everything that arrived while
// the previous commit ran), and the submitter is answered after the commit.
// The outbox is bounded by OutboxMaxBytes; when full, submitters get 507
// "outbox full" and nothing already accepted is dropped. When the link
// returns, the outbox is drained oldest first, each record deleted once the
// broker confirmed it, so the mesh receives them in the order this node
// accepted them. Before a batch is sent, its highest sequence number is
// persisted: after a crash, records that may have reached the broker go out
// again marked Meshbox-Redelivered. Unconfirmed direct publishes of a lost
// link are moved into the outbox, marked the same way. The outbox file
// records its format (internal/boltfile): a newer meshbox opens an older
// outbox with every record in it, or migrates it; an older one refuses a
// newer outbox (*NewerFormatError) and leaves it untouched.
//
// While the link is down, local requests and events keep working through
// the NATS server, and commands for stages hosted here run locally from the
// outbox with the same attempts and retry budget. A command the broker
// returns as unroutable (no node ever hosted the stage) is refused to its
// submitter with 503 when sent directly, and dead-lettered with the reason
// when it came from the outbox.
//
// # Topology
//
// Every name the bridge declares starts with "mesh", "node.", "cmd.",
// "retry." or "dead.". A node name has no dots, so node.<n>.* never
// collides with another node's names, and a node called "mesh" or "cmd"
// collides with nothing; a stage's retry and dead-letter queues have
// prefixes of their own because a stage name may hold dots (cmd.a.retry
// is stage a.retry's queue).
//
//   - Exchange mesh (topic, durable): all mesh traffic is published here,
//     never to the default exchange (whose write right cannot be scoped per
//     queue) nor to a direct exchange, although either costs the broker
//     less per message: RabbitMQ checks topic permissions (the routing and
//     binding keys a node may use, permissions.go) only on topic exchanges,
//     so on a direct exchange a node could bind its own queue with another
//     stage's or node's key and read a copy of that traffic: commands cmd.<stage>, events evt.<topic>, broadcasts
//     sys.<key>, and to.<node>.* for traffic addressed to one node (requests
//     to.<n>.req.<capability>, replies to.<n>.reply, system messages
//     to.<n>.sys.<key>).
//
// The shared exchanges and mesh.dead belong to the admin in a mesh of
// per-node broker users (permissions.go), and so do the node's durable
// queues (its event queue, its stages' queues: NodeQueues): the bridge
// declares them passively and declares them itself only when it may (a
// mesh run on one credential, a node allowed every stage). A stage served
// here that the broker refuses this node waits, said in the status, and
// is consumed once the admin grants it (SetAllowedStages, grants.go),
// without a restart of the node or of its handlers. A node's
// request, reply and system queues are server-named (amq.gen-*): the
// names below are their names in the protocol (a request's reply-to) and
// for a broker user with an older mesh's permissions. The node binds them
// to mesh with the keys of its own name (to.<n>.*), which its topic
// permissions allow it and no other node; a broker user with an older
// mesh's permissions binds them to that mesh's exchange node.<n> instead,
// which the admin deletes when it applies the current ones: a second
// exchange on the way cost every request and reply a routing step
// (topology.go).
//   - Queue node.<n>.claim, exclusive to the node's consuming connection,
//     never bound or consumed: the node's claim on its name. A second
//     process with the same node name is refused (NodeNameInUseError)
//     instead of silently splitting the node's traffic. On an older
//     mesh's permissions the exclusive request queue node.<n>.requests is
//     the claim.
//   - Queue node.<n>.requests, exclusive to the node's consuming
//     connection, bound to mesh with to.<n>.req.#, consumed with an
//     exclusive consumer. The broker deletes the queue with its connection, at once,
//     even when a broker node of a cluster is stopping (a queue that
//     outlived its connection went on taking messages there for seconds
//     and delivered none, and could not be declared from another broker
//     node meanwhile). A request for a node that is not connected is then
//     an unroutable mandatory message, returned at once, not a channel
//     error: the caller sends it again a few times within 600 ms (2 s for
//     a node that answered lately), while discovery does not mark it gone
//     (a node reconnecting or switching credential binds its new queue),
//     and answers 503 after that (noroute.go). It is consumed without
//     acks: requests are at most once (a returned message was never
//     delivered, so sending it again keeps that), and an ack per request
//     costs the broker work on the critical path. A request a local host is
//     handling when the connection is lost is answered by the next session
//     (503, the outcome unknown; hostcalls.go). A bound on open calls
//     (8 x Prefetch, at least 256) refuses the excess at once with 503.
//   - Queue node.<n>.replies (exclusive like the request queue), bound to
//     mesh with to.<n>.reply: replies to this node's requests, sent to
//     the request's validated origin (never to a reply-to of the
//     publisher's choosing) and accepted only from the node the request
//     was sent to. A reply is mandatory too: one that comes back is sent
//     again for up to 3 s (noroute.go). A per-node queue
//     instead of direct reply-to, because direct reply-to requires
//     publishing on the consuming channel, and the bridge keeps publishing
//     and consuming apart.
//   - Queue node.<n>.events (durable quorum queue, declared by the admin;
//     one a node declared itself expires after 7 days unused), bound to
//     mesh with evt.#: mesh events wait here while the
//     node is away. The node's own events arrive here too and are dropped
//     (no echo). A quorum queue, so that in a broker cluster it is
//     replicated and reachable from every broker node while one is down (a
//     classic queue lives on one node only; eventqueue.go replaces the
//     classic queue of an older meshbox: what waits in it is handed to
//     local subscribers first).
//   - Queue node.<n>.system (exclusive), bound to mesh with sys.# and
//     to.<n>.sys.#: discovery and heartbeats, never kept. A probe
//     (to.<n>.sys.probe, no body, no properties: another node asks the
//     broker whether this one is connected, ProbeNode) arriving here is
//     dropped unread.
//   - Queue cmd.<stage> (durable quorum queue, x-delivery-limit as a
//     backstop, dead-lettering to mesh.dlx; like the event queue, with
//     x-quorum-initial-group-size 3 when Config.URL names three brokers
//     or more, the nodes of a cluster), bound to mesh with cmd.<stage>,
//     declared and consumed by every node hosting the stage (a missing queue
//     is a return). Quorum queues survive a broker restart with their
//     confirmed messages and count redeliveries (x-delivery-count, read only
//     on a delivery the broker marked redelivered: a publisher cannot make a
//     command look like a retry), which is the attempt number.
//   - Queue retry.<stage> (durable quorum queue, no consumer), bound to
//     mesh with retry.<stage>, declared by the nodes hosting a stage with
//     a retry policy: failed attempts wait here for their expiration (the
//     backoff), then dead-letter to mesh with key cmd.<stage>, back to the
//     stage queue (at-least-once dead-lettering, reject-publish overflow).
//     A failed delivery is acked only once its copy here is confirmed.
//   - Queue dead.<stage> (durable, classic: browsing it for a list must
//     not count deliveries), bound to mesh with dead.<stage>, declared by
//     every node hosting the stage: the stage's dead letters, with
//     Meshbox-Dead-Reason, Meshbox-Dead-Node, Meshbox-Dead-Queue,
//     Meshbox-Dead-At, Meshbox-Attempts and Meshbox-First-Failure headers
//     (in a mesh that seals, the reason's class, with the handler's words
//     sealed in Meshbox-Dead-Reason-Sealed: see Sealing).
//     A node whose broker user may not declare retry.<stage> or
//     dead.<stage> (permissions made before them) logs it and goes on
//     without them: immediate requeues, dead letters to mesh.dead.
//   - Exchange mesh.dlx (topic) and queue mesh.dead: the other dead
//     letters (no stage queue to come from, the quorum queues' delivery
//     limit, the outbox's), with the same headers. mesh.dead is a quorum
//     queue (an older mesh's classic one is kept); a node whose broker
//     cannot reach it goes on without it.
//
// The topology is declared again on every connection.
//
// # Credit per stage
//
// A quorum queue hands its messages to its consumers in turn, each up to its
// prefetch (basic.qos with global=false applies per consumer, fixed when it
// starts consuming). A node that holds many commands behind a slow handler
// keeps them from faster nodes hosting the same stage, and a node with
// too little credit cannot keep a fast handler busy across the broker's
// round trip, which on a home link is 20-80 ms. So a stage's credit is
// sized from what the node measures (flow.go): the rate at which its
// handler answers and the link's round trip (the quickest synchronous
// broker call of the session). A delivery's credit comes back a round trip
// after its answer, so a stage with less than rate x round trip commands
// asks for twice that at once; beyond it, the credit is probed: doubled
// for a window and kept when the rate rose, halved for a window while the
// handler holds it all and kept when the rate held, each probe in vain
// waiting twice as long as the last. The credit stays between Prefetch
// (default 32) and MaxStagePrefetch (default 4096) commands. A slow serial
// handler thus stays at Prefetch commands whatever its backlog, a fast
// node takes the rest of a shared stage, and a node 50 ms from the broker
// holds the thousand or so commands its pace needs in flight. Nothing
// changes while a stage is idle, and a new session starts from the credit
// the last one reached. A stage holds a few consumers whose prefetches add
// up to its credit in messages (a message is a command or a batch; credit
// in commands becomes messages with the commands per message measured).
// The consumer manager opens and cancels them on its own goroutine, so a
// change of credit never holds up an ack or a delivery. A cancelled
// consumer gets nothing more from the broker; what it has is handled and
// acked as usual.
//
// # Command batches
//
// Several commands for one stage that wait for the publisher at the same
// moment go out as one broker message of type "commands" (batch.go), up
// to CommandBatch (default 4): the broker's work is per message, and on a
// small machine it bounds the mesh's commands. The publisher never waits
// to fill a batch. Each command in it is sealed on its own, exactly as it
// would have been alone, and the receiver handles each as if it had come
// alone; a failed attempt is published again alone. The batch is acked
// once all its commands are settled; a batch the broker redelivers brings
// all its commands again (marked redelivered). A node sends batches only
// while SetCommandBatching says every peer reads them.
//
// # Message properties
//
// Commands, events, dead letters and system messages are published with
// confirms. Requests, replies and probes are published on a channel of
// their own without confirms: they are at most once and bounded by a
// deadline (a probe asks only for the broker's "no route"), and a confirm
// would tell nothing the reply, the deadline or the return does not;
// returns (no route) still come back at once. A probe is the one message
// without properties (probe.go).
//
// message-id: the command's or event's stable id (requests: the correlation
// id); correlation-id and reply-to: requests and replies; expiration: the
// request's time left, in milliseconds; timestamp: when the node accepted
// the message; user-id: the publisher's broker user, checked by the broker,
// which is where a receiver takes the origin from (origin.go: the node of
// a per-node user; in a mesh run on one credential, the Meshbox-Origin
// header); type: request, reply, command, event or system; delivery
// mode persistent for commands, events and dead letters; content-type and
// content-encoding: the NATS headers Content-Type and Content-Encoding. AMQP
// headers carry the caller's other NATS headers (string values, several
// values as an array) and the node's own: Meshbox-Origin, Meshbox-Timeout
// (requests), Meshbox-Redelivered (a possible duplicate). Broker headers
// (x-death, x-delivery-count, ...) are read where they mean something and not
// passed on. A message that breaks these rules (wrong type, missing ids, bad
// header types or keys, oversized body, unknown routing key) is
// dead-lettered with the reason; the consumer carries on. So is a message
// whose origin is not validated (meshbox_errors_total{kind="forged"}).
//
// # Several brokers
//
// Config.URL may name several brokers, the nodes of a RabbitMQ cluster, as
// URLs separated by commas (internal/brokerurl), all with the same user.
// The link connects to one picked at random, so that the nodes of a mesh
// spread over the cluster; both connections of a session (publishing and
// consuming) go to that one broker. When a connection attempt fails or a
// session is lost, the next attempt goes to the next broker of the list,
// and the wait (backoff with jitter, ReconnectMin..ReconnectMax) grows with
// each round through the whole list, not with each broker tried. A broker
// that does not answer TCP at all is not waited for but probed (probe.go):
// a bare TCP connect every 100-200ms, one at a time, each to the next
// broker of the list, and the next attempt goes as soon as one connects;
// the backoff starts over when a broker found unreachable answers again.
// The topology is declared on every connection, so the node's own queues
// are declared again on whichever broker it reaches; stage queues are quorum
// queues, which the cluster replicates over its nodes. BrokerStatus.URL
// and Broker name the broker the link is on (or tried last), URLs lists
// them all, each history entry names its broker, and Failovers keeps the
// last moves from one broker to another with why the link left. A new
// list (SetURL) that still names the broker in use keeps the session; one
// that names it with another credential switches make before break on it
// (see Credential rotation).
//
// # Credential rotation
//
// A node's broker credential comes in generations (BrokerUser
// node.<n>.g<k>); the appliance hands the bridge the newest one through
// SetURL. When the URL names the same broker and vhost and only the
// credential differs, the link switches make before break (handover in
// credential.go): it opens both new connections while the old session runs
// on — if the broker refuses the new credential, the old session simply
// continues and the switch is tried again — then unbinds the old request
// and reply queues (what is sent meanwhile comes back to its sender and is
// sent again, noroute.go), cancels their consumers once they have what
// reached them, lets the requests it took be answered (at most 5 s),
// holds local programs' new calls for the few milliseconds until the new
// session consumes, stops the old session without failing this node's
// pending requests (their replies come back to the replying node until
// the new reply queue is bound, and are sent again), and declares the
// topology on the new connections. Unacknowledged commands go back to
// their queue when the old connection closes and are delivered again,
// marked as possible duplicates; nothing is lost. Config.OnCredential
// tells the appliance the user the link now uses, so that it can record
// the switch, after which the admin revokes the old generation.
//
// A credential the broker refuses at login (403 ACCESS_REFUSED: the user
// was deleted or its password changed) is not a network failure: the
// status says "credential revoked" (BrokerStatus.Credential), the gauge
// meshbox_broker_credential_revoked is 1, one line is logged per refused
// user, and the link keeps retrying (the bindings may bring a new
// credential) while local work goes on.
//
// # Wiring
//
// The appliance builds the bridge with New (Config.Dial connects to the
// embedded NATS server), starts it after the NATS server and stops it
// before. Its watcher of local interest hands the bridge the cap.* and
// work.* subjects local programs subscribe with SetLocalInterest, before
// Start and on every change, and hands the node the same snapshot only
// after SetLocalInterest returned: by then the queues of new stages exist,
// so a stage is routable before its program's capabilities are advertised.
// SetDeclaredStages takes the stages the node's assigned modules declare
// (their manifests): their queues are declared and bound, now and on every
// reconnect, but not consumed until a local program serves them, so a
// command for an assigned stage waits (watched by the stall alarm) instead
// of finding no route.
// The bridge itself imports no NATS server code and never polls it. Start fails with a
// *NodeNameInUseError when another process holds the node's name; Fatal
// yields one when that happens on a later reconnect and lasts (the node
// should exit non-zero). SetURL follows a moved broker. The node package
// feeds discovery in with SetRoutes and MarkGone, sends its messages with
// PublishSystem and SendSystem (never queued: they fail at once with
// ErrLinkDown when the link is down), and receives other nodes' through
// Config.OnSystem. Status is the broker, outbox, stalls and commands in
// flight part of the node status; the metrics are registered on
// Config.Metrics.
//
// # Concurrency
//
// The parts of the bridge, the files that hold them, and which goroutine
// owns each AMQP channel, mutex and timer: concurrency.go.
package bridge
