package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/internal/names"
)

// DlqCommand acts on dead letters through the local node, which reaches
// the broker with its own broker user.
type DlqCommand struct{ m *Main }

const dlqUsage = `Usage: meshbox dlq list [STAGE] | show STAGE ID | replay STAGE ID|--all | purge STAGE [--json] [--server URL]

  list    the dead letters of STAGE (of every stage hosted here without one)
  show    one dead letter: headers, reason, attempts, first and last failure
  replay  send dead letters back to their stage: attempts start again at 1,
          and the command carries Meshbox-Replayed
  purge   delete every dead letter of STAGE
`

// dlqTimeout bounds the wait for the node's answer (its own operation is
// bounded at a minute).
const dlqTimeout = 70 * time.Second

// dlqCommands are dlq's subcommands, named after the actions of the
// node's dead letter API; flags may come before them.
func dlqCommands() []command {
	leaf := func(act, args string, min, max int) command {
		return command{name: act, synopsis: strings.TrimSpace("dlq "+act+" "+args) + " [--json] [--server URL]", args: []word{wordStage},
			flags: func(m *Main, fs *flag.FlagSet) action { return (&DlqCommand{m: m}).flags(act, args, min, max, fs) }}
	}
	return []command{
		leaf(appliance.DeadLetterList, "[STAGE]", 0, 1),
		leaf(appliance.DeadLetterShow, "STAGE ID", 2, 2),
		leaf(appliance.DeadLetterReplay, "STAGE ID|--all", 1, 2),
		leaf(appliance.DeadLetterPurge, "STAGE", 1, 1),
	}
}

// flags defines the flags of dlq action act, which takes args (from min
// to max of them); its action asks the node.
func (c *DlqCommand) flags(act, args string, min, max int, fs *flag.FlagSet) action {
	server := c.m.serverFlag(fs)
	asJSON := fs.Bool("json", false, "print the node's answer as JSON")
	all := new(bool)
	if act == appliance.DeadLetterReplay {
		all = fs.Bool("all", false, "every dead letter of the stage")
	}
	return func(ctx context.Context, rest []string) error {
		req := appliance.DeadLetterRequest{Action: act, All: *all}
		if len(rest) < min || len(rest) > max {
			return usagef("usage: meshbox dlq %s %s", act, args)
		}
		if act == appliance.DeadLetterReplay && (len(rest) == 2) == *all {
			return usagef("usage: meshbox dlq replay STAGE ID|--all (one dead letter by its id, or --all)")
		}
		if len(rest) > 0 {
			req.Stage = rest[0]
			if err := names.Stage(req.Stage); err != nil {
				return usagef("dlq: %v", err)
			}
		}
		if len(rest) > 1 {
			req.ID = rest[1]
			if err := checkMsgID(req.ID); err != nil {
				return usagef("dlq: %v", err)
			}
		}
		raw, rep, err := c.ask(ctx, *server, req)
		if err != nil {
			return err
		}
		if rep.Error != "" {
			return errors.New("dlq " + req.Action + ": " + rep.Error)
		}
		if *asJSON {
			return printJSON(c.m.Stdout, raw)
		}
		switch req.Action {
		case appliance.DeadLetterList:
			printDeadLetters(c.m.Stdout, rep, time.Now())
		case appliance.DeadLetterShow:
			printDeadLetter(c.m.Stdout, rep)
		case appliance.DeadLetterReplay:
			fmt.Fprintf(c.m.Stdout, "replayed %d dead letters of %s\n", rep.Count, req.Stage)
		case appliance.DeadLetterPurge:
			fmt.Fprintf(c.m.Stdout, "purged %d dead letters of %s\n", rep.Count, req.Stage)
		}
		return nil
	}
}

// checkMsgID checks a message id given on the command line: printable
// ASCII, at most 128 bytes (the bridge's rule).
func checkMsgID(id string) error {
	if id == "" || len(id) > 128 {
		return fmt.Errorf("message id %q: 1 to 128 bytes", id)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c >= 0x7f {
			return fmt.Errorf("message id %q: byte %d is not printable ASCII", id, i)
		}
	}
	return nil
}

func (c *DlqCommand) ask(ctx context.Context, url string, req appliance.DeadLetterRequest) ([]byte, appliance.DeadLetterReply, error) {
	var rep appliance.DeadLetterReply
	nc, err := c.m.connectNode(url)
	if err != nil {
		return nil, rep, err
	}
	defer nc.Close()
	data, _ := json.Marshal(req) // plain values: cannot fail
	ctx, cancel := context.WithTimeout(ctx, dlqTimeout)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, appliance.SubjectDeadLetters, data)
	if err != nil {
		return nil, rep, fmt.Errorf("node at %s did not answer %s: %v", appliance.RedactURL(url), appliance.SubjectDeadLetters, err)
	}
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return nil, rep, fmt.Errorf("node at %s sent an answer to %s that is not valid JSON: %v", appliance.RedactURL(url), appliance.SubjectDeadLetters, err)
	}
	return msg.Data, rep, nil
}

// printDeadLetters writes one line per dead letter.
func printDeadLetters(w io.Writer, rep appliance.DeadLetterReply, now time.Time) {
	if len(rep.Letters) == 0 {
		fmt.Fprintln(w, "no dead letters")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STAGE\tID\tATTEMPTS\tDEAD SINCE\tREASON")
	waiting := false
	for _, d := range rep.Letters {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", d.Stage, d.ID, d.Attempts, ago(now, d.LastFailure), oneLine(d.Reason, 100))
		waiting = waiting || d.Waiting
	}
	_ = tw.Flush()
	if waiting {
		fmt.Fprintln(w, "(kept in this node's outbox: it has no broker; they go to the mesh's dead letters when it joins one)")
	}
}

// printDeadLetter writes everything known of one dead letter.
func printDeadLetter(w io.Writer, rep appliance.DeadLetterReply) {
	if len(rep.Letters) == 0 {
		return
	}
	d := rep.Letters[0]
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("stage", d.Stage)
	row("id", d.ID)
	row("reason", d.Reason)
	row("attempts", fmt.Sprint(d.Attempts))
	row("first failure", stamp(d.FirstFailure))
	row("last failure", stamp(d.LastFailure))
	row("submitted", stamp(d.Submitted))
	row("origin", d.Origin)
	row("dead-lettered by", d.Node)
	row("size", fmt.Sprintf("%d bytes", d.Size))
	if d.Opened {
		row("readable", "yes: this node can open it (a replay can send it again)")
	} else {
		row("readable", "no: "+d.Why)
	}
	for _, k := range slices.Sorted(maps.Keys(d.Headers)) {
		row("header", k+": "+d.Headers[k])
	}
	for _, k := range slices.Sorted(maps.Keys(d.Content)) {
		row("content header", k+": "+d.Content[k])
	}
	_ = tw.Flush()
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format(time.RFC3339)
}

// oneLine keeps the first line of s, at most n bytes.
func oneLine(s string, n int) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > n {
		s = s[:n] + "..."
	}
	return s
}
