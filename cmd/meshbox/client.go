package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
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
	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/cmd/meshbox/doctor"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats.go"
)

// A client command (status, call, program, dlq, ...) talks to a running
// node: it finds the node the way `meshbox run` configures it, with the
// same loader (appliance.LoadConfig: defaults, --config, the env file, the
// environment, --data), so that a node set up by `meshbox join` (its
// address and data directory in its env file) is found as it runs. The
// node's address is --server, else MESHBOX_SERVER, else where the loaded
// configuration has it listen; its credential is --creds, else
// MESHBOX_CREDS, else the administrative credential in its data directory,
// presented only to that node.

// clientFlags are the flags of a command that talks to a running node.
type clientFlags struct {
	server, data, envFile, config *string
	fs                            *flag.FlagSet

	loaded  bool
	cfg     appliance.Config
	envPath string // the env file the configuration was read from ("": none)
	err     error
}

// serverFlag adds the flags that say which node to talk to and how to
// reach it (--server, --creds, --data, --env-file, --config) to fs and
// returns --server's value: "" for the node the configuration names
// (resolved by connectNode).
func (m *Main) serverFlag(fs *flag.FlagSet) *string {
	m.envFlagVar(fs, &m.creds, "creds", "MESHBOX_CREDS",
		"credential file (an nkey seed) for the node's NATS server (env MESHBOX_CREDS; default: "+programs.AdminFile+" in the node's data directory, when readable)")
	m.nodeFlags(fs)
	m.client.server = m.envFlag(fs, "server", "MESHBOX_SERVER", "NATS URL of the node (env MESHBOX_SERVER; default: the address its configuration has it listen on)")
	return m.client.server
}

// nodeFlags adds the flags that say which node's configuration a command
// works with (--data, --env-file, --config) to fs; nodeConfig and dataDir
// read them.
func (m *Main) nodeFlags(fs *flag.FlagSet) {
	empty := ""
	m.client = &clientFlags{
		fs:      fs,
		server:  &empty,
		data:    fs.String("data", "", "the node's data directory (env MESHBOX_DATA; default: from its configuration)"),
		envFile: fs.String("env-file", "", "read the node's MESHBOX_* variables from this file first (default: "+appliance.DefaultEnvFile()+" if it exists, as written by meshbox join)"),
		config:  fs.String("config", "", "the node's JSON config file (env MESHBOX_CONFIG)"),
	}
}

// nodeConfig is the configuration of the node a client command talks to,
// loaded once.
func (m *Main) nodeConfig() (appliance.Config, error) {
	c := m.client
	if c == nil {
		env, err := m.defaultEnvFile(false)
		if err != nil {
			return appliance.Config{}, err
		}
		return appliance.LoadConfig(appliance.ConfigSources{EnvFile: env, Getenv: m.Getenv})
	}
	if !c.loaded {
		c.loaded = true
		env := *c.envFile
		if env == "" {
			if env, c.err = m.defaultEnvFile(*c.server != "" || *c.data != "" || *c.config != ""); c.err != nil {
				return c.cfg, c.err
			}
		}
		flags := map[string]string{}
		if *c.data != "" {
			flags["data"] = *c.data
		}
		c.envPath = env
		c.cfg, c.err = appliance.LoadConfig(appliance.ConfigSources{File: *c.config, EnvFile: env, Getenv: m.Getenv, Flags: flags})
		if c.err != nil {
			c.err = fmt.Errorf("the node's configuration: %w", c.err)
		}
	}
	return c.cfg, c.err
}

// defaultEnvFile is the env file a command reads the node's configuration
// from when none is named: the first of m.envFiles
// (appliance.NodeEnvFiles) that exists, "" when none does. One that
// exists but cannot be read is an error that says what to do, for the
// command would otherwise talk to a node of the default configuration
// (127.0.0.1:4222) without a word; unless named says the command was told
// which node by other means (--server, --data, --config, or their
// variables), and then the file is passed over.
func (m *Main) defaultEnvFile(named bool) (string, error) {
	files := m.envFiles
	if files == nil {
		files = appliance.NodeEnvFiles()
	}
	for _, n := range []string{"MESHBOX_NATS", "MESHBOX_DATA", "MESHBOX_CONFIG"} {
		named = named || m.Getenv(n) != ""
	}
	for _, p := range files {
		if p == "" {
			continue
		}
		err := readable(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue
		case err == nil:
			return p, nil
		case named:
			return "", nil
		}
		return "", fmt.Errorf("cannot read the node's configuration %s (%v): run the command as root (sudo meshbox ...) or as a user who may read that file, "+
			"or say which node to talk to: --env-file FILE, or --server URL (with --creds FILE when the node wants a credential)", p, err)
	}
	return "", nil
}

