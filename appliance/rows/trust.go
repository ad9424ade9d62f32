package rows

import (
	"fmt"
	"sync/atomic"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/internal/wire"
)

// The trust rules of a table's log, the bridge's for every message:
//
//   - Scope. A message opens only with a key of the table's scope (the
//     mesh's keys for a table bound to no scope). A node outside the
//     scope holds the mesh's key: a change it seals with it is refused
//     as wrong_scope, never applied.
//   - Writer. Every cell of a change batch names its writer, and that
//     writer is the node that published the message: in a mesh of
//     per-node broker users, the node of the message's user_id (RabbitMQ
//     refuses a user_id that is not the connection's user); in a mesh on
//     one credential, the batch's sender as the shared credential vouches
//     for it. A batch that claims another writer is refused as
//     forged_writer. A snapshot carries every writer's cells: its sender
//     must be itself, and only a node that needs a snapshot applies its
//     cells (a joiner, and one that was away past the log's retention),
//     and a joiner checks it against the log before it (verify.go).
//
// Refusals count under their cause (refuse) and show on the table.

// Causes of a refused change (meshbox_rows_refused_total, status refused).
const (
	causeUnopened     = "unopened"      // sealed with a key this node lacks, tampered, or not a batch
	causeWrongScope   = "wrong_scope"   // sealed with a key of another scope than the table's (the mesh's included)
	causeForgedWriter = "forged_writer" // a cell or batch naming a writer other than its validated publisher
	causeFuture       = "future"        // stamped more than the drift ahead: held on disk until the clock reaches it
	causeFarFuture    = "far_future"    // stamped further ahead than any clock error: dropped
	causeOverBound    = "over_bound"    // held changes past their bound: dropped
	causeSnapshot     = "snapshot_disagrees"
	causeLogReplaced  = "log_replaced" // the log was deleted and made anew: the node reads the new one
)

// login is the broker user this node's link logged in as ("": none yet).
type login struct{ user atomic.Pointer[string] }

// setLogin records the broker user the sync's connection logged in as:
// a node user (node.<n>.g<k>) says the mesh gives every node a user of
// its own, so a message's origin is its validated user_id.
func (e *Engine) setLogin(user string) { e.login.user.Store(&user) }

// perNode reports whether this node logs in as a node's own broker user.
func (e *Engine) perNode() bool {
	u := e.login.user.Load()
	if u == nil {
		return false
	}
	_, _, ok := wire.ParseBrokerUser(*u)
	return ok
}

// origin returns the node that published d, whose batch b says it is
// from b.Node: an error when the broker's validated user contradicts it.
func (e *Engine) origin(d *amqp.Delivery, b *batch) (string, error) {
	node, _, nodeUser := wire.ParseBrokerUser(d.UserId)
	switch {
	case nodeUser && b.Node != node:
		return "", fmt.Errorf("published by node %s's broker user, the batch says it is from %q", node, b.Node)
	case nodeUser:
		return node, nil
	case e.perNode():
		return "", fmt.Errorf("published by %q, which is not a node's broker user (in this mesh every node publishes as its own)", d.UserId)
	}
	if b.Node == "" {
		return "", fmt.Errorf("the batch names no sender")
	}
	return b.Node, nil
}

// checkScope refuses a message of table sealed with key keyID when the
// key is not one of the table's scope. A key this node does not hold is
// left to openBatch (unopened).
func (e *Engine) checkScope(table, keyID string) error {
	scope, held := e.cfg.Keys.KeyScope(keyID)
	if !held {
		return nil
	}
	e.mu.Lock()
	want := e.tables[table].Scope
	e.mu.Unlock()
	if scope != want {
		return fmt.Errorf("sealed with key %s of %s; table %s is sealed with %s's keys", keyID, scopeName(scope), table, scopeName(want))
	}
	return nil
}

// meshNodes are the mesh's nodes as the bindings list them (SetNodes);
// nil: not known yet.
type meshNodes struct {
	names atomic.Pointer[map[string]bool]
}

// SetNodes sets the mesh's nodes, as the bindings list them: a change of
// a scoped table from a node no longer in the mesh is accepted (see
// checkMember). The appliance calls it with every version of the
// bindings, before SetTables. Safe for concurrent use.
func (e *Engine) SetNodes(names []string) {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	e.nodes.names.Store(&m)
}

// removed reports whether the mesh's nodes are known and node is not one
// of them.
func (e *Engine) removed(node string) bool {
	p := e.nodes.names.Load()
	return p != nil && !(*p)[node]
}

// checkMember refuses a message of a scoped table from a node that is
// not a member of the scope now (one removed from it still holds its
// older keys), unless the node is not in the mesh at all and its broker
// user vouches for it (validated): a removed node's broker users are
// revoked, so it published the message before its removal, as a member
// (only members hold the scope's keys), and every node then applied it.
// A node joining later applies it too, so that the replicas converge
// after the nodes that wrote a table are gone (docs/recovery.md).
func (e *Engine) checkMember(table, origin string, validated bool) error {
	e.mu.Lock()
	scope := e.tables[table].Scope
	e.mu.Unlock()
	if scope != "" && !e.cfg.Keys.InScope(scope, origin) && !(validated && e.removed(origin)) {
		return fmt.Errorf("from node %s, which is not a member of scope %s", origin, scope)
	}
	return nil
}

// checkWriter refuses a change batch with a cell that names another
// writer than its publisher.
func checkWriter(b *batch, origin string) error {
	if b.Kind != kindChanges {
		return nil
	}
	for _, ch := range b.Changes {
		for _, c := range ch.Cells {
			if c.Node != origin {
				return fmt.Errorf("row %s field %s names writer %q; the batch was published by %s", ch.Row, c.Field, c.Node, origin)
			}
		}
	}
	return nil
}
