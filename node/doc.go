// Package node is a node's view of the mesh: what the local programs host,
// which peers exist and what they host, and which capabilities the bridge
// must stand in for.
//
// # Model
//
// A local program hosts capability <name> by subscribing to cap.<name> on
// the node's embedded NATS server — a plain subscription, a queue group or
// a NATS micro endpoint all count — and serves command stage <stage> by
// subscribing to work.<stage>. Nobody registers anything: the appliance
// watches the server's subscriptions and hands the node the cap.* and
// work.* subjects of every connection but its own with SetLocal, the same
// snapshot and at the same moment as the bridge, so the bridge's
// stand-ins never count as local hosts. The node imports no NATS server
// code. Wildcard subscriptions (cap.*, cap.>, >) listen but do not host.
// Names are one or more
// dot-separated tokens of letters, digits, '-' and '_' (at most 128
// characters); a subscription with another name is not advertised and is
// logged once.
//
// Each peer is in one of three states:
//
//   - up: a message from it arrived within the heartbeat window
//     (MissedHeartbeats × the peer's heartbeat interval), and the broker
//     still routes to it;
//   - gone: it said bye, it stayed silent for the whole window, or the
//     broker had no route to it (its connection, and with it its system
//     queue, is gone);
//   - expected-but-absent: the bindings' node records (SetExpected) name
//     it, and it was never heard from.
//
// A gone peer returns to up with its next message. A gone peer that is
// not expected is forgotten after GoneRetention (24 h).
//
// From the view the node derives the routes it hands the bridge with
// Link.SetRoutes: each capability hosted by at least one up peer, and not
// hosted locally, with its hosts (sorted). A local host wins for plain
// calls, so a capability hosted here is never routed; a caller reaches a
// named node with node.<node>.cap.<name>, which the bridge handles. For
// each gone peer the node calls Link.MarkGone(peer, last seen) so calls
// addressed to it fail at once, and Link.MarkGone(peer, zero time) when
// it returns (or is forgotten).
//
// While the node cannot publish (its last broadcast failed), the broker is
// away for this node as much as for its peers, so silence is not held
// against peers. The node does not poll the link: it tries again at once
// when the appliance reports the link connected (LinkUp), and, while the
// link says it is connected (Config.Connected), at its next heartbeat and
// probe interval (a publish that failed on a connected link brings no
// LinkUp). While the link is not connected the node sends nothing until
// LinkUp. When publishing works again every peer gets a fresh window and
// the node sends hello again. So a node started before its link
// connects discovers as soon as the connection is up, and a standalone
// node (no broker) does not wake for discovery at all: after its first
// hello failed, its loop sleeps until LinkUp or a peer's deadline (it has
// none). A reconnect between two messages
// (LinkUp while publishing works) sends a hello: peers that probed the
// node while its queue was gone hold it gone until they hear from it.
//
// # Protocol
//
// Discovery messages are the bridge's system messages: not persistent,
// never kept in an outbox, with the message type as the system key. A
// broadcast (Link.PublishSystem) goes out on the mesh exchange with
// routing key sys.<type> and reaches every node; a message for one node
// (Link.SendSystem) goes with routing key to.<node>.sys.<type> and reaches
// that node alone. The bridge hands both to HandleSystem with the key
// <type> and the origin node it read from the message's properties.
//
//	type       sent as        v  meaning
//	hello      broadcast      1  the sender joined; carries its host record; a version 2
//	                             node answers one with "proto" >= 2 with an info
//	query      broadcast      1  every node: answer the sender with an info (version 1 only)
//	query      to one node    1  that node: answer the sender with an info
//	info       to one node    1  the sender's host record, answering a query
//	update     broadcast      1  the sender's host record changed
//	heartbeat  broadcast      1  the sender is alive; carries its record's hash
//	bye        broadcast      1  the sender leaves cleanly
//	ping       to one node    2  a probe of a version 2 to 4 node: is it still connected? (no answer)
//	gone       broadcast      2  the sender's probe found peer's system queue gone
//	probe      to one node    5  no message: a body-less probe of a version 5 node (Link.ProbeNode),
//	                             which its link drops unread
//
// A node sends hello at Start (and when publishing works again after it
// failed, and after its link reconnected); every version 2 node answers
// it with an info, so it needs no broadcast query (version 1 nodes sent
// one as well: at 1,000 nodes it was a third of the broker's deliveries
// while a node joins). A version 1 peer does not answer a hello; the node
// learns its record at its next heartbeat (its hash is unknown, so the
// node asks it). It sends an update as soon as SetLocal reports a change,
// a heartbeat every heartbeat interval, a probe of its ring successors
// every DiscoveryInterval, and bye at Close; a change of its bindings
// revision (SetRevision) brings its next heartbeat forward to a random
// moment within the probe interval, so that its peers' view shows the
// revision it runs. There is no periodic broadcast query: the hash in
// every heartbeat heals a lost update. When a heartbeat's hash differs
// from the record the node holds for the sender, or it hears from a node
// whose record it lacks, it asks that node alone (an addressed query), so
// a lost update heals within one of the sender's heartbeat intervals.
// Every periodic message is jittered: it goes out after a random 80–100%
// of its interval; the first heartbeat after the hello, at a random moment
// within the interval, so that nodes started together do not send theirs
// together.
//
// # Liveness at scale
//
// A peer can be gone in two ways: its broker connection is gone (its
// process died, its machine or its link vanished), or it hangs with its
// connection open. The first is the broker's to tell, and costs the mesh
// a few bytes per node; the second needs the peer's own word, its
// heartbeats, which every node hears.
//
// A node's system queue is exclusive to its connection, so the broker
// drops it when the connection goes (at once when the process dies and
// the kernel closes its socket; after the broker's AMQP heartbeat timeout
// when the machine vanishes). Every DiscoveryInterval (5 s, jittered)
// each node probes its two successors on the ring of up peers sorted by
// name, published mandatory: if the broker has no route (Config.NoRoute
// says which errors of Link.SendSystem mean that; Link.ProbeNode calls
// back), the addressee is gone, and the node marks it gone and broadcasts
// a gone message. A gone message is a claim, not a verdict: each receiver
// probes the named peer itself and marks it gone only on its own "no
// route", so no node can make others drop a live peer. A probe that comes
// back unroutable after the peer spoke again (it reconnected meanwhile) is
// ignored. A peer of version 5 or later is probed with Link.ProbeNode: a
// message with no body and no properties, sent without a confirm, that
// its link drops unread (about 64 bytes up for the prober and 77 down for
// the probed node, for 8-character names); an older peer with a ping (a
// discovery message, a few hundred bytes each way, and a confirm), a
// version 1 peer with an addressed query. So whatever the mesh size, each
// node sends two probes and receives two per probe interval: the mesh's
// probes cost 2n/4.5 deliveries a second (0.44 per node), and a killed
// peer costs one gone broadcast (n deliveries) and n unroutable probes
// (no deliveries). A killed peer is noticed within one probe interval
// (5 s; about 2.5 s on average) at any mesh size.
//
// Heartbeats are broadcast, so every node hears every one. A node sends
// them every HeartbeatInterval (5 min) while the mesh has up to 10
// nodes, and beyond that every HeartbeatInterval × n / 10
// (HeartbeatIntervalFor, n counting the nodes it sees up, itself
// included), so that a node hears no more heartbeats a second in a large
// mesh than in a mesh of 10 (about one every 27 s): 5 min up to 10 nodes,
// 50 min at 100, the protocol's limit of an hour from 120 nodes on, beyond
// which a node hears n per hour. The interval is also never shorter than
// the one that keeps the whole mesh's heartbeats within HeartbeatBudget
// (5,000 deliveries a second: n²/(0.9 × HeartbeatBudget)), which counts
// only for a short HeartbeatInterval in a large mesh. Each heartbeat
// announces the interval (heartbeat_ms) before the node keeps it: the
// next heartbeat comes within the interval the last one announced, so a
// peer judging its silence by that interval is never misled while it
// changes. A peer that hangs with its connection open is noticed within
// its heartbeat window, MissedHeartbeats × its interval: 15 min up to 10
// nodes, 2.5 h at 100, 3 h from 120. Once a peer is gone, calls addressed
// to it fail at once (Link.MarkGone) and its capabilities are routed
// elsewhere; before that a call to it is bounded by its deadline, as every
// request is.
//
// Mixed versions: a message's "v" is the lowest protocol version that
// understands it, so a version 2 node sends every version 1 type as
// version 1 (with "proto": 2, which version 1 ignores) and a version 1
// node keeps understanding it; it refuses ping and gone clearly (counted
// as rejected, reason version). A version 2 node understands version 1
// messages; a peer that does not say "proto" speaks version 1 and is
// probed with an addressed query instead of a ping (the broker's routing
// answers the probe either way). A version 1 node still sends its
// periodic broadcast query, and a version 2 node answers it. A version 5
// node probes only peers that say "proto" 5 or more with Link.ProbeNode
// (an older node's bridge would dead-letter the body-less message as
// malformed), and keeps pinging the others; older nodes ping it, and it
// reads their pings as before. A peer of any version judges this node's
// silence by the heartbeat_ms this node announces, so the longer
// heartbeat interval misleads none of them; a version 1 peer, which does
// not probe, notices this node's death only within that window.
//
// Every message is one JSON object (at most 256 KiB):
//
//	v             int       the lowest protocol version that understands it: 1, or 2 for ping and gone
//	type          string    hello | query | info | update | heartbeat | bye | ping | gone
//	node          string    the sender's mesh name
//	to            string    the addressee (info and ping always, query when addressed)
//	started_at    time      when the sender's process started (RFC 3339)
//	seq           uint      per-process sequence number of the message
//	version       string    meshbox version (hello, info, update, heartbeat)
//	revision      int       bindings revision (hello, info, update, heartbeat)
//	capabilities  []string  capabilities hosted (hello, info, update)
//	stages        []string  command stages handled (hello, info, update)
//	events        []string  version 7: topic patterns listened to, AMQP syntax (hello, info, update)
//	hash          string    HostHash of capabilities, stages and events
//	heartbeat_ms  int       the sender's heartbeat interval, milliseconds
//	proto         int       the highest protocol version the sender speaks (absent: 1)
//	peer          string    the peer a gone message names
//	sig           string    version 4: the sender's signature, always the last member
//
// The receiver judges the sender's silence by the sender's heartbeat_ms.
// A node accepts v from MinProtocolVersion to ProtocolVersion (1 to 8).
// Version 3 adds no message: its nodes read command batches on the
// broker (package bridge), and a node reports the lowest version of its
// up peers (Config.OnPeerProtocols) so that its bridge sends batches only
// when every peer reads them. Version 4 adds no message either: its
// nodes sign what they say (see Signed discovery). Version 5 adds none
// either: its links drop body-less probes addressed to them, so its peers
// probe it with those (see Liveness at scale). Version 6 adds none
// either: its nodes publish each event with its lane and bind only the
// lanes of other nodes (package wire); a node reports the peers it knows
// of, and whether one of them was not heard speaking 6 yet
// (Config.OnEventPeers), so that its bridge binds the shared event keys
// too while an older publisher may be about. Version 7 adds a field, not
// a message: a record's "events" are the topic patterns its programs
// listen to (SetListening), in its hash, so that a publisher sends an
// event only when another node listens (Listeners, listeners.go).
// Version 8 adds nothing to discovery: its nodes read a table's snapshot
// parts in binary (package rows), and a node reports the lowest version
// of every node it knows of, heard or not (Config.OnKnownProtocols), so
// that it writes them only when every node can read them. A probe
// carries nothing and so is not signed; only the broker's answer to it
// counts.
// A different started_at from the same node is a restart; an older one is
// a late message and is dropped, as is a record-carrying message with a
// lower seq than the record held, and anything from a run that said bye.
// A message naming this node as its sender is this node's own broadcast
// coming back (same started_at, ignored) or another process using its
// name (counted, logged once). Everything else is validated (DecodeMessage)
// before it touches the view: an unknown type or version, a bad name, a
// list longer than 1024, a key that is not the message's type, a node
// field that differs from the origin the transport reports — the
// message is dropped, counted in meshbox_discovery_rejected_total{reason}
// and logged at debug level.
//
// # Signed discovery
//
// The broker tells a receiver which broker user published a message, and
// a node's peers accept its messages only from its own users (package
// bridge). That alone leaves discovery to the broker's word: its operator
// can make or re-password a node's user and say bye for it, and in a mesh
// run on one broker credential every node can. So a version 4 node signs
// every discovery message it sends with its signing key (Config.Signer:
// an Ed25519 key pair made at its first start beside its node key, whose
// public half its node record publishes; only the node may set its own).
// The signature covers "meshbox discovery v4", a zero byte, and the whole
// JSON body but "sig": the type, the sender, the addressee, the peer a
// gone names, the sender's run (started_at) and sequence number, and all
// it carries. signBody writes it as the body's last member, "sig"
// (Ed25519 in unpadded base64url), and the receiver verifies those exact
// bytes, so a member it does not know is covered too.
//
// A receiver checks every message against the sender's signing key from
// the bindings' node records (SetSigningKeys), before it touches the
// view:
//
//   - the sender's record has no signing key (a node of version 3 or
//     older, or one whose key the bindings do not show yet): the message
//     is taken on the broker's word, as before, signed or not;
//   - the record has a key: the message must be signed with it. An
//     unsigned one is refused as unsigned, one whose signature does not
//     verify as forged;
//   - a signed message of the sender's current run whose sequence number
//     is not above the highest this node saw from that run is a copy (the
//     operator can read and publish anything) and is refused as replayed.
//     A sender numbers its messages in the order it sends them.
//
// Each refusal is counted in meshbox_discovery_rejected_total{reason}
// (unsigned, forged, replayed) and logged once per reason and sender. So
// nobody but the node itself can make its peers mark it gone (bye), change
// what they route to it (hello, info, update), or stand in for it, and a
// gone message stays a claim: a receiver probes the peer it names itself
// and marks it gone only on the broker's "no route". What the broker's
// operator still can is deny service: drop or delay messages, close a
// node's connection or delete its queue (which a probe reads as gone).
// A copy of a message of an earlier run reaches only a node that never
// heard the current one, and is undone by the current run's next message
// or the next probe.
//
// Mixed versions: a version 4 message keeps its "v" (1 or 2) and adds
// "sig", which older nodes ignore, so they keep reading it; a version 4
// node accepts their unsigned messages while their records have no
// signing key. A node publishes its key when it first starts version 4;
// from then on its peers accept only its signed messages, so it does not
// go back to an older version (its unsigned messages would be refused)
// unless its record's signing key is cleared. A node that lost its
// signing key (a new data directory) makes and publishes a new one; its
// peers refuse its messages as forged until their bindings show it.
// Status shows, for each peer, whether its record has a signing key
// (signs).
//
// # Observability
//
// Status (and $MESH.peers, $MESH.caps on Config.Conn) show the view;
// metrics are meshbox_peers{state}, meshbox_capabilities{where},
// meshbox_discovery_messages_total{type,direction},
// meshbox_discovery_rejected_total{reason} and
// meshbox_discovery_errors_total{op}. Each peer state change is one log
// line; so is each change of the local record, and a failure to publish
// (once, until it recovers).
//
// # Concurrency
//
// A Node owns three goroutines, started by Start and ended by Close:
//
//   - the loop expires silent peers and queues heartbeats and probes
//     when they are due; between rounds it sleeps until the next
//     deadline (a heartbeat, a probe, a peer's window, a gone peer's
//     retention), and a change of the view wakes it to recompute, so an
//     idle node wakes only for its own heartbeats and probes;
//   - the sender publishes queued messages one at a time, each bounded by
//     PublishTimeout, building each body when it is sent (the queue holds
//     at most one pending message per type and addressee); an addressed
//     message the broker could not route marks its addressee gone, and so
//     does a probe whose unroutable callback the link calls (it takes the
//     mutex, on the link's goroutine);
//   - the effects goroutine is the only caller of Link.MarkGone,
//     Link.SetRoutes and Config.OnLocalChange, and sets
//     the gauges; it applies the latest view whenever it changed, so
//     bursts of changes coalesce and the link sees them in order.
//
// One mutex guards the view. No Link method and no callback is called
// with it held. HandleSystem runs on the caller's goroutine (the bridge's
// consumer): it decodes outside the lock, updates the view under it, and
// never waits on the network. It may be called before Start (the view is
// kept, answers go out once Start runs) and after Close (dropped).
// SetLocal likewise runs on the caller's goroutine (the appliance's
// watcher) and only queues the update.
//
// # Wiring
//
// The appliance builds the bridge with an OnSystem callback that calls
// HandleSystem on the node (nil-safe), builds the node with the bridge as
// its Link and an in-process connection as Conn, calls SetLocal before
// Start and on every change its watcher of local interest sees (after the
// bridge took the same snapshot), calls SetExpected and SetRevision on
// every bindings change, and puts Status in its status JSON.
package node
