package main

import (
	"context"
	"encoding/json"
	"flag"
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

// flags defines its flags; its action prints the modules as a table, or the node's answer as JSON with
// --json.
func (c *ModulesCommand) flags(fs *flag.FlagSet) action {
	server := c.m.serverFlag(fs)
	asJSON := fs.Bool("json", false, "print the node's answer as JSON")
	return func(ctx context.Context, args []string) error {
		if len(args) > 0 {
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

const moduleUsage = `Usage: meshbox module start|stop|restart|logs NAME [flags]

  start NAME     start an assigned module (one without autostart, or one stopped by hand)
  stop NAME      stop an assigned module; an autostarted one stays stopped until its
                 assignment, overrides or grants change, a start, or the node restarts
  restart NAME   stop the module if it runs and start it again
  logs NAME      print the module's last lines of output [-n LINES] [-f]
`

// moduleCommands are module's subcommands: start, stop and restart ask
// the node to do that to a module, logs prints its output.
func moduleCommands() []command {
	var out []command
	for _, act := range []string{"start", "stop", "restart"} {
		out = append(out, command{name: act, synopsis: "module " + act + " NAME [flags]",
			flags: func(m *Main, fs *flag.FlagSet) action { return (&ModuleCommand{m: m}).control(act, fs) }})
	}
	return append(out, command{name: "logs", synopsis: "module logs NAME [-n LINES] [-f] [flags]",
		flags: func(m *Main, fs *flag.FlagSet) action { return (&ModuleCommand{m: m}).logsFlags(fs) }})
}

// moduleName is the one module a module subcommand names.
func moduleName(sub string, args []string) (string, error) {
	switch len(args) {
	case 0:
		return "", usagef("module %s needs a module name", sub)
	case 1:
		return args[0], nil
	}
	return "", usagef("module %s takes one module name", sub)
}

// control defines the flags of module start, stop or restart (act); its
// action asks the node to do that to the module named.
func (c *ModuleCommand) control(act string, fs *flag.FlagSet) action {
	server := c.m.serverFlag(fs)
	return func(ctx context.Context, args []string) error {
		name, err := moduleName(act, args)
		if err != nil {
			return err
		}
		nc, err := c.m.connectNode(*server)
		if err != nil {
			return err
		}
		defer nc.Close()
		var rep appliance.ModuleReply
		if err := moduleRequest(ctx, nc, appliance.SubjectModuleControl, appliance.ModuleRequest{Module: name, Action: act}, &rep); err != nil {
			return err
		}
		if rep.Error != "" {
			return fmt.Errorf("module %s %s: %s", act, name, rep.Error)
		}
		fmt.Fprintf(c.m.Stdout, "module %s: %s asked\n", name, act)
		return nil
	}
}

// logsFlags defines the flags of module logs; its action prints the
// module's output.
func (c *ModuleCommand) logsFlags(fs *flag.FlagSet) action {
	server := c.m.serverFlag(fs)
	lines := fs.Int("n", 100, "how many of the last lines (0: all the node keeps)")
	follow := fs.Bool("f", false, "keep printing new lines until interrupted")
	return func(ctx context.Context, args []string) error {
		name, err := moduleName("logs", args)
		if err != nil {
			return err
		}
		nc, err := c.m.connectNode(*server)
		if err != nil {
			return err
		}
		defer nc.Close()
		return c.logs(ctx, nc, name, *lines, *follow)
	}
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
