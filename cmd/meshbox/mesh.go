package main

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/internal/seal"
)

// MeshCommand administers the mesh database: nodes, assignments,
// overrides, settings and grants. Every change runs in one transaction and
// bumps the mesh revision, which running nodes follow.
type MeshCommand struct {
	m     *Main
	dbURL string // the --db URL, set before a command's action runs
}

const meshUsage = `Usage: meshbox mesh <command> [--db URL] [flags] [arguments]

Nodes:
  node add NAME --broker-admin URL [--stages S,...] [--ttl 24h] [--public-name N] [--identity TEXT]
                                    (prints a join token for meshbox join; --record-only: record only;
                                    the node consumes no stage unless --stages names them, * = all)
  node set NAME [--public-name N] [--identity TEXT]
  node rotate NAME|--all --broker-admin URL [--wait 2m] [--force]
                                    (new broker credential; the old one is revoked once
                                    the node switched; --force revokes without waiting)
  node set-stages NAME STAGE... --broker-admin URL   (the stages it may consume; * = all)
  node rejoin NAME --broker-admin URL [--ttl 24h]
                                    (a new join token and credential for an existing node,
                                    its bindings kept; revokes its older credentials)
  node remove NAME [--force] [--broker-admin URL] [--compromised [--retention 24h] [--wait 1m]]
                                    (--force also removes its bindings; deletes its broker users;
                                    --compromised also rotates every key it held)
  node list [--json]
Assignments:
  assign NODE MODULE [--selection S] [--autostart]
  unassign NODE MODULE
  assignments [--node NODE] [--json]
Overrides:
  override set NODE MODULE KEY VALUE
  override unset NODE MODULE KEY
  override list [--node NODE] [--json]
Settings:
  setting get KEY
  setting set KEY VALUE
  setting unset KEY
  setting list [--json]
Grants:
  grant CONSUMER RESOURCE PROVIDER [--credential-file FILE|-]
  revoke CONSUMER RESOURCE PROVIDER
  grants [--consumer NODE] [--json]
Keys:
  key list [--json] [--history]      the content keys and which nodes hold them
                                     (--history: every key made, sealed, rotated, retired,
                                     recovered or revoked)
  key rotate [--retention 24h]       add a content key; the old ones retire after --retention
Scopes (keys for a subset of nodes, bound to capabilities, stages, topics):
  scope add NAME --nodes A,B         create a scope held by these nodes, with its own key
  scope bind NAME [--cap C,...] [--stage S,...] [--topic T,...] [--table T,...]
                                     seal these names' traffic with the scope's key (--unbind: undo)
  scope list [--json]                scopes, their nodes, bindings and keys
  scope rotate NAME [--retention 24h] add a key to the scope; its old ones retire after --retention
Tables of rows (each converges across the mesh; see meshbox rows):
  table add TABLE [--scope S] [--broker-admin URL]
                                     define a table (sealed with the mesh's key, or scope S's);
                                     with --broker-admin, make its log on the broker (needed
                                     when the nodes have broker users of their own)
  table bind TABLE --scope S         seal its changes with scope S's key from now on
  table list [--json]                the tables and what seals them
Other:
  revision                           the current mesh revision
  status [--server URL] [--json]     the whole mesh at a glance, as the local node sees it:
                                     one line a node (its health, broker link, bindings,
                                     outbox, first warning); exit 1 when a node is not ok

Every command but status takes --db URL (env MESHBOX_DB). --broker-admin (env
MESHBOX_BROKER_ADMIN) is the broker's management API with the admin
credential; it is used for the command and never stored.
`

// meshLeaf is one `meshbox mesh` command: its flags, argument names and action.
type meshLeaf struct {
	name string   // e.g. "node add"
	args []string // positional argument names
	// anyArgs: the action checks the number of positional arguments.
	anyArgs bool
	flags   func(fs *flag.FlagSet) func(ctx context.Context, db *meshdb.DB, args []string) error
}

