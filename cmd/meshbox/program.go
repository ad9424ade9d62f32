package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/blobs"
	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/nats-io/nats.go"
)

// ProgramCommand manages the credentials of the node's local programs
// (<data>/programs): who may connect to its NATS server and what each may
// do there. Changes go to the files, then to the running node, which
// applies them without a restart.
type ProgramCommand struct{ m *Main }

const programUsage = `Usage: meshbox program <command> [--data DIR] [flags]

Commands:
  add NAME [--host CAP]... [--call CAP]... [--serve STAGE]... [--submit STAGE]...
           [--publish TOPIC]... [--subscribe TOPIC]... [--service NAME]... [--blobs]
           [--read TABLE]... [--write TABLE]... [--mqtt]
           [--mqtt-retained SIZE] [--mqtt-retained-msgs N] [--mqtt-inflight N] [--mqtt-sessions N]
                       create program NAME, or replace its lists (it keeps its key);
                       prints the path of its credential file
  list [--json]        the programs and what each may do
  show NAME [--json]   one program
  remove NAME          delete it; its connections are cut
  mqtt NAME [--json]   what its MQTT devices keep on the running node: retained
                       messages, sessions, refusals past its limits
  mqtt-clear NAME [--retained] [--sessions]
                       clear its devices' retained messages (on every node, as
                       an empty retained publish would) and end their sessions
                       (both when neither flag is given)

A list flag may be given more than once or take names separated by commas.
--call, --submit, --publish and --subscribe take the NATS wildcards * and >.
--service NAME lets it run NATS micro service NAME and answer its discovery
requests ($SRV.PING, $SRV.INFO, $SRV.STATS); its endpoints are the
capabilities it hosts (cap.CAP) and the stages it serves (work.STAGE).
--read TABLE lets it get, list and read the history of the rows of table
TABLE and watch their changes; --write TABLE lets it put and delete them
(* for every table).
A program connects with its credential file as an nkey seed and its own
reply inbox: nats --nkey FILE --inbox-prefix _INBOX.NAME ...
--mqtt gives it an MQTT user name (NAME) and password as well, for a device
on the node's MQTT listener (nats_mqtt): the same rights, with MQTT topics
the subjects with / for . (an event topic home.temp is evt/home/temp).
--mqtt-retained, --mqtt-retained-msgs, --mqtt-inflight and --mqtt-sessions
bound what its devices keep in the node's MQTT store (0: the default).

The node is found as meshbox run configures it (--data, --env-file,
--config, the environment; default: its env file, as meshbox join writes
it); the running node is told of each change.
`

// programCommands are program's subcommands.
func programCommands() []command {
	c := func(m *Main) *ProgramCommand { return &ProgramCommand{m: m} }
	return []command{
		{name: "add", synopsis: "program add NAME [--data DIR] [flags]", flags: func(m *Main, fs *flag.FlagSet) action { return c(m).add(fs) }},
		{name: "list", synopsis: "program list [--data DIR] [flags]", flags: func(m *Main, fs *flag.FlagSet) action { return c(m).list(fs) }},
		{name: "show", synopsis: "program show NAME [--data DIR] [flags]", flags: func(m *Main, fs *flag.FlagSet) action { return c(m).show(fs) }},
		{name: "remove", synopsis: "program remove NAME [--data DIR] [flags]", flags: func(m *Main, fs *flag.FlagSet) action { return c(m).remove(fs) }},
		{name: "mqtt", synopsis: "program mqtt NAME [--server URL] [--json]", flags: func(m *Main, fs *flag.FlagSet) action { return c(m).mqtt(fs) }},
		{name: "mqtt-clear", synopsis: "program mqtt-clear NAME [--server URL] [--retained] [--sessions]", flags: func(m *Main, fs *flag.FlagSet) action { return c(m).mqttClear(fs) }},
	}
}

// store opens the programs' store of the node the flags name, after
// checking that the command got want arguments.
func (c *ProgramCommand) store(fs *flag.FlagSet, args []string, want int) (*programs.Store, string, error) {
	if len(args) != want {
		return nil, "", usagef("%s: want %d arguments, got %d", fs.Name(), want, len(args))
	}
	dir, err := c.m.dataDir()
	if err != nil {
		return nil, "", err
	}
	store, err := programs.Open(programs.Dir(dir))
	return store, dir, err
}

