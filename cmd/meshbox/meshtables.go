package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/bridge/brokeradmin"
	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/internal/names"
)

// tableLeaves are the `meshbox mesh table ...` commands: the mesh's
// tables of rows, each a mesh setting table.<name> = {"scope": ...} that
// every node follows, and on the broker a stream queue rows.<name> that
// keeps the table's log.
func (c *MeshCommand) tableLeaves() []meshLeaf {
	out := c.m.Stdout
	return []meshLeaf{
		{name: "table add", args: []string{"TABLE"}, flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			scope := fs.String("scope", "", "seal the table's changes with this scope's key, so that only its nodes read and write it (default: the mesh's key)")
			admin := c.m.adminFlag(fs)
			return func(ctx context.Context, db *meshdb.DB, a []string) error {
				return c.addTable(ctx, db, a[0], *scope, *admin)
			}
		}},
		{name: "table bind", args: []string{"TABLE"}, flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			scope := fs.String("scope", "", "the scope whose key seals the table's changes from now on")
			return func(ctx context.Context, db *meshdb.DB, a []string) error {
				if *scope == "" {
					return usagef("mesh table bind %s: --scope is required: the scope whose key seals the table", a[0])
				}
				return c.bindTable(ctx, db, a[0], *scope, false)
			}
		}},
		{name: "table list", flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			asJSON := fs.Bool("json", false, "print JSON")
			return func(ctx context.Context, db *meshdb.DB, _ []string) error {
				tables, err := c.tables(ctx, db)
				if err != nil {
					return err
				}
				type row struct {
					Table string `json:"table"`
					Scope string `json:"scope,omitempty"`
					Queue string `json:"queue"`
				}
				list := []row{}
				for _, t := range slices.Sorted(maps.Keys(tables)) {
					list = append(list, row{Table: t, Scope: tables[t].Scope, Queue: rows.QueueOf(t)})
				}
				if *asJSON {
					return writeJSON(out, list)
				}
				if len(list) == 0 {
					fmt.Fprintln(out, "no tables (meshbox mesh table add TABLE makes one)")
					return nil
				}
				table := [][]string{{"TABLE", "SEALED WITH", "LOG ON THE BROKER"}}
				for _, r := range list {
					sealed := "the mesh's key"
					if r.Scope != "" {
						sealed = "scope " + r.Scope
					}
					table = append(table, []string{r.Table, sealed, r.Queue})
				}
				return writeTable(out, table)
			}
		}},
	}
}

// tables reads the mesh's tables from its settings; a setting that does
// not define one is reported on standard error.
func (c *MeshCommand) tables(ctx context.Context, db *meshdb.DB) (map[string]rows.TableSpec, error) {
	settings, err := db.Settings(ctx)
	if err != nil {
		return nil, err
	}
	tables, errs := appliance.TablesOf(settings)
	for _, err := range errs {
		fmt.Fprintf(c.m.Stderr, "meshbox: warning: %v (the nodes leave it out)\n", err)
	}
	return tables, nil
}

// tableValue is the value of the setting that defines a table.
func tableValue(scope string) string {
	b, _ := json.Marshal(rows.TableSpec{Scope: scope}) // a string field: cannot fail
	return string(b)
}

// checkScope fails unless scope ("": the mesh's) exists.
func checkScope(ctx context.Context, db *meshdb.DB, scope string) error {
	if scope == "" {
		return nil
	}
	if err := names.Scope(scope); err != nil {
		return usagef("%v", err)
	}
	scopes, err := db.Scopes(ctx)
	if err != nil {
		return err
	}
	for _, s := range scopes {
		if s.Name == scope {
			return nil
		}
	}
	return fmt.Errorf("%w (meshbox mesh scope add %s --nodes A,B makes it)", &meshdb.NotFoundError{What: fmt.Sprintf("scope %q", scope)}, scope)
}

// addTable defines table (sealed with scope's key, "": the mesh's) and,
// with the broker's admin, makes its log on the broker and gives every
// node's broker users the permissions of this version (which read and
// write the tables' logs). Without the admin, a mesh whose nodes log in as
// users of their own is refused: they may not make the log; on one shared
// credential the nodes make it themselves.
func (c *MeshCommand) addTable(ctx context.Context, db *meshdb.DB, table, scope, adminURL string) error {
	if err := rows.ValidTable(table); err != nil {
		return usagef("mesh table add: %v", err)
	}
	if err := checkScope(ctx, db, scope); err != nil {
		return fmt.Errorf("mesh table add %s: %w", table, err)
	}
	tables, err := c.tables(ctx, db)
	if err != nil {
		return err
	}
	if sp, ok := tables[table]; ok && sp.Scope != scope {
		return fmt.Errorf("mesh table add %s: %w; meshbox mesh table bind %s --scope S seals it with another scope's key",
			table, &meshdb.ExistsError{What: fmt.Sprintf("table %q, sealed with %s,", table, sealedWith(sp.Scope))}, table)
	}
	gens, err := db.CredentialGenerations(ctx, "")
	if err != nil {
		return fmt.Errorf("mesh table add %s: %w", table, err)
	}
	if adminURL == "" && len(gens) > 0 {
		return usagef("mesh table add %s: --broker-admin is required (or set MESHBOX_BROKER_ADMIN): the mesh's nodes log in to the broker as users of their own, which may not make queues, so the table's log, stream queue %s, must be made with --broker-admin; nothing was changed",
			table, rows.QueueOf(table))
	}
	if adminURL != "" {
		if err := c.makeTableLog(ctx, db, table, adminURL, gens); err != nil {
			return fmt.Errorf("mesh table add %s: %w", table, err)
		}
	}
	ch, err := db.SetSetting(ctx, appliance.TableSettingPrefix+table, tableValue(scope))
	if err != nil {
		return err
	}
	c.report(fmt.Sprintf("table %s added, sealed with %s", table, sealedWith(scope)), ch)
	if adminURL == "" {
		fmt.Fprintf(c.m.Stdout, "the nodes make its log, stream queue %s, themselves: they share one broker credential\n", rows.QueueOf(table))
	}
	return nil
}