// readable reports why the file at path cannot be read, nil when it can.
func readable(path string) error {
	f, err := os.Open(path)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return pe.Err // the path is said by the caller
		}
		return err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return err
	} else if fi.IsDir() {
		return errors.New("it is a directory")
	}
	return nil
}

// dataDir is the data directory of the node a client command works on.
func (m *Main) dataDir() (string, error) {
	cfg, err := m.nodeConfig()
	if err != nil {
		return "", err
	}
	return cfg.DataDir, nil
}

// nodeTarget is a node to connect to: its NATS URL and the credential
// file to present ("" for none).
type nodeTarget struct {
	url, creds string
	implicit   bool // creds were picked from the data directory, not given
}

// target resolves the node to talk to: url as given (--server or
// MESHBOX_SERVER), else the configuration's listen address, and the
// credential to present: --creds, else the data directory's
// administrative credential when readable (implicit: connectNode tries
// again without it when the node refuses it, for it may be another
// node's).
func (m *Main) target(url string) (nodeTarget, error) {
	if m.client == nil && url != "" { // doctor: url and m.creds are its own
		return nodeTarget{url: url, creds: m.creds}, nil
	}
	cfg, err := m.nodeConfig()
	if err != nil {
		return nodeTarget{}, err
	}
	own := "nats://" + doctor.ConnectAddr(cfg.NATS)
	t := nodeTarget{url: url, creds: m.creds}
	if t.url == "" {
		t.url = own
	}
	if t.creds != "" {
		return t, nil
	}
	path := filepath.Join(cfg.DataDir, programs.AdminFile)
	if f, err := os.Open(path); err == nil {
		f.Close()
		t.creds, t.implicit = path, true
	}
	return t, nil
}

// connectNode connects to the node at url ("" for the one the
// configuration names), failing fast.
func (m *Main) connectNode(url string) (*nats.Conn, error) {
	t, err := m.target(url)
	if err != nil {
		return nil, err
	}
	base := []nats.Option{
		nats.Name("meshbox-cli"),
		nats.Timeout(2 * time.Second),
		nats.NoReconnect(),
	}
	opts := base
	var pub string
	if t.creds != "" {
		key, err := programs.LoadKey(t.creds)
		if err != nil {
			return nil, err
		}
		pub = key.Public()
		opts = append(slices.Clone(base), nats.Nkey(pub, key.Sign))
	}
	nc, err := nats.Connect(t.url, opts...)
	if err != nil && t.implicit && errors.Is(err, nats.ErrAuthorization) {
		// The data directory's credential may be another node's (a
		// command against a node on another port): this one may want
		// none.
		if nc2, err2 := nats.Connect(t.url, base...); err2 == nil {
			return nc2, nil
		}
	}
	if err != nil {
		hint := ""
		if errors.Is(err, nats.ErrAuthorization) {
			if t.creds == "" {
				hint = " (the node wants a credential: --creds FILE, or --data DIR of that node, or run as a user who can read " + programs.AdminFile + " in its data directory)"
			} else {
				how := "given with --creds or MESHBOX_CREDS"
				if t.implicit {
					how = "from the data directory"
				}
				hint = fmt.Sprintf(" (it refused the credential %s, %s, public key %s: is it that node's? --creds FILE or --data DIR names another)", t.creds, how, pub)
			}
		}
		return nil, fmt.Errorf("cannot reach the node at %s: %w%s", appliance.RedactURL(t.url), err, hint)
	}
	return nc, nil
}

