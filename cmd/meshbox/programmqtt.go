package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshbox/meshbox/appliance"
)

// mqtt defines program mqtt's flags; its action prints what a program's
// MQTT devices keep on the running node.
func (c *ProgramCommand) mqtt(fs *flag.FlagSet) action {
	server := c.m.serverFlag(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	return func(ctx context.Context, pos []string) error {
		if len(pos) != 1 {
			return usagef("%s: want 1 argument, got %d", fs.Name(), len(pos))
		}
		rep, err := c.askMQTT(ctx, *server, appliance.ProgramMQTTRequest{Program: pos[0]})
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(c.m.Stdout, rep.State)
		}
		c.printMQTT(rep)
		return nil
	}
}

// mqttClear defines program mqtt-clear's flags; its action clears a
// program's retained messages and sessions on the running node.
func (c *ProgramCommand) mqttClear(fs *flag.FlagSet) action {
	server := c.m.serverFlag(fs)
	retained := fs.Bool("retained", false, "clear its devices' retained messages (on every node, as an empty retained publish does)")
	sessions := fs.Bool("sessions", false, "end its devices' sessions: disconnect them and drop what the server keeps of them")
	return func(ctx context.Context, pos []string) error {
		if len(pos) != 1 {
			return usagef("%s: want 1 argument, got %d", fs.Name(), len(pos))
		}
		req := appliance.ProgramMQTTRequest{Program: pos[0], ClearRetained: *retained, ClearSessions: *sessions}
		if !*retained && !*sessions {
			req.ClearRetained, req.ClearSessions = true, true
		}
		rep, err := c.askMQTT(ctx, *server, req)
		if err != nil {
			return err
		}
		fmt.Fprintf(c.m.Stdout, "program %s: %d retained messages cleared, %d sessions ended\n", pos[0], rep.ClearedRetained, rep.ClearedSessions)
		return nil
	}
}

// askMQTT sends req to the running node.
func (c *ProgramCommand) askMQTT(ctx context.Context, server string, req appliance.ProgramMQTTRequest) (appliance.ProgramMQTTReply, error) {
	url := c.m.serverURL(server)
	nc, err := c.m.connectNode(server)
	if err != nil {
		return appliance.ProgramMQTTReply{}, fmt.Errorf("no running node at %s: %w", appliance.RedactURL(url), err)
	}
	defer nc.Close()
	data, _ := json.Marshal(req) // plain values: cannot fail
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	msg, err := nc.RequestWithContext(rctx, appliance.SubjectProgramMQTT, data)
	if err != nil {
		return appliance.ProgramMQTTReply{}, fmt.Errorf("the node at %s did not answer: %v", appliance.RedactURL(url), err)
	}
	var rep appliance.ProgramMQTTReply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return rep, fmt.Errorf("the node at %s sent an answer this meshbox cannot read: %v", appliance.RedactURL(url), err)
	}
	if rep.Error != "" {
		return rep, errors.New(rep.Error)
	}
	return rep, nil
}

// printMQTT writes a program's MQTT state.
func (c *ProgramCommand) printMQTT(rep appliance.ProgramMQTTReply) {
	st := rep.State
	l := st.Limits
	tw := tabwriter.NewWriter(c.m.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "program %s\n", st.Program)
	fmt.Fprintf(tw, "  retained\t%d of %d messages, %s of %s\n", len(st.Retained), l.RetainedMsgs, formatSize(st.RetainedBytes), formatSize(l.RetainedBytes))
	inflight := 0
	for _, s := range st.Sessions {
		inflight += s.Inflight
	}
	fmt.Fprintf(tw, "  sessions\t%d of %d\n", len(st.Sessions), l.Sessions)
	fmt.Fprintf(tw, "  inflight\t%d of %d QoS 2 publishes\n", inflight, l.Inflight)
	for cause, n := range st.Refused {
		fmt.Fprintf(tw, "  refused\t%s: %d\n", cause, n)
	}
	for _, s := range st.Sessions {
		state := "connected"
		if !s.Connected {
			state = "stored"
		}
		fmt.Fprintf(tw, "  session %s\t%s, %d inflight\n", s.ClientID, state, s.Inflight)
	}
	for _, t := range st.Retained {
		fmt.Fprintf(tw, "  retained %s\t%s\n", t.Topic, formatSize(t.Bytes))
	}
	_ = tw.Flush()
}

// sizeFlag is a size in bytes with an optional unit: B, KiB, MiB, GiB.
type sizeFlag int64

func (s *sizeFlag) String() string { return formatSize(int64(*s)) }

func (s *sizeFlag) Set(v string) error {
	n, err := parseSize(v)
	if err != nil {
		return err
	}
	*s = sizeFlag(n)
	return nil
}

var sizeUnits = []struct {
	suffix string
	mult   int64
}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}

// parseSize reads a size: digits and an optional unit (B, KiB, MiB, GiB).
func parseSize(v string) (int64, error) {
	num, mult := strings.TrimSpace(v), int64(1)
	for _, u := range sizeUnits {
		if n, ok := strings.CutSuffix(num, u.suffix); ok {
			num, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("%q is no size (digits and B, KiB, MiB or GiB)", v)
	}
	return n * mult, nil
}

// formatSize writes n bytes in the largest unit that divides it.
func formatSize(n int64) string {
	for _, u := range sizeUnits {
		if n >= u.mult && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}