// makeTableLog declares table's stream queue and re-applies the
// permissions of every node's broker users (gens), so that users made
// before tables existed may read and write it.
func (c *MeshCommand) makeTableLog(ctx context.Context, db *meshdb.DB, table, adminURL string, gens []meshdb.CredentialGeneration) error {
	admin, err := c.connectAdmin(ctx, db, adminURL)
	if err != nil {
		return err
	}
	if err := admin.DeclareMesh(ctx); err != nil {
		return err
	}
	q := rows.QueueOf(table)
	if err := admin.DeclareStream(ctx, q, q, rows.StreamArgs(rows.DefaultMaxAge, rows.DefaultMaxBytes)); err != nil {
		return err
	}
	fmt.Fprintf(c.m.Stdout, "stream queue %s on %s (vhost %s), bound to exchange mesh with key %s, keeps %d days or %d GiB\n",
		q, admin.Endpoint(), admin.Vhost(), q, rows.DefaultMaxAge/(24*time.Hour), rows.DefaultMaxBytes>>30)
	return c.refreshPermissions(ctx, db, admin, gens)
}

// refreshPermissions sets the permissions of this version on every
// node's broker users, each for its node's stages. A generation the
// database lists whose user the broker no longer has (a rotation that
// stopped between the two) is left out, and said so.
func (c *MeshCommand) refreshPermissions(ctx context.Context, db *meshdb.DB, admin *brokeradmin.Admin, gens []meshdb.CredentialGeneration) error {
	type nodeInfo struct {
		stages   []string
		onBroker []int
	}
	nodes := map[string]*nodeInfo{}
	for _, g := range gens {
		n := nodes[g.Node]
		if n == nil {
			stages, err := db.NodeStages(ctx, g.Node)
			if errors.Is(err, meshdb.ErrNotFound) {
				continue // removed meanwhile
			}
			if err != nil {
				return err
			}
			onBroker, err := admin.Generations(ctx, g.Node)
			if err != nil {
				return err
			}
			n = &nodeInfo{stages: stages, onBroker: onBroker}
			nodes[g.Node] = n
		}
		if !slices.Contains(n.onBroker, g.Generation) {
			fmt.Fprintf(c.m.Stdout, "node %s: broker user %s is not on the broker; left out\n", g.Node, g.User)
			continue
		}
		if err := admin.SetStages(ctx, g.Node, g.Generation, n.stages); err != nil {
			return fmt.Errorf("node %s: %w", g.Node, err)
		}
		fmt.Fprintf(c.m.Stdout, "node %s: permissions of broker user %s updated\n", g.Node, g.User)
	}
	return nil
}

// bindTable seals table's changes from now on with scope's key; unbind
// (scope: the one it is bound to) seals them with the mesh's key again.
func (c *MeshCommand) bindTable(ctx context.Context, db *meshdb.DB, table, scope string, unbind bool) error {
	op := "bind"
	if unbind {
		op = "unbind"
	}
	if err := rows.ValidTable(table); err != nil {
		return usagef("mesh table %s: %v", op, err)
	}
	if err := checkScope(ctx, db, scope); err != nil {
		return fmt.Errorf("mesh table %s %s: %w", op, table, err)
	}
	tables, err := c.tables(ctx, db)
	if err != nil {
		return err
	}
	sp, ok := tables[table]
	if !ok {
		return fmt.Errorf("mesh table %s %s: %w (meshbox mesh table add %s --scope %s makes it)", op, table,
			&meshdb.NotFoundError{What: fmt.Sprintf("table %q", table)}, table, scope)
	}
	value, what, now := tableValue(scope), fmt.Sprintf("table %s bound to scope %s", table, scope), scope
	if unbind {
		if sp.Scope != scope {
			return fmt.Errorf("mesh table unbind %s: it is sealed with %s, not scope %s's", table, sealedWith(sp.Scope), scope)
		}
		value, what, now = tableValue(""), fmt.Sprintf("table %s unbound from scope %s", table, scope), ""
	}
	ch, err := db.SetSetting(ctx, appliance.TableSettingPrefix+table, value)
	if err != nil {
		return err
	}
	c.report(what, ch)
	if ch.Changed {
		fmt.Fprintf(c.m.Stdout, "the changes the nodes write from now on are sealed with %s; those in the log keep the key they were sealed with\n", sealedWith(now))
	}
	return nil
}

func sealedWith(scope string) string {
	if scope == "" {
		return "the mesh's key"
	}
	return "scope " + scope + "'s key"
}
