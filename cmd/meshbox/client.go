package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/nats-io/nats.go"
)

// defaultServer is the local node's NATS address.
const defaultServer = "nats://" + appliance.DefaultNATS

// serverFlag adds --server to fs, defaulting to MESHBOX_SERVER.
func (m *Main) serverFlag(fs *flag.FlagSet) *string {
	return fs.String("server", m.envOr("MESHBOX_SERVER", defaultServer), "NATS URL of the local node (env MESHBOX_SERVER)")
}

// connectNode connects to the local node's NATS server, failing fast.
func connectNode(url string) (*nats.Conn, error) {
	nc, err := nats.Connect(url,
		nats.Name("meshbox-cli"),
		nats.Timeout(2*time.Second),
		nats.NoReconnect(),
	)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the node at %s: %v", appliance.RedactURL(url), err)
	}
	return nc, nil
}

// nodeStatus asks the node at url for its status.
func nodeStatus(ctx context.Context, url string) (map[string]any, []byte, error) {
	nc, err := connectNode(url)
	if err != nil {
		return nil, nil, err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, appliance.SubjectStatus, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("node at %s did not answer a status request: %v", appliance.RedactURL(url), err)
	}
	var st map[string]any
	if err := json.Unmarshal(msg.Data, &st); err != nil {
		return nil, nil, fmt.Errorf("node at %s sent a status that is not JSON: %v", appliance.RedactURL(url), err)
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
	st, raw, err := nodeStatus(ctx, *server)
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
func printStatus(w io.Writer, st map[string]any) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("node", fmt.Sprintf("%v (meshbox %v)", st["node"], st["version"]))
	row("started", fmt.Sprintf("%v (up %s)", st["started_at"], secs(st["uptime_seconds"])))
	row("nats", str(get(st, "nats", "url")))
	row("http", str(get(st, "http", "url")))
	broker := str(get(st, "broker", "state"))
	if u := str(get(st, "broker", "url")); u != "" {
		broker += " " + u
	}
	if s := str(get(st, "broker", "since")); s != "" {
		broker += " since " + s
	}
	row("broker", broker)
	b := "source " + str(get(st, "bindings", "source"))
	if rev := get(st, "bindings", "revision"); rev != nil {
		b += fmt.Sprintf(", revision %v, age %s", rev, secs(get(st, "bindings", "age_seconds")))
	}
	if warn := str(get(st, "bindings", "warning")); warn != "" {
		b += " — WARNING: " + warn
	}
	row("bindings", b)
	if peers, ok := st["peers"].([]any); ok && len(peers) > 0 {
		var parts []string
		for _, p := range peers {
			if m, ok := p.(map[string]any); ok {
				parts = append(parts, fmt.Sprintf("%v (%v)", m["name"], m["state"]))
			}
		}
		row("peers", strings.Join(parts, ", "))
	}
	if local, ok := get(st, "capabilities", "local").([]any); ok && len(local) > 0 {
		names := make([]string, len(local))
		for i, v := range local {
			names[i] = fmt.Sprint(v)
		}
		row("hosts", strings.Join(names, " "))
	}
	if remote, ok := get(st, "capabilities", "remote").(map[string]any); ok && len(remote) > 0 {
		var parts []string
		for name, nodes := range remote {
			parts = append(parts, fmt.Sprintf("%s@%v", name, nodes))
		}
		sort.Strings(parts)
		row("reaches", strings.Join(parts, " "))
	}
	if ob, ok := st["outbox"].(map[string]any); ok {
		row("outbox", fmt.Sprintf("%v messages, oldest %s", ob["depth"], secs(ob["oldest_age_seconds"])))
	}
	if stalls, ok := st["stalls"].([]any); ok && len(stalls) > 0 {
		for _, s := range stalls {
			if m, ok := s.(map[string]any); ok {
				row("STALL", fmt.Sprintf("stage %v: %v", m["stage"], m["reason"]))
			}
		}
	}
	if errs, ok := st["errors"].([]any); ok && len(errs) > 0 {
		n := min(len(errs), 5)
		for _, e := range errs[:n] {
			if m, ok := e.(map[string]any); ok {
				row("error", strings.TrimSpace(fmt.Sprintf("%v %v %v %v", m["at"], m["component"], m["message"], m["detail"])))
			}
		}
	}
	_ = tw.Flush()
}

func get(m map[string]any, path ...string) any {
	var v any = m
	for _, p := range path {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[p]
	}
	return v
}

func str(v any) string {
	if v == nil {
		return ""
	}
	return fmt.Sprint(v)
}

func secs(v any) string {
	f, ok := v.(float64)
	if !ok {
		return "?"
	}
	return (time.Duration(f) * time.Second).String()
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
	st, _, err := nodeStatus(ctx, *server)
	if err == nil {
		out["node"] = map[string]any{"name": st["node"], "version": st["version"], "commit": st["commit"]}
	} else {
		out["node_error"] = err.Error()
	}
	if *asJSON {
		enc := json.NewEncoder(c.m.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	fmt.Fprintf(c.m.Stdout, "meshbox %s", b.Version)
	if b.Commit != "" {
		fmt.Fprintf(c.m.Stdout, " (commit %s)", b.Commit)
	}
	fmt.Fprintf(c.m.Stdout, " %s\n", b.Go)
	if err != nil {
		fmt.Fprintf(c.m.Stdout, "node: %v\n", err)
		return nil
	}
	fmt.Fprintf(c.m.Stdout, "node %v: meshbox %v", st["node"], st["version"])
	if s := str(st["commit"]); s != "" {
		fmt.Fprintf(c.m.Stdout, " (commit %s)", s)
	}
	fmt.Fprintln(c.m.Stdout)
	return nil
}
