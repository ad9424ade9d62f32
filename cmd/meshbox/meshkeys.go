package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/meshbox/meshbox/cache/meshdb"
)

// keyLeaves are the `meshbox mesh key ...` commands: the mesh's content
// keys. Their bytes never pass through here: nodes make them and seal them
// to each other through the database (cache/meshdb/keys.go).
func (c *MeshCommand) keyLeaves() []meshLeaf {
	out := c.m.Stdout
	return []meshLeaf{
		{name: "kit", flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			file := fs.String("out", "", "write the recovery kit to this file (mode 0600, never over an existing file)")
			words := fs.Bool("words", false, "print the kit only as words to write down (no file)")
			replace := fs.Bool("replace", false, "replace the mesh's recovery kit: the old one opens no key made after it")
			node := c.m.envFlag(fs, "node", "MESHBOX_NODE", "the node whose keys to seal for the kit (env MESHBOX_NODE)")
			data := c.m.envFlag(fs, "data", "MESHBOX_DATA", "that node's data directory, which holds its key (env MESHBOX_DATA)")
			check := fs.String("check", "", "check the kit in this file: which keys it opens, and which it lacks (makes nothing)")
			return func(ctx context.Context, db *meshdb.DB, _ []string) error {
				if *check != "" {
					if *file != "" || *words || *replace {
						return usagef("mesh kit --check FILE: alone (it makes no kit)")
					}
					kit, err := readKit(*check)
					if err != nil {
						return err
					}
					return c.m.checkKit(ctx, db, kit)
				}
				switch {
				case *file == "" && !*words:
					return usagef("mesh kit: give --out FILE, or --words to print the kit only as words")
				case *file != "" && *words:
					return usagef("mesh kit: give --out FILE or --words, not both")
				case (*node == "") != (*data == ""):
					return usagef("mesh kit: give both --node and --data (the node's data directory), or neither")
				}
				kit, err := c.m.makeKit(ctx, db, *file, *replace)
				if err != nil {
					return err
				}
				if *node == "" {
					fmt.Fprintln(out, "nodes that hold the keys seal them for the kit when they next run")
					return nil
				}
				return c.m.sealNodeKeysForKit(ctx, db, kit, *node, *data)
			}
		}},
		{name: "key rotate", flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			retention := fs.Duration("retention", meshdb.DefaultKeyRetention, "how long the keys it replaces still open messages")
			return func(ctx context.Context, db *meshdb.DB, _ []string) error {
				if *retention < time.Minute {
					return usagef("mesh key rotate: --retention %s is shorter than a minute: messages in flight would not open", *retention)
				}
				id, ch, err := db.RotateKey(ctx, *retention)
				if err != nil {
					return err
				}
				c.report(fmt.Sprintf("content key %s added; the keys it replaces retire in %s", id, *retention), ch)
				fmt.Fprintln(out, "nodes seal with it once every node with a public key holds it (meshbox mesh key list)")
				return nil
			}
		}},
		{name: "key list", flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			asJSON := fs.Bool("json", false, "print JSON")
			history := fs.Bool("history", false, "list every key event instead: made, sealed, rotated, retired, recovered, revoked")
			return func(ctx context.Context, db *meshdb.DB, _ []string) error {
				if *history {
					return printKeyHistory(ctx, db, out, *asJSON)
				}
				keys, holders, err := db.ContentKeys(ctx)
				if err != nil {
					return err
				}
				type row struct {
					ID          string     `json:"id"`
					Created     time.Time  `json:"created_at"`
					RetireAt    *time.Time `json:"retire_at,omitempty"`
					Compromised bool       `json:"compromised,omitempty"` // a node removed as compromised held it: nobody seals with it
					Holders     []string   `json:"holders"`
				}
				rows := []row{}
				for _, k := range keys {
					if k.Scope != "" {
						continue // a scope's: meshbox mesh scope list
					}
					r := row{ID: k.ID, Created: k.CreatedAt, RetireAt: k.RetireAt, Compromised: k.Compromised, Holders: []string{}}
					for _, h := range holders {
						if h.KeyID == k.ID {
							r.Holders = append(r.Holders, h.Node)
						}
					}
					rows = append(rows, r)
				}
				if *asJSON {
					return writeJSON(out, rows)
				}
				table := [][]string{{"KEY", "CREATED", "RETIRES", "HELD BY"}}
				for _, r := range rows {
					retires := "-"
					if r.RetireAt != nil {
						retires = r.RetireAt.UTC().Format(time.RFC3339)
					}
					if r.Compromised {
						retires += " (compromised: no node seals with it)"
					}
					held := strings.Join(r.Holders, ",")
					if held == "" {
						held = "nobody yet (the first node to see it makes it)"
					}
					table = append(table, []string{r.ID, r.Created.UTC().Format(time.RFC3339), retires, held})
				}
				return writeTable(out, table)
			}
		}},
	}
}

// printKeyHistory prints the history of the mesh's keys, oldest first, as
// a table or as JSON.
func printKeyHistory(ctx context.Context, db *meshdb.DB, out io.Writer, asJSON bool) error {
	events, err := db.KeyHistory(ctx)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(out, orEmpty(events))
	}
	if len(events) == 0 {
		fmt.Fprintln(out, "no key events recorded yet")
		return nil
	}
	table := [][]string{{"AT", "EVENT", "KEY", "SCOPE", "HOLDER", "BY", "DETAIL"}}
	for _, e := range events {
		table = append(table, []string{e.At.UTC().Format(time.RFC3339), e.Kind, dash(e.Key), dash(e.Scope), dash(e.Holder), dash(e.By), clip(dash(e.Detail), 120)})
	}
	return writeTable(out, table)
}