// meshCommands are mesh's subcommands, from its table of commands
// (allLeaves) and status: a command of two words ("node add") is a
// subcommand of its first.
func meshCommands() []command {
	// Only the names and arguments are read: no leaf runs on this Main.
	var out []command
	for _, leaf := range (&MeshCommand{m: quietMain()}).allLeaves() {
		first, second, two := strings.Cut(leaf.name, " ")
		c := meshLeafCommand(leaf)
		if !two {
			out = append(out, c)
			continue
		}
		c.name = second
		i := slices.IndexFunc(out, func(c command) bool { return c.name == first })
		if i < 0 {
			i = len(out)
			out = append(out, command{name: first})
		}
		out[i].children = append(out[i].children, c)
	}
	return append(out, command{name: "status", synopsis: "mesh status [--server URL] [--json]", flagsFirst: true,
		flags: func(m *Main, fs *flag.FlagSet) action { return (&MeshCommand{m: m}).statusFlags(fs) }})
}

// meshLeafCommand is the command of a leaf of mesh's table: it opens the
// mesh database (--db) and runs the leaf's action on it.
func meshLeafCommand(leaf meshLeaf) command {
	synopsis := "mesh " + leaf.name
	for _, a := range leaf.args {
		synopsis += " " + a
	}
	var args []word
	for _, a := range leaf.args {
		if a == "NAME" && !strings.HasPrefix(leaf.name, "node ") {
			a = "" // of a scope
		}
		args = append(args, meshWords[a])
	}
	if strings.HasSuffix(leaf.name, " add") {
		args = nil // it names a new one
	}
	return command{
		name:     leaf.name,
		synopsis: synopsis + " [flags]",
		args:     args,
		flags: func(m *Main, fs *flag.FlagSet) action {
			c := &MeshCommand{m: m}
			i := slices.IndexFunc(c.allLeaves(), func(l meshLeaf) bool { return l.name == leaf.name })
			leaf := c.allLeaves()[i] // its closures on this Main
			dbURL := m.envFlag(fs, "db", "MESHBOX_DB", "mesh database URL postgres://... (env MESHBOX_DB)")
			act := leaf.flags(fs)
			return func(ctx context.Context, pos []string) error {
				if len(pos) != len(leaf.args) && !leaf.anyArgs {
					fs.Usage()
					return usagef("mesh %s: want %d arguments (%s), got %d", leaf.name, len(leaf.args), strings.Join(leaf.args, " "), len(pos))
				}
				if *dbURL == "" {
					return usagef("mesh %s: --db is required (or set MESHBOX_DB)", leaf.name)
				}
				db, err := meshdb.Open(ctx, *dbURL, meshdb.Options{})
				if err != nil {
					return err
				}
				defer db.Close()
				c.dbURL = *dbURL
				return act(ctx, db, pos)
			}
		},
	}.withValues(map[string]word{"node": wordNode, "consumer": wordNode, "credential-file": wordFile})
}

// meshWords are the kinds of words mesh's arguments are, by the names
// its table gives them (NAME: of a node).
var meshWords = map[string]word{"NAME": wordNode, "NODE": wordNode, "CONSUMER": wordNode, "PROVIDER": wordNode,
	"STAGE...": wordStage, "TABLE": wordTable}

// allLeaves are mesh's commands that work on the database.
func (c *MeshCommand) allLeaves() []meshLeaf {
	return slices.Concat(c.leaves(), c.keyLeaves(), c.scopeLeaves(), c.tableLeaves())
}

// parseInterleaved parses flags that may come before, between or after
// positional arguments, and returns the positional ones.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// report prints the outcome of a change.
func (c *MeshCommand) report(what string, ch meshdb.Change) {
	if ch.Changed {
		fmt.Fprintf(c.m.Stdout, "%s (mesh revision %d)\n", what, ch.Revision)
	} else {
		fmt.Fprintf(c.m.Stdout, "%s: already so, nothing changed (mesh revision %d)\n", what, ch.Revision)
	}
}