// add defines program add's flags; its action creates or replaces a
// program and tells the running node.
func (c *ProgramCommand) add(fs *flag.FlagSet) action {
	server := c.m.serverFlag(fs)
	fs.Bool("json", false, "print JSON")
	var p programs.Program
	for _, l := range []struct {
		name, usage string
		into        *[]string
	}{
		{"host", "a capability it may host (subscribe cap.CAP)", &p.Host},
		{"call", "a capability it may call (cap.CAP, node.*.cap.CAP)", &p.Call},
		{"serve", "a stage it may serve (subscribe work.STAGE)", &p.Serve},
		{"submit", "a stage it may submit commands to (cmd.STAGE)", &p.Submit},
		{"publish", "an event topic it may publish (evt.TOPIC)", &p.Publish},
		{"subscribe", "an event topic it may subscribe to (evt.TOPIC)", &p.Subscribe},
		{"service", "a NATS micro service it may run: it answers the service's discovery requests ($SRV.PING, .INFO, .STATS); needs --host or --serve", &p.Service},
		{"read", "a table of rows it may read: get, list, history, watch ($MESH.rows.TABLE.*; * for every table)", &p.Read},
		{"write", "a table of rows it may write: put, delete ($MESH.rows.TABLE.*; * for every table)", &p.Write},
	} {
		fs.Var((*listFlag)(l.into), l.name, l.usage)
	}
	fs.BoolVar(&p.MQTT, "mqtt", false, "it may sign in on the node's MQTT listener (nats_mqtt) with a user name and password, as devices do; the same rights, topics are subjects with / for . (evt/TOPIC)")
	var lim programs.MQTTLimits
	fs.Var((*sizeFlag)(&lim.RetainedBytes), "mqtt-retained", fmt.Sprintf("the payload bytes of the retained messages its MQTT devices keep, e.g. 1MiB (default %s)", formatSize(programs.DefaultMQTTLimits.RetainedBytes)))
	fs.IntVar(&lim.RetainedMsgs, "mqtt-retained-msgs", 0, fmt.Sprintf("the retained messages (topics) its MQTT devices keep (default %d)", programs.DefaultMQTTLimits.RetainedMsgs))
	fs.IntVar(&lim.Inflight, "mqtt-inflight", 0, fmt.Sprintf("the QoS 2 publishes its MQTT devices have started and not released (default %d)", programs.DefaultMQTTLimits.Inflight))
	fs.IntVar(&lim.Sessions, "mqtt-sessions", 0, fmt.Sprintf("the MQTT sessions (client IDs, connected or stored) its devices hold (default %d)", programs.DefaultMQTTLimits.Sessions))
	fs.BoolVar(&p.Blobs, "blobs", false, "it may use the node's blob store (JetStream object store "+blobs.Bucket+") and fetch blobs from any node")
	return func(ctx context.Context, pos []string) error {
		store, data, err := c.store(fs, pos, 1)
		if err != nil {
			return err
		}
		p.Name = pos[0]
		if lim != (programs.MQTTLimits{}) {
			p.MQTTLimits = &lim
		}
		path, err := store.Put(p)
		if err != nil {
			return err
		}
		fmt.Fprintf(c.m.Stdout, "program %s: credential %s\n", p.Name, path)
		fmt.Fprintf(c.m.Stdout, "connect with: nats --server %s --nkey %s --inbox-prefix %s ...\n", c.m.serverURL(*server), path, p.InboxPrefix())
		if p.MQTT {
			user, password, err := store.MQTTLogin(p.Name)
			if err != nil {
				return err
			}
			fmt.Fprintf(c.m.Stdout, "MQTT: user %s password %s (kept in %s); topics are the subjects with / for ., events evt/TOPIC\n", user, password, store.MQTTPath(p.Name))
		}
		return c.tellNode(ctx, *server, data)
	}
}

// remove defines program remove's flags; its action deletes a program and
// tells the running node.
func (c *ProgramCommand) remove(fs *flag.FlagSet) action {
	server := c.m.serverFlag(fs)
	fs.Bool("json", false, "print JSON")
	return func(ctx context.Context, pos []string) error {
		store, data, err := c.store(fs, pos, 1)
		if err != nil {
			return err
		}
		if err := store.Remove(pos[0]); err != nil {
			return err
		}
		fmt.Fprintf(c.m.Stdout, "program %s removed\n", pos[0])
		return c.tellNode(ctx, *server, data)
	}
}

// show defines program show's flags; its action prints one program.
func (c *ProgramCommand) show(fs *flag.FlagSet) action {
	c.m.serverFlag(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	return func(ctx context.Context, pos []string) error {
		store, _, err := c.store(fs, pos, 1)
		if err != nil {
			return err
		}
		p, err := store.Get(pos[0])
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(c.m.Stdout, shown(p))
		}
		c.printPrograms([]programs.Program{p}, store)
		return nil
	}
}

