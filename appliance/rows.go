package appliance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/meshbox/meshbox/node"
)

// Tables of rows (package rows): the mesh defines them as settings
// table.<name> = {"scope": …} (meshbox mesh table add, bind); every node
// keeps a replica of each table whose key it holds, in <data>/rows.db,
// and serves the rows API on its NATS server.

// RowsConfig is the node's part in the tables of rows.
type RowsConfig struct {
	// SnapshotEvery is how many changes in a table's log since its newest
	// snapshot make this node write a new one (compaction): a node that
	// joins reads from the newest snapshot on.
	SnapshotEvery int `json:"snapshot_every"`
}

// Bounds of rows.snapshot_every.
const (
	minSnapshotEvery = 100
	maxSnapshotEvery = 10_000_000
)

// TableSettingPrefix is the prefix of the mesh settings that define tables.
const TableSettingPrefix = "table."

// TablesOf returns the tables the settings define; a setting that does
// not parse is left out and reported.
func TablesOf(settings map[string]string) (map[string]rows.TableSpec, []error) {
	out := map[string]rows.TableSpec{}
	var errs []error
	for k, v := range settings {
		name, ok := strings.CutPrefix(k, TableSettingPrefix)
		if !ok {
			continue
		}
		if err := rows.ValidTable(name); err != nil {
			errs = append(errs, fmt.Errorf("setting %s: %w", k, err))
			continue
		}
		var sp rows.TableSpec
		if v != "" {
			if err := json.Unmarshal([]byte(v), &sp); err != nil {
				errs = append(errs, fmt.Errorf("setting %s: %q is not a table definition (JSON {\"scope\": …}): %w", k, v, err))
				continue
			}
		}
		out[name] = sp
	}
	return out, errs
}

// startRows opens the node's tables and serves their API. a.mu is held.
func (a *Appliance) startRows() error {
	var ring *seal.Keyring
	var link rows.Link
	r := a.parts()
	if kk := r.keys; kk != nil {
		ring = kk.Ring()   // a mesh seals
		link = rowsLink{a} // and its tables go through the node's broker link
	}
	eng, err := rows.Open(rows.Config{
		Node:          a.cfg.Node,
		Path:          filepath.Join(a.cfg.DataDir, "rows.db"),
		Keys:          ring,
		Link:          link,
		Declare:       mayDeclareTables,
		SnapshotEvery: a.cfg.Rows.SnapshotEvery,
		BinaryParts:   func() bool { return r.knownProtocol.Load() >= node.RowsBinaryProtocolVersion },
		Logger:        a.logger,
		Metrics:       a.tel.registry,
	})
	if err != nil {
		return fmt.Errorf("rows: %w", err)
	}
	nc, err := r.nats.Connect(ownConnPrefix + "rows")
	if err != nil {
		_ = eng.Close()
		return fmt.Errorf("rows: nats connect: %w", err)
	}
	r.interest.exclude(nc)
	// Programs and the node's own connections share the server's global
	// account: a change is published only where someone subscribes.
	acc := r.nats.NATS().GlobalAccount()
	if _, err := eng.Serve(rows.ServeConfig{Conn: nc, Replies: r.replies.Conn(), ReplyAllowed: r.nats.Rights().ReplyAllowed,
		Interest: acc.SubscriptionInterest, ReadOnly: retainedReadOnly}); err != nil {
		nc.Close()
		_ = eng.Close()
		return fmt.Errorf("rows: %w", err)
	}
	a.update(func(r *running) { r.rowsConn, r.rows = nc, eng })
	if snap, ok := r.bindings.manager.Current(); ok {
		a.applyTables(eng, snap)
	}
	return nil
}

// applyTables hands the tables of snap to the engine.
func (a *Appliance) applyTables(eng *rows.Engine, snap cache.Snapshot) {
	tables, errs := TablesOf(snap.Bindings.Settings)
	for _, err := range errs {
		a.logger.Warn("a table definition of the mesh is left out", "component", "rows", "err", err)
	}
	if _, defined := tables[wire.TableMQTTRetained]; !defined && a.retainedOn() {
		// The node's own table: the mesh's MQTT retained state
		// (mqttretained.go). The mesh's settings may define it too (to
		// seal it with a scope's key): then theirs holds.
		tables[wire.TableMQTTRetained] = rows.TableSpec{}
	}
	if len(snap.Bindings.Nodes) > 0 { // none: no mesh database, nothing known
		nodes := make([]string, len(snap.Bindings.Nodes))
		for i, n := range snap.Bindings.Nodes {
			nodes[i] = n.Name
		}
		eng.SetNodes(nodes)
	}
	if !maps.Equal(eng.Tables(), tables) {
		eng.SetTables(tables)
	}
}

// rowsLink is the tables' way to the broker: the bridge's link, whose
// broker list, TLS settings, client certificate and credential they use
// (bridge.DialExtra). The tables start before the bridge and stop after
// it: the bridge is looked up on each call.
type rowsLink struct{ a *Appliance }

// Dial implements rows.Link.
func (l rowsLink) Dial(ctx context.Context, role string) (*amqp.Connection, string, error) {
	b := l.a.parts().bridge
	if b == nil {
		return nil, "", rows.ErrLinkDown
	}
	conn, user, err := b.DialExtra(ctx, role)
	if errors.Is(err, bridge.ErrLinkDown) || errors.Is(err, bridge.ErrClosed) {
		return nil, "", rows.ErrLinkDown
	}
	return conn, user, err
}

// Moved implements rows.Link.
func (l rowsLink) Moved() <-chan struct{} {
	b := l.a.parts().bridge
	if b == nil {
		return closedChan // no link: whatever was dialled is to be dialled again
	}
	_, moved := b.LinkGeneration()
	return moved
}

// closedChan is a channel that is closed.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// mayDeclareTables reports whether a node logged in to the broker as user
// declares the tables' logs itself: not as a node's own user (which may
// not declare queues: the admin made them), as a mesh on one credential.
func mayDeclareTables(user string) bool {
	_, _, perNode := wire.ParseBrokerUser(user)
	return !perNode
}

// stopRows stops the tables' sync and API. a.mu is held.
func (a *Appliance) stopRows() {
	if nc := a.parts().rowsConn; nc != nil {
		a.update(func(r *running) { r.rowsConn = nil })
		nc.Close()
	}
	if eng := a.parts().rows; eng != nil {
		a.update(func(r *running) { r.rows = nil })
		if err := eng.Close(); err != nil {
			a.logger.Warn("rows: close", "err", err)
		}
	}
}

// RowsStatus is the tables' part of the status (Status().Rows), read alone.
func (a *Appliance) RowsStatus() []rows.TableStatus {
	if eng := a.parts().rows; eng != nil {
		return eng.Status()
	}
	return nil
}