// adminFlag adds --broker-admin to fs.
func (m *Main) adminFlag(fs *flag.FlagSet) *string {
	return m.envFlag(fs, "broker-admin", "MESHBOX_BROKER_ADMIN",
		"broker management API with the admin credential, http(s)://USER:PASSWORD@host:15672 (env MESHBOX_BROKER_ADMIN); never stored")
}

func (c *MeshCommand) leaves() []meshLeaf {
	out := c.m.Stdout
	adminFlag := c.m.adminFlag
	return []meshLeaf{
		{name: "node add", args: []string{"NAME"}, flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			public := fs.String("public-name", "", "public (DNS) name")
			identity := fs.String("identity", "", "identity text")
			admin := adminFlag(fs)
			stages := fs.String("stages", "", "stages the node may consume, comma-separated (* = all; default none, see node set-stages)")
			ttl := fs.Duration("ttl", meshdb.DefaultJoinTTL, "how long the join token stays valid")
			recordOnly := fs.Bool("record-only", false, "only record the node: no broker user, database role or join token")
			kitFile := c.m.envFlag(fs, "kit", "MESHBOX_KIT", "the mesh's recovery kit file: seal the mesh's keys for the node now, so that it opens them alone (env MESHBOX_KIT)")
			lostKeys := fs.String("lost-keys", "", "with --kit: content keys the kit has no copy of, whose holders are all lost, comma-separated: add the node without them")
			scopes := fs.String("scopes", "", "scopes the node is a member of, comma-separated (their keys are sealed for it, with the kit or by a member)")
			return func(ctx context.Context, db *meshdb.DB, a []string) error {
				if *ttl <= 0 {
					return usagef("mesh node add: --ttl %s: must be more than 0", *ttl)
				}
				rec := cache.NodeRecord{Name: a[0], PublicName: *public, Identity: *identity}
				var kit *seal.Kit
				if *kitFile != "" {
					if *recordOnly {
						return usagef("mesh node add: --kit seals keys for a node with an identity; not with --record-only")
					}
					k, err := readKit(*kitFile)
					if err != nil {
						return err
					}
					kit = k
				}
				if *lostKeys != "" && *kitFile == "" {
					return usagef("mesh node add: --lost-keys goes with --kit: the keys the kit has no copy of")
				}
				if *recordOnly && *scopes != "" {
					return usagef("mesh node add: --scopes makes a node with an identity a member; not with --record-only")
				}
				if *recordOnly {
					ch, err := db.AddNode(ctx, rec)
					if err != nil {
						return err
					}
					c.report(fmt.Sprintf("node %s added (record only)", a[0]), ch)
					return nil
				}
				if *admin == "" {
					return usagef("mesh node add: --broker-admin is required (or set MESHBOX_BROKER_ADMIN) to make the node's broker user; --record-only records the node without an identity")
				}
				return c.addNode(ctx, db, rec, *admin, newNodeOptions{stages: splitList(*stages), scopes: splitList(*scopes), ttl: *ttl, kit: kit, lostKeys: splitList(*lostKeys)})
			}
		}},
		{name: "node set", args: []string{"NAME"}, flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			public := fs.String("public-name", "", "public (DNS) name")
			identity := fs.String("identity", "", "identity text")
			return func(ctx context.Context, db *meshdb.DB, a []string) error {
				ch, err := db.UpdateNode(ctx, cache.NodeRecord{Name: a[0], PublicName: *public, Identity: *identity})
				if err != nil {
					return err
				}
				c.report(fmt.Sprintf("node %s updated", a[0]), ch)
				return nil
			}
		}},
		{name: "node rejoin", args: []string{"NAME"}, flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			admin := adminFlag(fs)
			ttl := fs.Duration("ttl", meshdb.DefaultJoinTTL, "how long the join token stays valid")
			return func(ctx context.Context, db *meshdb.DB, a []string) error {
				if *ttl <= 0 {
					return usagef("mesh node rejoin: --ttl %s: must be more than 0", *ttl)
				}
				if *admin == "" {
					return usagef("mesh node rejoin: --broker-admin is required (or set MESHBOX_BROKER_ADMIN) to make the node's new broker user")
				}
				return c.rejoin(ctx, db, a[0], *admin, *ttl)
			}
		}},
		{name: "node remove", args: []string{"NAME"}, flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			force := fs.Bool("force", false, "also remove the node's assignments, overrides and grants")
			compromised := fs.Bool("compromised", false, "the node is compromised: also rotate every key it held (the mesh's and its scopes'), so that its files open nothing written afterwards")
			retention := fs.Duration("retention", meshdb.DefaultKeyRetention, "with --compromised: how long members still open what the replaced keys sealed")
			wait := fs.Duration("wait", DefaultCompromiseWait, "with --compromised: how long to wait for the remaining nodes to hold the new keys (0: do not wait)")
			admin := adminFlag(fs)
			return func(ctx context.Context, db *meshdb.DB, a []string) error {
				if !*compromised {
					if given(fs, "retention") || given(fs, "wait") {
						return usagef("mesh node remove: --retention and --wait go with --compromised")
					}
					return c.removeNode(ctx, db, a[0], *force, *admin)
				}
				switch {
				case *retention < time.Minute:
					return usagef("mesh node remove --compromised: --retention %s is shorter than a minute: members could not open messages in flight", *retention)
				case *wait < 0 || *wait > time.Hour:
					return usagef("mesh node remove --compromised: --wait %s: must be 0 or more and at most 1h", *wait)
				}
				return c.removeCompromised(ctx, db, a[0], *force, *admin, *retention, *wait)
			}
		}},
		{name: "node rotate", args: []string{"NAME"}, anyArgs: true, flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			all := fs.Bool("all", false, "rotate every node that has a broker credential")
			wait := fs.Duration("wait", DefaultRotateWait, "how long to wait for the nodes to switch (at most 24h)")
			force := fs.Bool("force", false, "revoke the old credential of nodes that did not switch in time")
			admin := adminFlag(fs)
			return func(ctx context.Context, db *meshdb.DB, a []string) error {
				switch {
				case *all && len(a) > 0:
					return usagef("mesh node rotate: give a node NAME or --all, not both")
				case !*all && len(a) != 1:
					return usagef("mesh node rotate: give one node NAME, or --all")
				case *wait <= 0 || *wait > 24*time.Hour:
					return usagef("mesh node rotate: --wait %s: must be more than 0 and at most 24h", *wait)
				case *admin == "":
					return usagef("mesh node rotate: --broker-admin is required (or set MESHBOX_BROKER_ADMIN)")
				}
				name := ""
				if !*all {
					name = a[0]
				}
				return c.rotate(ctx, db, name, *admin, *wait, *force)
			}
		}},
		{name: "node set-stages", args: []string{"NAME", "STAGE..."}, anyArgs: true, flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			admin := adminFlag(fs)
			return func(ctx context.Context, db *meshdb.DB, a []string) error {
				if len(a) < 2 {
					return usagef("mesh node set-stages: want a node NAME and at least one STAGE (* = all), got %d arguments", len(a))
				}
				return c.setStages(ctx, db, a[0], a[1:], *admin)
			}
		}},
		{name: "node list", flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			asJSON := fs.Bool("json", false, "print JSON")
			return func(ctx context.Context, db *meshdb.DB, _ []string) error {
				nodes, err := db.Nodes(ctx)
				if err != nil {
					return err
				}
				if *asJSON {
					return writeJSON(out, orEmpty(nodes))
				}
				gens, err := db.CredentialGenerations(ctx, "")
				if err != nil {
					return err
				}
				rows := [][]string{{"NAME", "PUBLIC NAME", "IDENTITY", "CREDENTIAL"}}
				for _, n := range nodes {
					rows = append(rows, []string{n.Name, n.PublicName, clip(n.Identity, 40), describeGenerations(gens, n.Name)})
				}
				return writeTable(out, rows)
			}
		}},
		{name: "assign", args: []string{"NODE", "MODULE"}, flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			selection := fs.String("selection", "", "which version or variant of the module")
			autostart := fs.Bool("autostart", false, "start the module when the node starts")
			return func(ctx context.Context, db *meshdb.DB, a []string) error {
				ch, err := db.Assign(ctx, a[0], cache.Assignment{Module: a[1], Selection: *selection, Autostart: *autostart})
				if err != nil {
					return err
				}
				c.report(fmt.Sprintf("module %s assigned to node %s", a[1], a[0]), ch)
				return nil
			}
		}},
		{name: "unassign", args: []string{"NODE", "MODULE"}, flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			return func(ctx context.Context, db *meshdb.DB, a []string) error {
				ch, err := db.Unassign(ctx, a[0], a[1])
				if err != nil {
					return err
				}
				c.report(fmt.Sprintf("module %s unassigned from node %s", a[1], a[0]), ch)
				return nil
			}
		}},
		{name: "assignments", flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			node := fs.String("node", "", "only this node's")
			asJSON := fs.Bool("json", false, "print JSON")
			return func(ctx context.Context, db *meshdb.DB, _ []string) error {
				as, err := db.Assignments(ctx, *node)
				if err != nil {
					return err
				}
				if *asJSON {
					type row struct {
						Node string `json:"node"`
						cache.Assignment
					}
					rows := []row{}
					for _, a := range as {
						rows = append(rows, row{a.Node, a.Assignment})
					}
					return writeJSON(out, rows)
				}
				rows := [][]string{{"NODE", "MODULE", "SELECTION", "AUTOSTART"}}
				for _, a := range as {
					rows = append(rows, []string{a.Node, a.Module, a.Selection, fmt.Sprint(a.Autostart)})
				}
				return writeTable(out, rows)
			}
		}},
		{name: "override set", args: []string{"NODE", "MODULE", "KEY", "VALUE"}, flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			return func(ctx context.Context, db *meshdb.DB, a []string) error {
				ch, err := db.SetOverride(ctx, a[0], cache.Override{Module: a[1], Key: a[2], Value: a[3]})
				if err != nil {
					return err
				}
				c.report(fmt.Sprintf("override %s/%s set for node %s", a[1], a[2], a[0]), ch)
				return nil
			}
		}},
		{name: "override unset", args: []string{"NODE", "MODULE", "KEY"}, flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			return func(ctx context.Context, db *meshdb.DB, a []string) error {
				ch, err := db.UnsetOverride(ctx, a[0], a[1], a[2])
				if err != nil {
					return err
				}
				c.report(fmt.Sprintf("override %s/%s unset for node %s", a[1], a[2], a[0]), ch)
				return nil
			}
		}},
		{name: "override list", flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			node := fs.String("node", "", "only this node's")
			asJSON := fs.Bool("json", false, "print JSON")
			return func(ctx context.Context, db *meshdb.DB, _ []string) error {
				ovs, err := db.Overrides(ctx, *node)
				if err != nil {
					return err
				}
				if *asJSON {
					type row struct {
						Node string `json:"node"`
						cache.Override
					}
					rows := []row{}
					for _, o := range ovs {
						rows = append(rows, row{o.Node, o.Override})
					}
					return writeJSON(out, rows)
				}
				rows := [][]string{{"NODE", "MODULE", "KEY", "VALUE"}}
				for _, o := range ovs {
					rows = append(rows, []string{o.Node, o.Module, o.Key, clip(o.Value, 60)})
				}
				return writeTable(out, rows)
			}
		}},
		{name: "setting get", args: []string{"KEY"}, flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			return func(ctx context.Context, db *meshdb.DB, a []string) error {
				v, err := db.Setting(ctx, a[0])
				if err != nil {
					return err
				}
				fmt.Fprintln(out, v)
				return nil
			}
		}},
		{name: "setting set", args: []string{"KEY", "VALUE"}, flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			return func(ctx context.Context, db *meshdb.DB, a []string) error {
				ch, err := db.SetSetting(ctx, a[0], a[1])
				if err != nil {
					return err
				}
				c.report(fmt.Sprintf("setting %s = %s", a[0], cache.RedactURL(a[1])), ch)
				return nil
			}
		}},
		{name: "setting unset", args: []string{"KEY"}, flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			return func(ctx context.Context, db *meshdb.DB, a []string) error {
				ch, err := db.UnsetSetting(ctx, a[0])
				if err != nil {
					return err
				}
				c.report(fmt.Sprintf("setting %s unset", a[0]), ch)
				return nil
			}
		}},
		{name: "setting list", flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			asJSON := fs.Bool("json", false, "print JSON (values as stored)")
			return func(ctx context.Context, db *meshdb.DB, _ []string) error {
				s, err := db.Settings(ctx)
				if err != nil {
					return err
				}
				if *asJSON {
					return writeJSON(out, s)
				}
				rows := [][]string{{"KEY", "VALUE"}}
				for _, k := range sortedKeys(s) {
					rows = append(rows, []string{k, clip(cache.RedactURL(s[k]), 80)})
				}
				return writeTable(out, rows)
			}
		}},
		{name: "grant", args: []string{"CONSUMER", "RESOURCE", "PROVIDER"}, flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			credFile := fs.String("credential-file", "", "read the credential from this file (- = standard input); none if not given")
			return func(ctx context.Context, db *meshdb.DB, a []string) error {
				cred, err := c.readCredential(*credFile)
				if err != nil {
					return err
				}
				ch, err := db.Grant(ctx, cache.Grant{Consumer: a[0], Resource: a[1], Provider: a[2], Credential: cache.Credential(cred)})
				if err != nil {
					return err
				}
				c.report(fmt.Sprintf("node %s granted %s from %s", a[0], a[1], a[2]), ch)
				return nil
			}
		}},
		{name: "revoke", args: []string{"CONSUMER", "RESOURCE", "PROVIDER"}, flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			return func(ctx context.Context, db *meshdb.DB, a []string) error {
				ch, err := db.Revoke(ctx, a[0], a[1], a[2])
				if err != nil {
					return err
				}
				c.report(fmt.Sprintf("grant of %s from %s to node %s revoked", a[1], a[2], a[0]), ch)
				return nil
			}
		}},
		{name: "grants", flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			consumer := fs.String("consumer", "", "only this node's")
			asJSON := fs.Bool("json", false, "print JSON (without credentials)")
			return func(ctx context.Context, db *meshdb.DB, _ []string) error {
				gs, err := db.Grants(ctx, *consumer)
				if err != nil {
					return err
				}
				if *asJSON {
					type row struct {
						Consumer      string `json:"consumer"`
						Resource      string `json:"resource"`
						Provider      string `json:"provider"`
						HasCredential bool   `json:"has_credential"`
					}
					rows := []row{}
					for _, g := range gs {
						rows = append(rows, row{g.Consumer, g.Resource, g.Provider, g.Credential != "" || g.SealedCredential != ""})
					}
					return writeJSON(out, rows)
				}
				rows := [][]string{{"CONSUMER", "RESOURCE", "PROVIDER", "CREDENTIAL"}}
				for _, g := range gs {
					cred := "none"
					switch {
					case g.SealedCredential != "":
						cred = "sealed"
					case g.Credential != "":
						cred = "set"
					}
					rows = append(rows, []string{g.Consumer, g.Resource, g.Provider, cred})
				}
				return writeTable(out, rows)
			}
		}},
		{name: "revision", flags: func(fs *flag.FlagSet) func(context.Context, *meshdb.DB, []string) error {
			return func(ctx context.Context, db *meshdb.DB, _ []string) error {
				rev, err := db.Revision(ctx)
				if err != nil {
					return err
				}
				fmt.Fprintln(out, rev)
				return nil
			}
		}},
	}
}
