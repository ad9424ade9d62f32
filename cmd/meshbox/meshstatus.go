package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/node"
)

// MeshNode is one line of `meshbox mesh status`: a node as the local node
// sees it (itself from its own status, its peers from what they shared).
type MeshNode struct {
	Name string `json:"name"`
	// State is the node's discovery state (up, gone, absent; "self" for
	// the local node).
	State   string       `json:"state"`
	Reason  string       `json:"reason,omitempty"`
	Version string       `json:"version,omitempty"`
	Health  *node.Health `json:"health,omitempty"`
	// Problem says why the node is not ok ("" when it is).
	Problem string `json:"problem,omitempty"`
}

// MeshStatus is the whole mesh at a glance.
type MeshStatus struct {
	Node  string     `json:"node"` // the node asked
	Nodes []MeshNode `json:"nodes"`
	OK    bool       `json:"ok"`
}

// status prints the mesh at a glance from the local node's status, and
// fails (exit 1) when a node is not ok: gone or absent, failing, warning,
// or silent about its health (a node too old to share it).
func (c *MeshCommand) statusFlags(fs *flag.FlagSet) action {
	server := c.m.serverFlag(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	return func(ctx context.Context, args []string) error {
		if len(args) > 0 {
			return usagef("mesh status takes no arguments")
		}
		var st appliance.Status
		if _, err := c.m.askNode(ctx, *server, appliance.SubjectStatus, &st); err != nil {
			return err
		}
		ms := meshStatusOf(st)
		if *asJSON {
			enc := json.NewEncoder(c.m.Stdout)
			enc.SetIndent("", "  ")
			if err := enc.Encode(ms); err != nil {
				return err
			}
		} else {
			printMeshStatus(c.m.Stdout, ms, time.Now())
		}
		if !ms.OK {
			bad := 0
			for _, n := range ms.Nodes {
				if n.Problem != "" {
					bad++
				}
			}
			return &exitError{code: 1, msg: fmt.Sprintf("mesh status: %d of %d nodes are not ok", bad, len(ms.Nodes))}
		}
		return nil
	}
}

// meshStatusOf builds the mesh's status from the local node's.
func meshStatusOf(st appliance.Status) MeshStatus {
	self := appliance.HealthOf(st)
	ms := MeshStatus{Node: st.Node, OK: true, Nodes: []MeshNode{{Name: st.Node, State: "self", Version: st.Version, Health: &self}}}
	for _, p := range st.Peers {
		ms.Nodes = append(ms.Nodes, MeshNode{Name: p.Name, State: p.State, Reason: p.Reason, Version: p.Version, Health: p.Health})
	}
	for i := range ms.Nodes {
		n := &ms.Nodes[i]
		switch {
		case n.State != "self" && n.State != node.StateUp:
			n.Problem = n.State
			if n.Reason != "" {
				n.Problem += ": " + n.Reason
			}
		case n.Health == nil:
			n.Problem = "shares no health (an older meshbox?)"
		case n.Health.State != node.HealthOK:
			n.Problem = n.Health.State
		}
		if n.Problem != "" {
			ms.OK = false
		}
	}
	return ms
}

// printMeshStatus writes one line a node, then a line that sums it up.
func printMeshStatus(w io.Writer, ms MeshStatus, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tHEALTH\tBROKER\tBINDINGS\tOUTBOX\tVERSION\tNOTE")
	for _, n := range ms.Nodes {
		broker, bindings, outbox, note := "-", "-", "-", ""
		if h := n.Health; h != nil {
			broker = orDash(h.Broker)
			bindings = orDash(h.Bindings)
			if !h.BindingsAt.IsZero() && h.Bindings != "db" {
				bindings += " (" + ago(now, h.BindingsAt) + ")"
			}
			outbox = fmt.Sprint(h.Outbox)
			var parts []string
			if len(h.Failing) > 0 {
				parts = append(parts, "modules failing: "+strings.Join(h.Failing, ", "))
			}
			if h.Warning != "" {
				parts = append(parts, h.Warning)
				if h.Warnings > 1 {
					parts[len(parts)-1] += fmt.Sprintf(" (+%d more)", h.Warnings-1)
				}
			}
			note = strings.Join(parts, "; ")
		}
		if n.Health == nil && n.Problem != "" {
			note = n.Problem
		}
		state := n.State
		if n.Reason != "" {
			state += " (" + n.Reason + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, state, healthWord(n.Health), broker, bindings, outbox, orDash(n.Version), note)
	}
	_ = tw.Flush()
	if ms.OK {
		fmt.Fprintf(w, "\nall %d nodes ok\n", len(ms.Nodes))
	}
}

// healthWord is a health's state, "-" when there is none.
func healthWord(h *node.Health) string {
	if h == nil {
		return "-"
	}
	return h.State
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
