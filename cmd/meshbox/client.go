package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/cache"
	"github.com/nats-io/nats.go"
)

// defaultServer is the local node's NATS address.
const defaultServer = "nats://" + appliance.DefaultNATS

// serverFlag adds --server (defaulting to MESHBOX_SERVER) and --creds to
// fs: where the local node is and the credential to reach it with.
func (m *Main) serverFlag(fs *flag.FlagSet) *string {
	fs.StringVar(&m.creds, "creds", m.Getenv("MESHBOX_CREDS"),
		"credential file (an nkey seed) for the node's NATS server (env MESHBOX_CREDS; default: "+programs.AdminFile+" in the data directory, MESHBOX_DATA, when readable)")
	return fs.String("server", m.envOr("MESHBOX_SERVER", defaultServer), "NATS URL of the local node (env MESHBOX_SERVER)")
}

// credsFile is the credential the CLI connects with: --creds, else the
// node's administrative credential in the data directory when this user
// can read it, else none (a standalone node lets anyone in).
func (m *Main) credsFile() string {
	if m.creds != "" {
		return m.creds
	}
	dir := m.envOr("MESHBOX_DATA", appliance.DefaultDataDir())
	path := filepath.Join(dir, programs.AdminFile)
	if f, err := os.Open(path); err == nil {
		f.Close()
		return path
	}
	return ""
}

// connectNode connects to the local node's NATS server, failing fast.
func (m *Main) connectNode(url string) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name("meshbox-cli"),
		nats.Timeout(2 * time.Second),
		nats.NoReconnect(),
	}
	if creds := m.credsFile(); creds != "" {
		key, err := programs.LoadKey(creds)
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.Nkey(key.Public(), key.Sign))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		hint := ""
		if errors.Is(err, nats.ErrAuthorization) {
			hint = " (the node wants a credential: --creds FILE, or run as a user who can read " + programs.AdminFile + " in the node's data directory)"
		}
		return nil, fmt.Errorf("cannot reach the node at %s: %v%s", appliance.RedactURL(url), err, hint)
	}
	return nc, nil
}

// nodeStatus asks the node at url for its status. raw is the JSON as the
// node sent it.
func (m *Main) nodeStatus(ctx context.Context, url string) (st appliance.Status, raw []byte, err error) {
	nc, err := m.connectNode(url)
	if err != nil {
		return st, nil, err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, appliance.SubjectStatus, nil)
	if err != nil {
		return st, nil, fmt.Errorf("node at %s did not answer a status request: %v", appliance.RedactURL(url), err)
	}
	if err := json.Unmarshal(msg.Data, &st); err != nil {
		return st, nil, fmt.Errorf("node at %s sent a status this meshbox cannot read: %v", appliance.RedactURL(url), err)
	}
	return st, msg.Data, nil
}

// StatusCommand shows the local node's status.
type StatusCommand struct{ m *Main }

