package appliance

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"

	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/internal/brokerurl"
	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/internal/wire"
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
	if kk := a.keys.Load(); kk != nil {
		ring = kk.ring // a mesh seals
	}
	eng, err := rows.Open(rows.Config{
		Node:          a.cfg.Node,
		Path:          filepath.Join(a.cfg.DataDir, "rows.db"),
		Keys:          ring,
		BrokerURL:     a.rowsBrokerURL,
		Declare:       !a.perNodeBroker(),
		SnapshotEvery: a.cfg.Rows.SnapshotEvery,
		Logger:        a.logger,
		Metrics:       a.registry,
	})
	if err != nil {
		return fmt.Errorf("rows: %w", err)
	}
	nc, err := a.natsSrv.connect(ownConnPrefix + "rows")
	if err != nil {
		_ = eng.Close()
		return fmt.Errorf("rows: nats connect: %w", err)
	}
	a.interest.exclude(nc)
	// Programs and the node's own connections share the server's global
	// account: a change is published only where someone subscribes.
	acc := a.natsSrv.srv.GlobalAccount()
	if _, err := eng.Serve(rows.ServeConfig{Conn: nc, Replies: a.rc, ReplyAllowed: a.natsSrv.auth.rights.ReplyAllowed,
		Interest: acc.SubscriptionInterest}); err != nil {
		nc.Close()
		_ = eng.Close()
		return fmt.Errorf("rows: %w", err)
	}
	a.rowsConn = nc
	a.rowsEng.Store(eng)
	if snap, ok := a.bindings.manager.Current(); ok {
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
	if !maps.Equal(eng.Tables(), tables) {
		eng.SetTables(tables)
	}
	if u := a.brokerURL(snap, true); u != a.rowsURL.Swap(u) {
		eng.Reconnect() // the broker or the node's credential changed
	}
}

// rowsBrokerURL is the broker URL the tables' sync dials ("" standalone).
func (a *Appliance) rowsBrokerURL() string {
	snap, ok := a.bindings.manager.Current()
	return a.brokerURL(snap, ok)
}

// perNodeBroker reports whether the node logs in to the broker as a
// node's own user (which may not declare queues: the admin made them).
func (a *Appliance) perNodeBroker() bool {
	urls := brokerurl.Split(a.rowsBrokerURL())
	if len(urls) == 0 {
		return false
	}
	u, err := url.Parse(urls[0])
	if err != nil || u.User == nil {
		return false
	}
	_, _, ok := wire.ParseBrokerUser(u.User.Username())
	return ok
}

// stopRows stops the tables' sync and API. a.mu is held.
func (a *Appliance) stopRows() {
	if a.rowsConn != nil {
		a.rowsConn.Close()
		a.rowsConn = nil
	}
	if eng := a.rowsEng.Swap(nil); eng != nil {
		if err := eng.Close(); err != nil {
			a.logger.Warn("rows: close", "err", err)
		}
	}
}

// rowsStatus is the tables' part of the status.
func (a *Appliance) rowsStatus() []rows.TableStatus {
	if eng := a.rowsEng.Load(); eng != nil {
		return eng.Status()
	}
	return nil
}

// atomicString is a string read and swapped atomically.
type atomicString struct{ v atomic.Pointer[string] }

// Swap stores s and returns the string it replaces ("" at first).
func (a *atomicString) Swap(s string) string {
	if old := a.v.Swap(&s); old != nil {
		return *old
	}
	return ""
}
