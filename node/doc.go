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
//     (MissedHeartbeats × the peer's heartbeat interval);
//   - gone: it said bye, or it stayed silent for the whole window;
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
// against peers. The node does not poll the link: it tries again at its
// next heartbeat, and at once when the appliance reports the link
// connected (LinkUp). When publishing works again every peer gets a fresh
// window and the node sends hello and query again. So a node started
// before its link connects discovers as soon as the connection is up, and
// a standalone node (no broker) wakes only for its heartbeats.
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
//	type       sent as        meaning
//	hello      broadcast      the sender joined; carries its host record
//	query      broadcast      every node: answer the sender with an info
//	query      to one node    that node: answer the sender with an info
//	info       to one node    the sender's host record, answering a query
//	update     broadcast      the sender's host record changed
//	heartbeat  broadcast      the sender is alive; carries its record's hash
//	bye        broadcast      the sender leaves cleanly
//
// A node sends hello and a broadcast query at Start, a heartbeat every
// HeartbeatInterval (5 s), a broadcast query every DiscoveryInterval
// (30 s), an update as soon as SetLocal reports a change, and bye at
// Close. It answers every query with an info. When a heartbeat's hash
// differs from the record it holds for the sender, or it hears from a
// node whose record it lacks, it asks that node alone (an addressed
// query), so a lost update heals within one heartbeat.
//
// Every message is one JSON object (at most 256 KiB):
//
//	v             int       protocol version, 1
//	type          string    hello | query | info | update | heartbeat | bye
//	node          string    the sender's mesh name
//	to            string    the addressee (info always, query when addressed)
//	started_at    time      when the sender's process started (RFC 3339)
//	seq           uint      per-process sequence number of the message
//	version       string    meshbox version (hello, info, update, heartbeat)
//	revision      int       bindings revision (hello, info, update, heartbeat)
//	capabilities  []string  capabilities hosted (hello, info, update)
//	stages        []string  command stages handled (hello, info, update)
//	hash          string    HostHash of capabilities and stages
//	heartbeat_ms  int       the sender's heartbeat interval, milliseconds
//
// The receiver judges the sender's silence by the sender's heartbeat_ms.
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
//   - the loop expires silent peers and queues heartbeats and queries when they are due; between rounds it sleeps until the
//     next deadline (a heartbeat, a query, a peer's window, a
//     gone peer's retention), and a change of the view wakes it to
//     recompute, so an idle node wakes only for its own heartbeats;
//   - the sender publishes queued messages one at a time, each bounded by
//     PublishTimeout, building each body when it is sent (the queue holds
//     at most one pending message per type and addressee);
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
