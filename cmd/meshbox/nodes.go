package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/node"
)

// NodesCommand lists the peers of the local node: state, last seen, what
// they host.
type NodesCommand struct{ m *Main }

// flags defines its flags; its action prints the peers as a table, or the node's $MESH.peers answer as JSON
// with --json.
func (c *NodesCommand) flags(fs *flag.FlagSet) action {
	server := c.m.serverFlag(fs)
	asJSON := fs.Bool("json", false, "print the node's answer as JSON")
	return func(ctx context.Context, args []string) error {
		if len(args) > 0 {
			return usagef("nodes takes no arguments")
		}
		var reply node.PeersReply
		raw, err := c.m.askNode(ctx, *server, node.SubjectPeers, &reply)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(c.m.Stdout, raw)
		}
		// The credential generations come with the node's status; a node
		// too old to report them shows none.
		var st appliance.Status
		if _, err := c.m.askNode(ctx, *server, appliance.SubjectStatus, &st); err != nil {
			st = appliance.Status{}
		}
		printPeers(c.m.Stdout, reply, st.Identity, time.Now())
		return nil
	}
}

// CapsCommand lists the capabilities and stages hosted locally and by the
// live peers of the local node.
type CapsCommand struct{ m *Main }

// flags defines its flags; its action prints the capabilities as a table, or the node's $MESH.caps answer
// as JSON with --json.
func (c *CapsCommand) flags(fs *flag.FlagSet) action {
	server := c.m.serverFlag(fs)
	asJSON := fs.Bool("json", false, "print the node's answer as JSON")
	return func(ctx context.Context, args []string) error {
		if len(args) > 0 {
			return usagef("caps takes no arguments")
		}
		var reply node.CapsReply
		raw, err := c.m.askNode(ctx, *server, node.SubjectCaps, &reply)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(c.m.Stdout, raw)
		}
		printCaps(c.m.Stdout, reply)
		return nil
	}
}

// askNode sends an empty request on subject to the node at url and
// decodes the JSON answer into v, returning the raw answer too.
func (m *Main) askNode(ctx context.Context, url, subject string, v any) ([]byte, error) {
	nc, err := m.connectNode(url)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, subject, nil)
	if err != nil {
		return nil, fmt.Errorf("node at %s did not answer %s: %v", appliance.RedactURL(url), subject, err)
	}
	if err := json.Unmarshal(msg.Data, v); err != nil {
		return nil, fmt.Errorf("node at %s sent an answer to %s that is not valid JSON: %v", appliance.RedactURL(url), subject, err)
	}
	return msg.Data, nil
}

// printJSON re-indents a JSON document onto w.
func printJSON(w io.Writer, raw []byte) error {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return err
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printPeers writes one line per peer; times are shown relative to now.
func printPeers(w io.Writer, r node.PeersReply, id *appliance.IdentityStatus, now time.Time) {
	if id != nil && id.BrokerUser != "" {
		fmt.Fprintf(w, "node %s: broker user %s, credential generation %d (%s)\n", r.Node, id.BrokerUser, id.Generation, id.State)
	}
	if len(r.Peers) == 0 {
		fmt.Fprintf(w, "node %s has no peers\n", r.Node)
		return
	}
	counts := map[string]int{}
	for _, p := range r.Peers {
		counts[p.State]++
	}
	fmt.Fprintf(w, "node %s: %d peers (%d %s, %d %s, %d %s)\n\n", r.Node, len(r.Peers),
		counts[node.StateUp], node.StateUp, counts[node.StateGone], node.StateGone, counts[node.StateAbsent], node.StateAbsent)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tHEALTH\tSINCE\tLAST SEEN\tEXPECTED\tVERSION\tREVISION\tCREDENTIAL\tCAPABILITIES\tSTAGES")
	for _, p := range r.Peers {
		state := p.State
		if p.Reason != "" {
			state += " (" + p.Reason + ")"
		}
		expected := "no"
		if p.Expected {
			expected = "yes"
		}
		version := p.Version
		if version == "" {
			version = "unknown" // a peer not heard from, or one too old to advertise its version
		}
		rev := "-"
		if p.Revision > 0 {
			rev = fmt.Sprint(p.Revision)
		}
		cred := "-"
		if id != nil && id.Peers[p.Name] > 0 {
			cred = fmt.Sprintf("g%d", id.Peers[p.Name])
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Name, state, healthWord(p.Health), ago(now, p.Since), ago(now, p.LastSeen),
			expected, version, rev, cred, list(p.Capabilities), list(p.Stages))
	}
	_ = tw.Flush()
}

// printCaps writes one line per capability and one per stage.
func printCaps(w io.Writer, r node.CapsReply) {
	section := func(title, plural string, hereNames []string, remote map[string][]string) {
		names := slices.Clone(hereNames)
		for name := range remote {
			names = append(names, name)
		}
		slices.Sort(names)
		names = slices.Compact(names)
		if len(names) == 0 {
			fmt.Fprintf(w, "no %s hosted on node %s or its live peers\n", plural, r.Node)
			return
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "%s\tLOCAL\tREMOTE\n", title)
		for _, name := range names {
			local := "-"
			if slices.Contains(hereNames, name) {
				local = "yes"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", name, local, list(remote[name]))
		}
		_ = tw.Flush()
	}
	section("CAPABILITY", "capabilities", r.Local, r.Remote)
	fmt.Fprintln(w)
	section("STAGE", "stages", r.LocalStages, r.RemoteStages)
}

// ago renders t relative to now ("12s ago"); the zero time is "never".
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := now.Sub(t)
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Minute:
		d = d.Round(time.Second)
	case d < time.Hour:
		d = d.Round(time.Minute)
	default:
		d = d.Round(time.Hour)
	}
	return d.String() + " ago"
}

func list(names []string) string {
	if len(names) == 0 {
		return "-"
	}
	return strings.Join(names, ", ")
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
