package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"github.com/meshbox/meshbox/cache"
)

// CacheCommand inspects a node's bindings cache (<data>/cache.db) with the
// node stopped: it opens the file read-only and never changes it.
type CacheCommand struct{ m *Main }

const cacheUsage = `Usage: meshbox cache <command> [--data DIR] [flags]

Commands (work with the node stopped; the file is opened read-only):
  show [--revision N] [--json] [--reveal]
                                 the newest cached snapshot (or revision N); secrets
                                 are masked unless --reveal (anyone who can read the
                                 file can read them anyway)
  history [--json]               the cached versions: revision, time, source, hash
  diff A B [--json]              what changed from revision A to revision B
  verify                         check the file's pages and every snapshot's hash

The node's data directory is found as meshbox run configures it (--data,
--env-file, --config, the environment; default: its env file, as meshbox
join writes it).
`

// cacheCommands are cache's subcommands.
func cacheCommands() []command {
	leaf := func(name, synopsis string, want int, run func(c *CacheCommand, f cacheFlags, store *cache.Store, pos []string) error) command {
		return command{name: name, synopsis: synopsis, flags: func(m *Main, fs *flag.FlagSet) action {
			c := &CacheCommand{m: m}
			m.nodeFlags(fs)
			f := cacheFlags{asJSON: fs.Bool("json", false, "print JSON")}
			f.rev = fs.Int64("revision", 0, "show: this revision instead of the newest")
			f.reveal = fs.Bool("reveal", false, "show: print credentials, passwords and secret-looking values as they are")
			return func(ctx context.Context, pos []string) error {
				if len(pos) != want {
					return usagef("cache %s: want %d arguments, got %d", name, want, len(pos))
				}
				store, err := c.open()
				if err != nil {
					return err
				}
				defer store.Close()
				return run(c, f, store, pos)
			}
		}}
	}
	return []command{
		leaf("show", "cache show [--revision N] [--json] [--reveal] [--data DIR]", 0, func(c *CacheCommand, f cacheFlags, store *cache.Store, _ []string) error {
			return c.show(store, *f.rev, *f.asJSON, *f.reveal)
		}),
		leaf("history", "cache history [--json] [--data DIR]", 0, func(c *CacheCommand, f cacheFlags, store *cache.Store, _ []string) error {
			return c.history(store, *f.asJSON)
		}),
		leaf("diff", "cache diff A B [--json] [--data DIR]", 2, func(c *CacheCommand, f cacheFlags, store *cache.Store, pos []string) error {
			return c.diff(store, pos[0], pos[1], *f.asJSON)
		}),
		leaf("verify", "cache verify [--data DIR]", 0, func(c *CacheCommand, _ cacheFlags, store *cache.Store, _ []string) error {
			return c.verify(store)
		}),
	}
}

// cacheFlags are the flags of cache's commands (they have always shared
// them).
type cacheFlags struct {
	asJSON, reveal *bool
	rev            *int64
}

// open opens the bindings cache of the node the flags name, read-only.
func (c *CacheCommand) open() (*cache.Store, error) {
	data, err := c.m.dataDir()
	if err != nil {
		return nil, err
	}
	path := filepath.Join(data, "cache.db")
	store, err := cache.Open(path, cache.StoreOptions{ReadOnly: true, LockTimeout: 500 * time.Millisecond})
	if err != nil {
		var locked *cache.LockedError
		if errors.As(err, &locked) {
			return nil, fmt.Errorf("%w (stop the node to inspect its cache)", err)
		}
		return nil, err
	}
	return store, nil
}