// list defines program list's flags; its action prints every program.
func (c *ProgramCommand) list(fs *flag.FlagSet) action {
	c.m.serverFlag(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	return func(ctx context.Context, pos []string) error {
		store, _, err := c.store(fs, pos, 0)
		if err != nil {
			return err
		}
		progs, errs := store.List()
		if *asJSON {
			if progs == nil {
				progs = []programs.Program{}
			}
			for i := range progs {
				progs[i] = shown(progs[i])
			}
			if err := writeJSON(c.m.Stdout, progs); err != nil {
				return err
			}
		} else {
			c.printPrograms(progs, store)
		}
		for _, err := range errs {
			fmt.Fprintf(c.m.Stderr, "meshbox: %v\n", err)
		}
		if len(errs) > 0 {
			return &exitError{code: 1, msg: fmt.Sprintf("program list: %d definitions cannot be read", len(errs))}
		}
		return nil
	}
}

// printPrograms writes one block per program.
func (c *ProgramCommand) printPrograms(progs []programs.Program, store *programs.Store) {
	if len(progs) == 0 {
		fmt.Fprintln(c.m.Stdout, "no programs")
		return
	}
	tw := tabwriter.NewWriter(c.m.Stdout, 0, 4, 2, ' ', 0)
	for i, p := range progs {
		if i > 0 {
			fmt.Fprintln(tw)
		}
		fmt.Fprintf(tw, "%s\tkey %s\n", p.Name, p.Key)
		fmt.Fprintf(tw, "  credential\t%s\n", store.CredsPath(p.Name))
		fmt.Fprintf(tw, "  inbox\t%s.>\n", p.InboxPrefix())
		for _, l := range []struct {
			name string
			v    []string
		}{{"host", p.Host}, {"call", p.Call}, {"serve", p.Serve}, {"submit", p.Submit}, {"publish", p.Publish}, {"subscribe", p.Subscribe}, {"service", p.Service}, {"read", p.Read}, {"write", p.Write}} {
			if len(l.v) > 0 {
				fmt.Fprintf(tw, "  %s\t%s\n", l.name, strings.Join(l.v, ", "))
			}
		}
		if p.Blobs {
			fmt.Fprintf(tw, "  blobs\tthe blob store %s, fetches from any node\n", blobs.Bucket)
		}
		if p.MQTT {
			fmt.Fprintf(tw, "  mqtt\tuser %s, password in %s\n", p.Name, store.MQTTPath(p.Name))
			l := p.Limits()
			fmt.Fprintf(tw, "  mqtt limits\tretained %d messages, %s; inflight %d; sessions %d\n", l.RetainedMsgs, formatSize(l.RetainedBytes), l.Inflight, l.Sessions)
		}
	}
	_ = tw.Flush()
}

// shown is p as show and list print it: without its password's hash.
func shown(p programs.Program) programs.Program {
	p.MQTTPassword = ""
	return p
}

// tellNode asks the node running on data to apply its programs now. A node
// that is not running applies them when it starts.
func (c *ProgramCommand) tellNode(ctx context.Context, server, data string) error {
	url := c.m.serverURL(server)
	nc, err := c.m.connectNode(server)
	if errors.Is(err, nats.ErrNoServers) {
		fmt.Fprintf(c.m.Stdout, "no node listens at %s (data directory %s): the change applies when the node starts\n", appliance.RedactURL(url), data)
		return nil
	}
	if err != nil {
		return fmt.Errorf("saved in %s, but the running node was not told: %w", data, err)
	}
	server = url
	defer nc.Close()
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	msg, err := nc.RequestWithContext(rctx, appliance.SubjectReloadPrograms, nil)
	if err != nil {
		return fmt.Errorf("the node at %s did not apply the change: %v", appliance.RedactURL(server), err)
	}
	var rep appliance.ProgramsReport
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return fmt.Errorf("the node at %s sent an answer this meshbox cannot read: %v", appliance.RedactURL(server), err)
	}
	fmt.Fprintf(c.m.Stdout, "the running node applied it: %d programs\n", len(rep.Programs))
	if len(rep.Errors) > 0 {
		return errors.New("the node left out: " + strings.Join(rep.Errors, "; "))
	}
	return nil
}

// listFlag collects a repeated flag whose values may also be separated by
// commas.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}
