package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/modules"
	"github.com/nats-io/nats.go"
)

// ModulesCommand lists the modules assigned to the local node.
type ModulesCommand struct{ m *Main }

// Run prints the modules as a table, or the node's answer as JSON with
// --json.
func (c *ModulesCommand) Run(ctx context.Context, args []string) error {
	fs := c.m.newFlagSet("modules", "modules [--json] [--server URL]")
	server := c.m.serverFlag(fs)
	asJSON := fs.Bool("json", false, "print the node's answer as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("modules takes no arguments")
	}
	var list []modules.Status
	raw, err := c.m.askNode(ctx, *server, appliance.SubjectModules, &list)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(c.m.Stdout, raw)
	}
	printModules(c.m.Stdout, list)
	return nil
}

// printModules writes one line per module, then each module's error and
// warnings.
func printModules(w io.Writer, list []modules.Status) {
	if len(list) == 0 {
		fmt.Fprintln(w, "no module is assigned to this node")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODULE\tSELECTION\tSTATE\tPID\tUPTIME\tRESTARTS\tLAST EXIT")
	for _, st := range list {
		state := st.State
		if st.Manual != "" {
			state += " (" + st.Manual + " by hand)"
		} else if !st.Autostart {
			state += " (no autostart)"
		}
		pid, up := "-", "-"
		if st.Pid > 0 {
			pid = fmt.Sprint(st.Pid)
			up = (time.Duration(st.UptimeSeconds) * time.Second).String()
		}
		last := "-"
		if st.LastExit != nil {
			last = st.LastExit.Reason + " at " + st.LastExit.At.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", st.Module, st.Selection, state, pid, up, st.Restarts, last)
	}
	_ = tw.Flush()
	for _, st := range list {
		if st.Error != "" {
			fmt.Fprintf(w, "%s: error: %s\n", st.Module, st.Error)
		}
		for _, warn := range st.Warnings {
			fmt.Fprintf(w, "%s: warning: %s\n", st.Module, warn)
		}
	}
}

// ModuleCommand controls one module of the local node by hand.
type ModuleCommand struct{ m *Main }

const moduleUsage = `module start|stop|restart|logs NAME [flags]

  start NAME     start an assigned module (one without autostart, or one stopped by hand)
  stop NAME      stop an assigned module; an autostarted one stays stopped until its
                 assignment, overrides or grants change, a start, or the node restarts
  restart NAME   stop the module if it runs and start it again
  logs NAME      print the module's last lines of output [-n LINES] [-f]`

// Run runs one of the module subcommands.
func (c *ModuleCommand) Run(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprintln(c.m.Stderr, "Usage: meshbox "+moduleUsage)
		if len(args) == 0 {
			return usagef("module needs a subcommand")
		}
		return nil
	}
	sub := args[0]
	fs := c.m.newFlagSet("module "+sub, "module "+sub+" NAME [flags]")
	server := c.m.serverFlag(fs)
	var lines *int
	var follow *bool
	switch sub {
	case "start", "stop", "restart":
	case "logs":
		lines = fs.Int("n", 100, "how many of the last lines (0: all the node keeps)")
		follow = fs.Bool("f", false, "keep printing new lines until interrupted")
	default:
		return usagef("unknown module subcommand %q (start, stop, restart, logs)", sub)
	}
	// NAME may come before or after the flags.
	rest := args[1:]
	var name string
	if len(rest) > 0 && len(rest[0]) > 0 && rest[0][0] != '-' {
		name, rest = rest[0], rest[1:]
	}
	if err := parseFlags(fs, rest); err != nil {
		return err
	}
	if name == "" && fs.NArg() == 1 {
		name = fs.Arg(0)
	} else if fs.NArg() > 0 {
		return usagef("module %s takes one module name", sub)
	}
	if name == "" {
		return usagef("module %s needs a module name", sub)
	}
	nc, err := c.m.connectNode(*server)
	if err != nil {
		return err
	}
	defer nc.Close()
	if sub != "logs" {
		var rep appliance.ModuleReply
		if err := moduleRequest(ctx, nc, appliance.SubjectModuleControl, appliance.ModuleRequest{Module: name, Action: sub}, &rep); err != nil {
			return err
		}
		if rep.Error != "" {
			return fmt.Errorf("module %s %s: %s", sub, name, rep.Error)
		}
		fmt.Fprintf(c.m.Stdout, "module %s: %s asked\n", name, sub)
		return nil
	}
	return c.logs(ctx, nc, name, *lines, *follow)
}

// logs prints the module's last lines and, with follow, new ones until ctx
// ends. Subscribed before it asks for the backlog, it prints each line
// once, by sequence number.
func (c *ModuleCommand) logs(ctx context.Context, nc *nats.Conn, name string, n int, follow bool) error {
	var live chan *nats.Msg
	if follow {
		live = make(chan *nats.Msg, 1024)
		sub, err := nc.ChanSubscribe(appliance.SubjectModuleLogPrefix+name, live)
		if err != nil {
			return fmt.Errorf("follow: %w", err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := nc.Flush(); err != nil {
			return fmt.Errorf("follow: %w", err)
		}
	}
	var rep appliance.ModuleReply
	if err := moduleRequest(ctx, nc, appliance.SubjectModuleLogs, appliance.ModuleRequest{Module: name, Lines: n}, &rep); err != nil {
		return err
	}
	if rep.Error != "" {
		return fmt.Errorf("module logs %s: %s", name, rep.Error)
	}
	var last uint64
	for _, l := range rep.Lines {
		printLogLine(c.m.Stdout, l)
		last = l.Seq
	}
	if !follow {
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-live:
			var l modules.LogLine
			if json.Unmarshal(m.Data, &l) != nil || (l.Seq <= last && l.Seq != 1) {
				continue // seen in the backlog (a restarted node counts from 1 again)
			}
			printLogLine(c.m.Stdout, l)
			last = l.Seq
		}
	}
}

func printLogLine(w io.Writer, l modules.LogLine) {
	fmt.Fprintf(w, "%s %s %s\n", l.At.Local().Format("15:04:05.000"), l.Stream, l.Text)
}

// moduleRequest sends req to the node on subject and decodes its answer.
func moduleRequest(ctx context.Context, nc *nats.Conn, subject string, req appliance.ModuleRequest, rep *appliance.ModuleReply) error {
	data, _ := json.Marshal(req) // plain values: cannot fail
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, subject, data)
	if err != nil {
		return fmt.Errorf("the node did not answer %s: %v", subject, err)
	}
	if err := json.Unmarshal(msg.Data, rep); err != nil {
		return fmt.Errorf("the node sent an answer to %s that is not valid JSON: %v", subject, err)
	}
	return nil
}