func (c *CacheCommand) show(store *cache.Store, rev int64, asJSON, reveal bool) error {
	var snap cache.Snapshot
	var err error
	if rev != 0 {
		snap, err = store.Get(rev)
	} else {
		snap, err = store.Latest()
	}
	if err != nil {
		return err
	}
	if !reveal {
		snap.Bindings = snap.Bindings.Redacted()
		snap.Source = cache.RedactURL(snap.Source)
	}
	b := snap.Bindings
	if asJSON {
		return writeJSON(c.m.Stdout, snap)
	}
	out := c.m.Stdout
	fmt.Fprintf(out, "node:       %s\nrevision:   %d\nhash:       %s\nfetched_at: %s (%s ago)\nsource:     %s\n",
		b.Node, snap.Revision, snap.Hash, snap.FetchedAt.Format(time.RFC3339), time.Since(snap.FetchedAt).Round(time.Second), snap.Source)
	fmt.Fprintf(out, "\nnodes (%d):\n", len(b.Nodes))
	rows := [][]string{{"  NAME", "PUBLIC NAME", "IDENTITY"}}
	for _, n := range b.Nodes {
		rows = append(rows, []string{"  " + n.Name, n.PublicName, clip(n.Identity, 40)})
	}
	writeTable(out, rows)
	fmt.Fprintf(out, "\nsettings (%d):\n", len(b.Settings))
	rows = [][]string{{"  KEY", "VALUE"}}
	for _, k := range sortedKeys(b.Settings) {
		rows = append(rows, []string{"  " + k, clip(b.Settings[k], 80)})
	}
	writeTable(out, rows)
	fmt.Fprintf(out, "\nassignments (%d):\n", len(b.Assignments))
	rows = [][]string{{"  MODULE", "SELECTION", "AUTOSTART"}}
	for _, a := range b.Assignments {
		rows = append(rows, []string{"  " + a.Module, a.Selection, strconv.FormatBool(a.Autostart)})
	}
	writeTable(out, rows)
	fmt.Fprintf(out, "\noverrides (%d):\n", len(b.Overrides))
	rows = [][]string{{"  MODULE", "KEY", "VALUE"}}
	for _, o := range b.Overrides {
		rows = append(rows, []string{"  " + o.Module, o.Key, clip(o.Value, 60)})
	}
	writeTable(out, rows)
	fmt.Fprintf(out, "\ngrants (%d):\n", len(b.Grants))
	rows = [][]string{{"  RESOURCE", "PROVIDER", "CREDENTIAL"}}
	for _, g := range b.Grants {
		cred := "none"
		switch {
		case g.SealedCredential != "":
			cred = "sealed"
		case g.Credential != "" && reveal:
			cred = g.Credential.Reveal()
		case g.Credential != "":
			cred = "set"
		}
		rows = append(rows, []string{"  " + g.Resource, g.Provider, cred})
	}
	if err := writeTable(out, rows); err != nil {
		return err
	}
	if b.Broker != nil {
		fmt.Fprintf(out, "\nbroker credential: user %s, generation %d, password %s\n", b.Broker.User, b.Broker.Generation, b.Broker.Password.Reveal())
		if b.Broker.DBRole != "" {
			fmt.Fprintf(out, "database role:     %s, password %s\n", b.Broker.DBRole, b.Broker.DBPassword.Reveal())
		}
	}
	return nil
}

func (c *CacheCommand) history(store *cache.Store, asJSON bool) error {
	hist, err := store.History()
	if err != nil {
		return err
	}
	for i := range hist { // written redacted; an older file may not be
		hist[i].Source = cache.RedactURL(hist[i].Source)
	}
	if asJSON {
		return writeJSON(c.m.Stdout, orEmpty(hist))
	}
	rows := [][]string{{"REVISION", "FETCHED AT", "SOURCE", "HASH", "NODES", "SETTINGS", "ASSIGNMENTS", "OVERRIDES", "GRANTS"}}
	for _, h := range hist {
		rows = append(rows, []string{strconv.FormatInt(h.Revision, 10), h.FetchedAt.Format(time.RFC3339), h.Source,
			cache.ShortHash(h.Hash), strconv.Itoa(h.Nodes), strconv.Itoa(h.Settings), strconv.Itoa(h.Assignments),
			strconv.Itoa(h.Overrides), strconv.Itoa(h.Grants)})
	}
	return writeTable(c.m.Stdout, rows)
}

func (c *CacheCommand) diff(store *cache.Store, a, b string, asJSON bool) error {
	ra, err := strconv.ParseInt(a, 10, 64)
	if err != nil {
		return usagef("cache diff: revision %q is not a number", a)
	}
	rb, err := strconv.ParseInt(b, 10, 64)
	if err != nil {
		return usagef("cache diff: revision %q is not a number", b)
	}
	sa, err := store.Get(ra)
	if err != nil {
		return err
	}
	sb, err := store.Get(rb)
	if err != nil {
		return err
	}
	d := cache.Diff(sa.Bindings, sb.Bindings)
	if asJSON {
		return writeJSON(c.m.Stdout, orEmpty(d))
	}
	fmt.Fprintf(c.m.Stdout, "revision %d -> %d: %s\n", ra, rb, d.Summary())
	for _, line := range d.Strings() {
		fmt.Fprintln(c.m.Stdout, "  "+line)
	}
	return nil
}

func (c *CacheCommand) verify(store *cache.Store) error {
	if err := store.Verify(); err != nil {
		return err
	}
	hist, err := store.History()
	if err != nil {
		return err
	}
	if len(hist) == 0 {
		fmt.Fprintf(c.m.Stdout, "%s: ok, no snapshots\n", store.Path())
		return nil
	}
	fmt.Fprintf(c.m.Stdout, "%s: ok, %d snapshots, newest revision %d (hash %s)\n",
		store.Path(), len(hist), hist[0].Revision, cache.ShortHash(hist[0].Hash))
	return nil
}