// serverURL is the URL a client command reaches the node at, for what it
// prints.
func (m *Main) serverURL(url string) string {
	if t, err := m.target(url); err == nil {
		return t.url
	}
	return url
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

// flags defines its flags; its action prints the status as a short report, or as JSON with --json.
func (c *StatusCommand) flags(fs *flag.FlagSet) action {
	server := c.m.serverFlag(fs)
	asJSON := fs.Bool("json", false, "print the full status as JSON")
	return func(ctx context.Context, args []string) error {
		if len(args) > 0 {
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
}

// printStatus writes the parts of a status an operator looks at first.
func printStatus(w io.Writer, st appliance.Status) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("node", fmt.Sprintf("%s (meshbox %s)", st.Node, st.Version))
	row("started", fmt.Sprintf("%s (up %s)", st.StartedAt.Format(time.RFC3339), secs(st.UptimeSeconds)))
	for _, p := range st.Problems {
		row("PROBLEM", p)
	}
	nats := st.NATS.URL
	switch st.NATS.Auth {
	case appliance.AuthOpen:
		nats += ", open to programs without a credential"
	case appliance.AuthCredentials:
		nats += fmt.Sprintf(", credentials required (%d programs)", len(st.NATS.Programs))
	}
	row("nats", nats)
	if st.NATS.WebSocket != "" {
		row("websocket", st.NATS.WebSocket+" (browser pages, nats.ws)")
	}
	if st.NATS.MQTT != "" {
		row("mqtt", st.NATS.MQTT+" (devices)")
	}
	row("http", st.HTTP.URL)
	for _, w := range st.Warnings {
		row("warning", w)
	}
	for _, n := range st.Notes {
		row("note", n)
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
	case st.Broker.State == wire.StateNone:
		// No broker: nothing is batched, and nothing needs saying.
	case n == 1:
		row("batches", "off: every command alone ("+appliance.SettingKey(func(c *appliance.Config) any { return &c.Bridge.CommandBatch })+
			" is 1, a peer of an older meshbox is up, or discovery has not heard from the peers yet)")
	case n > 1:
		row("batches", fmt.Sprintf("up to %d commands per broker message", n))
	}
	if eb := st.Broker.EventBindings; eb != nil && st.Broker.State != wire.StateNone {
		v := fmt.Sprintf("%d topic patterns listened to, %d keys bound", len(eb.Topics), eb.Bound)
		if eb.Pending {
			v += ", a change on its way"
		}
		if eb.Legacy {
			v += "; shared keys too (a node not heard at the current protocol): own events come back and are dropped"
		}
		if eb.Warning != "" {
			v += "; " + eb.Warning
		}
		row("events", v)
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
	if r := st.Restored; r != nil {
		row("restored", fmt.Sprintf("from a backup taken %s, %s old when restored at %s; %d outbox records marked as possible duplicates",
			r.TakenAt.Format(time.RFC3339), secs(r.AgeSeconds), r.RestoredAt.Format(time.RFC3339), r.Marked))
	}
	row("sealing", sealingLine(st.Keys))
	if bl := st.Blobs; bl != nil {
		v := fmt.Sprintf("%d, %.1f of %.1f MiB", bl.Count, float64(bl.Bytes)/(1<<20), float64(bl.MaxBytes)/(1<<20))
		if bl.MaxAge != "" {
			v += ", kept at most " + bl.MaxAge
		}
		if bl.Pruned > 0 {
			v += fmt.Sprintf(", %d deleted by the size limit", bl.Pruned)
		}
		if bl.Served.Chunks > 0 || bl.Served.Failed > 0 {
			v += fmt.Sprintf(", served %d chunk requests (%.1f MiB)", bl.Served.Chunks, float64(bl.Served.Bytes)/(1<<20))
		}
		if bl.Error != "" {
			v += " — " + bl.Error
		}
		row("blobs", v+" (meshbox blob list)")
		for _, f := range bl.Fetches {
			row("fetch", fetchLine(f))
		}
	}
	for _, t := range st.Rows {
		row("table", tableLine(t))
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
		// Each at the level the node logged it: a warning is no error.
		row(strings.ToLower(e.Level), strings.TrimSpace(fmt.Sprintf("%s %s %s %s", e.At.Format(time.RFC3339), e.Component, e.Message, e.Detail)))
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

// flags defines its flags; its action prints the version lines.
func (c *VersionCommand) flags(fs *flag.FlagSet) action {
	server := c.m.serverFlag(fs)
	asJSON := fs.Bool("json", false, "print as JSON")
	return func(ctx context.Context, args []string) error {
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
