package bridge

// Concurrency: the parts of the bridge, the files that hold them, and who
// owns what. (The package documentation, doc.go, is the model: what local
// programs, peers and the broker see.)
//
// The files follow the parts: link.go (the link loop, the link's state),
// dialer.go (the link's dials through package bridge/link, where every
// connection's dial is: TLS, the client certificate; the extra
// connections and the link's generations), probe.go (probing a
// broker that does not answer),
// brokers.go (the list of brokers, failovers),
// credential.go (the credential in use, the handover), session.go (one
// stay on the broker), outgoing.go (a message on its way to the broker)
// and envelope.go (a message from it, validated), sealing.go (sealing and
// opening program messages), setup.go (a session's setup, its steps
// side by side), topology.go (declarations, stage queues), publish.go
// (the publish pipeline), consume.go (the acker and the consumer
// manager), flow.go (the credit of each stage: its consumers), order.go
// (commands in order by key),
// reasons.go (failure reasons: their classes and sealed texts),
// corkconn.go (the publishing socket's batched writes), requests.go (a
// local program calling another node) and hostcalls.go (another node
// calling a local program), commands.go, events.go (the other two
// shapes), lease.go (handlers' progress, commands in flight),
// completed.go (completed ids of deduping stages), replay.go (replays
// refused: dead-lettered deliveries, events seen before), retry.go (retry
// policies, permanent failures, the stage's extra queues), deadletters.go
// (acting on dead letters), results.go (results as events), submit.go
// (submissions and the outbox drainer; the durable store itself is
// package outbox), stalls.go, interest.go (stand-ins and hosted stages),
// grants.go (the stages the mesh allows this node; refused ones tried
// again),
// batch.go (commands carried several to a message), and hops.go with
// hoptrace.go (the points of a request's round trip, recorded only in a
// build with the hoptrace tag, for `make bench-hops`).
//
// Bridge's state is grouped by the part that owns it, each a struct of its
// own with its own mutex, and a mutex guards only fields of its own
// struct: the link (URL, state, history, blocked reason, the current
// session), the submissions (sequence numbers, mesh records pending,
// wake-ups), the requests and the commands that outlive a session, the
// peers' credentials, the permissions learnt from the broker, the outbox
// (its counters and reservations behind its own methods), and routing and
// hosting. A session is cut the same way: its publishing connection, its
// consuming connection, its stage flows and its local calls.
//
// A session holds two AMQP connections: a publishing one and a consuming
// one, so that a broker that blocks publishers under a memory or disk alarm
// does not stall this node's acks (the link state is then "blocked", with
// the broker's reason in BrokerStatus.Blocked). A session is never reused:
// when any of its parts fails, the whole session is torn down and runLink
// (the one goroutine that owns the link) opens a new one with backoff and
// jitter (internal/backoff), or, while the broker does not answer, as soon
// as a probe finds it answering. Opening a session (both connections, the
// topology, the first consumers) is bounded: a broker that stalls during
// setup has its sockets closed under it. Inside a session each AMQP channel
// has one owner goroutine:
//
//   - the publish channel (confirm mode, publishing connection) belongs to
//     the publisher, which takes items from its queue (senders wait only
//     for room, never for the publisher), in order, with at most
//     publishWindow unconfirmed; the confirmer drains confirms and returns
//     (always, until the library closes them) and settles each item exactly
//     once (a return always precedes its confirm);
//   - the request channel (no confirms, publishing connection) belongs to
//     the fast publisher: requests and replies; its returns are drained by
//     their own goroutine; the connection's blocked notifications by
//     another. Both publishers cork the publishing connection's socket
//     (corkconn.go) while they hand a run of items to the library, which
//     would otherwise write every message with a system call of its own:
//     the run goes out with one;
//   - the acked consume channel (events, commands; consuming connection)
//     is shared by two goroutines: the acker acks (a run of settled
//     deliveries with one multiple ack: only acked consumers use this
//     channel, so its delivery tags are dense; it lets acks gather for up
//     to 500 µs and writes them through the corked socket of the consuming
//     connection, since each ack frame costs the broker a settle on the
//     quorum queue and this node a system call) and requeues, never
//     waiting on the broker; the consumer manager opens and cancels stage
//     consumers (declaring stage queues on a channel of its own, since a
//     failed declaration closes its channel) as each stage's credit asks
//     (see Credit per stage), each a broker round trip that holds up no
//     ack; the unacked
//     consume channel (requests, replies, system messages) is set up with
//     the session and then only read from; one reader goroutine per
//     consumer handles its deliveries inline: events in order, replies,
//     system messages, and requests and commands, which are passed to the
//     local host or handler without waiting: the answer comes back on one
//     of the session's NATS inbox subscriptions, or a timer settles it
//     (deadline, retry pause, a poll for a missing handler). Whoever
//     settles a delivery sends its ack to the owner. Timers and the few
//     goroutines that wait (dead letters) are tracked, and a session's stop
//     waits for them;
//   - the stall checker owns a channel for passive queue inspections
//     (stage queues, and the dead-letter queues of hosted stages);
//   - each dead-letter operation (deadletters.go) opens a channel of its
//     own on the consuming connection and closes it before it returns:
//     what it took without acking goes back to the queue in order. It
//     publishes replays through the session's publisher.
//
// The session's context is cancelled when it ends; workers stop, and
// whatever was handed to the publisher and not confirmed is settled with
// ErrLinkDown. Submissions are ordered under one mutex (the submissions'
// mu) that is held while handing a message to the publisher; settle
// callbacks run on the confirmer and never take it. The outbox has one
// writer goroutine; its callbacks run after the commit; waiting for a
// commit always takes a context, and Close waits for the writer at most a
// bounded time (a hung disk makes it return ErrOutboxStuck). The bridge's
// own goroutines (link loop, reconciler of stand-ins, local
// command runner, system message dispatcher, pruner of completed ids) exit
// when Close closes quit; the link loop first cancels the stage consumers
// and gives the commands at the local handlers up to a second to settle
// (session.drainCommands), so that a graceful stop acks what its handlers
// finished instead of leaving it to be delivered again. Close returns
// after they and every session goroutine are gone.
//
// Correlation, message and call ids are 128 random bits (crypto/rand):
// nothing in one id tells another.
//
// The bridge's timers and clocks are the time package's, with no clock of
// its own to pass around: the rules that depend on time alone (stalls,
// leases, a stage's credit) are tested in a testing/synctest bubble,
// whose fake clock moves the moment every goroutine in it waits, so a
// rule over minutes runs in milliseconds. What also waits on the broker
// is tested against a real one.