// Run prints the status as a short report, or as JSON with --json.
func (c *StatusCommand) Run(ctx context.Context, args []string) error {
	fs := c.m.newFlagSet("status", "status [--json] [--server URL]")
	server := c.m.serverFlag(fs)
	asJSON := fs.Bool("json", false, "print the full status as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("status takes no arguments")
	}
	st, raw, err := c.m.nodeStatus(ctx, *server)
	if err != nil {
		return err
	}
	if *asJSON {
		var v any
		_ = json.Unmarshal(raw, &v)
		enc := json.NewEncoder(c.m.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	printStatus(c.m.Stdout, st)
	return nil
}

// printStatus writes the parts of a status an operator looks at first.
func printStatus(w io.Writer, st appliance.Status) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("node", fmt.Sprintf("%s (meshbox %s)", st.Node, st.Version))
	row("started", fmt.Sprintf("%s (up %s)", st.StartedAt.Format(time.RFC3339), secs(st.UptimeSeconds)))
	nats := st.NATS.URL
	switch st.NATS.Auth {
	case appliance.AuthOpen:
		nats += ", open to programs without a credential"
	case appliance.AuthCredentials:
		nats += fmt.Sprintf(", credentials required (%d programs)", len(st.NATS.Programs))
	}
	row("nats", nats)
	row("http", st.HTTP.URL)
	for _, w := range st.Warnings {
		row("warning", w)
	}
	for _, e := range st.NATS.ProgramErrors {
		row("warning", "program left out: "+e)
	}
	broker := st.Broker.State
	if st.Broker.URL != "" {
		broker += " " + st.Broker.URL
	}
	if !st.Broker.Since.IsZero() {
		broker += " since " + st.Broker.Since.Format(time.RFC3339)
	}
	if st.Broker.Reason != "" {
		broker += ": " + st.Broker.Reason
	}
	row("broker", broker)
	if len(st.Broker.URLs) > 1 {
		row("brokers", fmt.Sprintf("%d URLs, on %s", len(st.Broker.URLs), st.Broker.Broker))
	}
	switch n := st.Broker.CommandBatch; {
	case st.Broker.State == bridge.StateNone:
		// No broker: nothing is batched, and nothing needs saying.
	case n == 1:
		row("batches", "off: every command alone (bridge.command_batch is 1, a peer of an older meshbox is up, or discovery has not heard from the peers yet)")
	case n > 1:
		row("batches", fmt.Sprintf("up to %d commands per broker message", n))
	}
	if n := len(st.Broker.Failovers); n > 0 {
		f := st.Broker.Failovers[n-1]
		row("failover", fmt.Sprintf("%s -> %s at %s (%s); %d recorded", f.From, f.To, f.At.Format(time.RFC3339), f.Reason, n))
	}
	if id := st.Identity; id != nil {
		v := fmt.Sprintf("broker user %s, generation %d, %s", id.BrokerUser, id.Generation, id.State)
		if !id.CreatedAt.IsZero() {
			v += ", age " + secs(id.AgeSeconds)
		}
		row("identity", v)
		if id.Rotation != "" {
			row("rotation", id.Rotation)
		}
	}
	b := "source " + st.Bindings.Source
	if st.Bindings.Source != cache.SourceNone {
		b += fmt.Sprintf(", revision %d, age %s", st.Bindings.Revision, secs(st.Bindings.AgeSeconds))
	}
	if st.Bindings.Warning != "" {
		b += " — WARNING: " + st.Bindings.Warning
	}
	row("bindings", b)
	row("sealing", sealingLine(st.Keys))
	if bl := st.Blobs; bl != nil {
		v := fmt.Sprintf("%d, %.1f of %.1f MiB", bl.Count, float64(bl.Bytes)/(1<<20), float64(bl.MaxBytes)/(1<<20))
		if bl.MaxAge != "" {
			v += ", kept at most " + bl.MaxAge
		}
		if bl.Pruned > 0 {
			v += fmt.Sprintf(", %d deleted by the size limit", bl.Pruned)
		}
		if bl.Error != "" {
			v += " — " + bl.Error
		}
		row("blobs", v+" (meshbox blob list)")
	}
	if len(st.Peers) > 0 {
		parts := make([]string, len(st.Peers))
		for i, p := range st.Peers {
			parts[i] = fmt.Sprintf("%s (%s)", p.Name, p.State)
		}
		row("peers", strings.Join(parts, ", "))
	}
	if len(st.Capabilities.Local) > 0 {
		row("hosts", strings.Join(st.Capabilities.Local, " "))
	}
	if len(st.Capabilities.Remote) > 0 {
		var parts []string
		for name, nodes := range st.Capabilities.Remote {
			parts = append(parts, fmt.Sprintf("%s@%v", name, nodes))
		}
		sort.Strings(parts)
		row("reaches", strings.Join(parts, " "))
	}
	if len(st.Modules) > 0 {
		counts := map[string]int{}
		for _, m := range st.Modules {
			counts[m.State]++
		}
		var parts []string
		for state, n := range counts {
			parts = append(parts, fmt.Sprintf("%d %s", n, state))
		}
		sort.Strings(parts)
		row("modules", strings.Join(parts, ", ")+" (meshbox modules)")
		for _, m := range st.Modules {
			if m.Error != "" {
				row("MODULE", m.Module+": "+m.Error)
			}
			for _, w := range m.Warnings {
				row("MODULE", w)
			}
		}
	}
	row("outbox", fmt.Sprintf("%d messages, oldest %s", st.Outbox.Depth, secs(st.Outbox.OldestAgeSeconds)))
	for _, s := range st.Stalls {
		row("STALL", fmt.Sprintf("stage %s: %s", s.Stage, s.Reason))
	}
	row("commands", fmt.Sprintf("%d in flight", len(st.Commands)))
	for _, c := range st.Commands[:min(len(st.Commands), 10)] {
		lease := fmt.Sprintf("lease %s left", secs(c.LeaseRemainingSeconds))
		if c.State == "retry" {
			lease = "waiting to be retried"
		}
		row("command", fmt.Sprintf("stage %s id %s attempt %d, age %s, %s", c.Stage, c.MsgID, c.Attempt, secs(c.AgeSeconds), lease))
	}
	if len(st.DeadLetters) > 0 {
		var parts []string
		for _, stage := range slices.Sorted(maps.Keys(st.DeadLetters)) {
			parts = append(parts, fmt.Sprintf("%s %d", stage, st.DeadLetters[stage]))
		}
		row("dead letters", strings.Join(parts, ", ")+" (meshbox dlq list STAGE)")
	}
	for _, e := range st.Errors[:min(len(st.Errors), 5)] {
		row("error", strings.TrimSpace(fmt.Sprintf("%s %s %s %s", e.At.Format(time.RFC3339), e.Component, e.Message, e.Detail)))
	}
	_ = tw.Flush()
}

// sealingLine says whether the mesh's messages are sealed and with which
// key, and which keys the node lacks.
func sealingLine(k *appliance.KeysStatus) string {
	if k == nil {
		return "off (no mesh database: no keys)"
	}
	line := "on, key " + k.Current
	if k.Current == "" {
		line = "on, but no content key yet: this node cannot send to the mesh"
	}
	line += ", node key " + k.NodeKey
	for _, name := range slices.Sorted(maps.Keys(k.Scopes)) {
		if id := k.Scopes[name]; id != "" {
			line += "; scope " + name + " key " + id
		} else {
			line += "; scope " + name + " (no key yet)"
		}
	}
	if len(k.Lacking) > 0 {
		line += " — LACKS " + strings.Join(k.Lacking, ", ")
	}
	return line
}

// secs writes a number of seconds as a duration.
func secs(s float64) string {
	return (time.Duration(s) * time.Second).String()
}

// VersionCommand prints the binary's version and, when it answers, the local
// node's.
type VersionCommand struct{ m *Main }

// Run prints the version lines.
func (c *VersionCommand) Run(ctx context.Context, args []string) error {
	fs := c.m.newFlagSet("version", "version [--server URL] [--json]")
	server := c.m.serverFlag(fs)
	asJSON := fs.Bool("json", false, "print as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	b := appliance.Build()
	out := map[string]any{"client": b}
	st, _, err := c.m.nodeStatus(ctx, *server)
	if err == nil {
		out["node"] = map[string]any{"name": st.Node, "version": st.Version, "commit": st.Commit,
			"build_date": st.BuildDate, "go_version": st.GoVersion, "arch": st.Arch}
	} else {
		out["node_error"] = err.Error()
	}
	if *asJSON {
		enc := json.NewEncoder(c.m.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	printBuild(c.m.Stdout, b)
	if err != nil {
		fmt.Fprintf(c.m.Stdout, "node: %v\n", err)
		return nil
	}
	fmt.Fprintf(c.m.Stdout, "node %s runs ", st.Node)
	printBuild(c.m.Stdout, appliance.BuildInfo{Version: st.Version, Commit: st.Commit, Date: st.BuildDate, Go: st.GoVersion, Arch: st.Arch})
	return nil
}

// printBuild writes the binary's build: version, then commit, build date,
// Go version and platform, one per line.
func printBuild(w io.Writer, b appliance.BuildInfo) {
	fmt.Fprintf(w, "meshbox %s\n", b.Version)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "  commit\t%s\n", dash(b.Commit))
	fmt.Fprintf(tw, "  built\t%s\n", dash(b.Date))
	fmt.Fprintf(tw, "  go\t%s\n", b.Go)
	fmt.Fprintf(tw, "  arch\t%s\n", b.Arch)
	_ = tw.Flush()
}
