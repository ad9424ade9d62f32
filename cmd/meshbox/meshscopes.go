package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/internal/seal"
)

// scopeLeaves are the `meshbox mesh scope ...` commands: scopes, smaller
// trust boundaries inside the mesh with keys of their own. As for the
// mesh's keys, no key passes through here: the scope's first member to see
// a key makes it, and members seal it for each other through the database.
func (c *MeshCommand) scopeLeaves() []meshLeaf {
	out := c.m.Stdout
	return []meshLeaf{
		{name: "scope add", args: []string{"NAME"}, flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			nodes := fs.String("nodes", "", "comma-separated nodes that hold the scope's key")
			return func(ctx context.Context, db *meshdb.DB, args []string) error {
				list := splitList(*nodes)
				if len(list) == 0 {
					return usagef("mesh scope add %s: --nodes is required: the nodes that hold the scope's key", args[0])
				}
				ch, err := db.AddScope(ctx, args[0], list)
				if err != nil {
					return err
				}
				c.report(fmt.Sprintf("scope %s added, held by %s", args[0], strings.Join(list, ", ")), ch)
				fmt.Fprintln(out, "bind capabilities, stages and topics to it with meshbox mesh scope bind")
				return nil
			}
		}},
		{name: "scope bind", args: []string{"NAME"}, flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			caps := fs.String("cap", "", "comma-separated capabilities")
			stages := fs.String("stage", "", "comma-separated stages")
			topics := fs.String("topic", "", "comma-separated event topics")
			tables := fs.String("table", "", "comma-separated tables of rows (as mesh table bind TABLE --scope NAME)")
			unbind := fs.Bool("unbind", false, "remove these bindings instead")
			return func(ctx context.Context, db *meshdb.DB, args []string) error {
				kinds := []struct{ kind, list string }{{seal.BindCap, *caps}, {seal.BindStage, *stages}, {seal.BindTopic, *topics}}
				any := false
				for _, k := range kinds {
					list := splitList(k.list)
					if len(list) == 0 {
						continue
					}
					any = true
					op, verb := db.BindScope, "bound to"
					if *unbind {
						op, verb = db.UnbindScope, "unbound from"
					}
					ch, err := op(ctx, args[0], k.kind, list)
					if err != nil {
						return err
					}
					c.report(fmt.Sprintf("%s %s %s scope %s", k.kind, strings.Join(list, ", "), verb, args[0]), ch)
				}
				for _, t := range splitList(*tables) {
					any = true
					if err := c.bindTable(ctx, db, t, args[0], *unbind); err != nil {
						return err
					}
				}
				if !any {
					return usagef("mesh scope bind %s: name at least one --cap, --stage, --topic or --table", args[0])
				}
				return nil
			}
		}},
		{name: "scope rotate", args: []string{"NAME"}, flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			retention := fs.Duration("retention", meshdb.DefaultKeyRetention, "how long the keys it replaces still open messages")
			return func(ctx context.Context, db *meshdb.DB, args []string) error {
				if *retention < time.Minute {
					return usagef("mesh scope rotate: --retention %s is shorter than a minute: messages in flight would not open", *retention)
				}
				id, ch, err := db.RotateScopeKey(ctx, args[0], *retention)
				if err != nil {
					return err
				}
				c.report(fmt.Sprintf("content key %s added to scope %s; the keys it replaces retire in %s", id, args[0], *retention), ch)
				fmt.Fprintln(out, "the scope's nodes seal with it once every one of them holds it (meshbox mesh scope list)")
				return nil
			}
		}},
		{name: "scope list", flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			asJSON := fs.Bool("json", false, "print JSON")
			return func(ctx context.Context, db *meshdb.DB, _ []string) error {
				scopes, err := db.Scopes(ctx)
				if err != nil {
					return err
				}
				keys, holders, err := db.ContentKeys(ctx)
				if err != nil {
					return err
				}
				type keyRow struct {
					ID       string     `json:"id"`
					RetireAt *time.Time `json:"retire_at,omitempty"`
					Holders  []string   `json:"holders"`
				}
				type row struct {
					cache.Scope
					Keys []keyRow `json:"keys"`
				}
				rows := []row{}
				for _, s := range scopes {
					r := row{Scope: s, Keys: []keyRow{}}
					for _, k := range keys {
						if k.Scope != s.Name {
							continue
						}
						kr := keyRow{ID: k.ID, RetireAt: k.RetireAt, Holders: []string{}}
						for _, h := range holders {
							if h.KeyID == k.ID {
								kr.Holders = append(kr.Holders, h.Node)
							}
						}
						r.Keys = append(r.Keys, kr)
					}
					rows = append(rows, r)
				}
				if *asJSON {
					return writeJSON(out, rows)
				}
				table := [][]string{{"SCOPE", "NODES", "BOUND", "KEYS"}}
				for _, r := range rows {
					var bound, ks []string
					for _, b := range r.Bindings {
						bound = append(bound, b.Kind+" "+b.Name)
					}
					for _, k := range r.Keys {
						s := k.ID + " (held by " + strings.Join(k.Holders, ",") + ")"
						if len(k.Holders) == 0 {
							s = k.ID + " (nobody yet)"
						}
						if k.RetireAt != nil {
							s += " retires " + k.RetireAt.UTC().Format(time.RFC3339)
						}
						ks = append(ks, s)
					}
					table = append(table, []string{r.Name, strings.Join(r.Members, ","), dash(strings.Join(bound, ", ")),
						dash(strings.Join(ks, "; "))})
				}
				return writeTable(out, table)
			}
		}},
	}
}
