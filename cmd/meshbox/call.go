package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/internal/suggest"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/meshbox/meshbox/node"
	"github.com/nats-io/nats.go"
)

// The message shapes from the command line: call (request), send
// (command), emit (event) and listen. Each talks to the local node's NATS
// server and exits 0 only when the node confirmed the outcome.

// headerFlags collects repeated --header KEY=VALUE flags.
type headerFlags []string

func (h *headerFlags) String() string     { return strings.Join(*h, ",") }
func (h *headerFlags) Set(v string) error { *h = append(*h, v); return nil }

// header builds a NATS header from the flags.
func (h headerFlags) header() (nats.Header, error) {
	out := nats.Header{}
	for _, kv := range h {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, usagef("--header %q: want KEY=VALUE", kv)
		}
		out.Add(strings.TrimSpace(k), v)
	}
	return out, nil
}

// payload is the DATA argument, or standard input when it is not given
// (and not a terminal).
func (m *Main) payload(args []string, at int) ([]byte, error) {
	if len(args) > at {
		return []byte(args[at]), nil
	}
	if m.Stdin == nil || isTerminal(m.Stdin) {
		return nil, nil
	}
	data, err := io.ReadAll(m.Stdin)
	if err != nil {
		return nil, fmt.Errorf("read data from standard input: %w", err)
	}
	return data, nil
}

// isTerminal reports whether s, a standard stream, is a terminal (a
// character device).
func isTerminal(s any) bool {
	f, ok := s.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// endLine reports whether a reply printed on a terminal needs a line
// break after it, so that the shell's prompt starts a line of its own. A
// pipe or a file gets the reply's exact bytes.
func endLine(terminal bool, data []byte) bool {
	return terminal && len(data) > 0 && data[len(data)-1] != '\n'
}

// replyFailure turns an error reply into an exit error (nil: no error).
func replyFailure(m *nats.Msg) error {
	if m.Header == nil {
		return nil
	}
	if code, e, failed := wire.ReadError(m.Header); failed {
		return &exitError{code: 1, msg: fmt.Sprintf("error %s: %s", code, e)}
	}
	return nil
}

// printHeaders writes a message's headers, sorted, one per line.
func printHeaders(w io.Writer, h nats.Header) {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		for _, v := range h[k] {
			fmt.Fprintf(w, "%s: %s\n", k, v)
		}
	}
}

// CallCommand calls a capability: meshbox call CAP [DATA] [--to NODE] [--timeout D].
type CallCommand struct{ m *Main }

// flags defines its flags; its action sends the request and prints the reply's body on standard output.
func (c *CallCommand) flags(fs *flag.FlagSet) action {
	server := c.m.serverFlag(fs)
	to := fs.String("to", "", "call the capability on this node (node.<NODE>.cap.<CAPABILITY>)")
	timeout := fs.Duration("timeout", 5*time.Second, fmt.Sprintf("deadline of the call (at most %s, or the node's %s if that is longer)", wire.MaxTimeout,
		appliance.SettingKey(func(c *appliance.Config) any { return &c.Bridge.RequestTimeout })))
	verbose := fs.Bool("v", false, "print the reply's headers on standard error")
	var hdrs headerFlags
	fs.Var(&hdrs, "header", "add a header KEY=VALUE to the request (repeatable)")
	return func(ctx context.Context, pos []string) error {
		if len(pos) < 1 || len(pos) > 2 {
			return usagef("call takes a capability and optional data")
		}
		if *timeout <= 0 {
			return usagef("--timeout must be positive")
		}
		subject := wire.CapSubject(pos[0])
		if *to != "" {
			subject = wire.NodeCapSubject(*to, pos[0])
		}
		h, err := hdrs.header()
		if err != nil {
			return err
		}
		data, err := c.m.payload(pos, 1)
		if err != nil {
			return err
		}
		h.Set(wire.HeaderTimeout, timeout.String())
		nc, err := c.m.connectNode(*server)
		if err != nil {
			return err
		}
		defer nc.Close()
		if err := fitsMessage(nc, data); err != nil {
			return err
		}
		// The node answers by the deadline; wait a little longer for its 504.
		rctx, cancel := context.WithTimeout(ctx, *timeout+2*time.Second)
		defer cancel()
		reply, err := nc.RequestMsgWithContext(rctx, &nats.Msg{Subject: subject, Data: data, Header: h})
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			return &exitError{code: 1, msg: fmt.Sprintf("no host for %s: nothing here serves %s and no route leads elsewhere%s",
				pos[0], subject, c.m.nearCapability(ctx, nc, pos[0]))}
		case errors.Is(err, context.DeadlineExceeded):
			return &exitError{code: 1, msg: fmt.Sprintf("no reply from %s within %s", subject, *timeout)}
		case err != nil:
			return fmt.Errorf("call %s: %v", subject, err)
		}
		if *verbose {
			printHeaders(c.m.Stderr, reply.Header)
		}
		if err := replyFailure(reply); err != nil {
			return err
		}
		if _, err := c.m.Stdout.Write(reply.Data); err != nil {
			return err
		}
		if endLine(isTerminal(c.m.Stdout), reply.Data) {
			_, err = io.WriteString(c.m.Stdout, "\n")
		}
		return err
	}
}

// nearCapability suggests the capabilities the node knows (hosted here or
// by its live peers) whose names are near name: "; did you mean echo?",
// or "" when none is.
func (m *Main) nearCapability(ctx context.Context, nc *nats.Conn, name string) string {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, node.SubjectCaps, nil)
	if err != nil {
		return ""
	}
	var r node.CapsReply
	if json.Unmarshal(msg.Data, &r) != nil {
		return ""
	}
	known := slices.Clone(r.Local)
	for k := range r.Remote {
		known = append(known, k)
	}
	slices.Sort(known)
	known = slices.Compact(known)
	var near []string
	for _, k := range known {
		if k != name && suggest.Distance(k, name) <= suggest.Near(name) {
			near = append(near, k)
		}
	}
	if len(near) == 0 {
		return ""
	}
	return "; did you mean " + strings.Join(near, " or ") + "? (meshbox caps lists them)"
}

// fitsMessage refuses data the node's NATS server would not take in one
// message, saying its limit and what to do instead.
func fitsMessage(nc *nats.Conn, data []byte) error {
	if limit := nc.MaxPayload(); limit > 0 && int64(len(data)) > limit-1024 {
		return usagef("the data is %d bytes; a message to the node carries at most about %d bytes (its max_payload, less room for headers): put big data in a blob (meshbox blob put FILE) and send its reference", len(data), limit-1024)
	}
	return nil
}

// submit sends a command or an event and waits for the node's answer that
// it is durable.
func (m *Main) submit(ctx context.Context, server, subject string, data []byte, h nats.Header, timeout time.Duration, verbose bool) error {
	nc, err := m.connectNode(server)
	if err != nil {
		return err
	}
	defer nc.Close()
	if err := fitsMessage(nc, data); err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	reply, err := nc.RequestMsgWithContext(rctx, &nats.Msg{Subject: subject, Data: data, Header: h})
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return &exitError{code: 1, msg: fmt.Sprintf("nothing accepted %s: the node's bridge is not running", subject)}
	case errors.Is(err, context.DeadlineExceeded):
		return &exitError{code: 1, msg: fmt.Sprintf("%s not confirmed within %s", subject, timeout)}
	case err != nil:
		return fmt.Errorf("%s: %v", subject, err)
	}
	if verbose {
		printHeaders(m.Stderr, reply.Header)
	}
	if err := replyFailure(reply); err != nil {
		return err
	}
	how := reply.Header.Get(wire.HeaderAccepted)
	if how == "" {
		return &exitError{code: 1, msg: fmt.Sprintf("%s: the reply came from something other than the node (no %s header)", subject, wire.HeaderAccepted)}
	}
	fmt.Fprintf(m.Stdout, "accepted (%s) %s\n", how, reply.Header.Get(wire.HeaderMsgID))
	return nil
}

// SendCommand submits a command: meshbox send STAGE [DATA].
type SendCommand struct{ m *Main }

// flags defines its flags; its action submits the command and prints how it was accepted and its id.
func (c *SendCommand) flags(fs *flag.FlagSet) action {
	server := c.m.serverFlag(fs)
	id := fs.String("id", "", "message id for idempotency (default: one chosen by the node)")
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for the node to accept it")
	verbose := fs.Bool("v", false, "print the reply's headers on standard error")
	var hdrs headerFlags
	fs.Var(&hdrs, "header", "add a header KEY=VALUE (repeatable)")
	return func(ctx context.Context, pos []string) error {
		if len(pos) < 1 || len(pos) > 2 {
			return usagef("send takes a stage and optional data")
		}
		h, err := hdrs.header()
		if err != nil {
			return err
		}
		if *id != "" {
			h.Set(wire.HeaderMsgID, *id)
		}
		data, err := c.m.payload(pos, 1)
		if err != nil {
			return err
		}
		return c.m.submit(ctx, *server, wire.CommandSubject(pos[0]), data, h, *timeout, *verbose)
	}
}

// EmitCommand publishes an event: meshbox emit TOPIC [DATA].
type EmitCommand struct{ m *Main }

// flags defines its flags; its action publishes the event and waits until the node has it durably.
func (c *EmitCommand) flags(fs *flag.FlagSet) action {
	server := c.m.serverFlag(fs)
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for the node to accept it")
	verbose := fs.Bool("v", false, "print the reply's headers on standard error")
	var hdrs headerFlags
	fs.Var(&hdrs, "header", "add a header KEY=VALUE (repeatable)")
	return func(ctx context.Context, pos []string) error {
		if len(pos) < 1 || len(pos) > 2 {
			return usagef("emit takes a topic and optional data")
		}
		h, err := hdrs.header()
		if err != nil {
			return err
		}
		data, err := c.m.payload(pos, 1)
		if err != nil {
			return err
		}
		return c.m.submit(ctx, *server, wire.EventSubject(pos[0]), data, h, *timeout, *verbose)
	}
}

// ListenCommand prints messages: meshbox listen PATTERN.
type ListenCommand struct{ m *Main }

// flags defines its flags; its action subscribes to PATTERN and prints one line per message until
// interrupted (or --count messages).
func (c *ListenCommand) flags(fs *flag.FlagSet) action {
	server := c.m.serverFlag(fs)
	count := fs.Int("count", 0, "exit after this many messages (0: until interrupted)")
	verbose := fs.Bool("v", false, "print each message's headers")
	return func(ctx context.Context, pos []string) error {
		if len(pos) != 1 {
			return usagef("listen takes one subject pattern")
		}
		if *count < 0 {
			return usagef("--count must not be negative")
		}
		nc, err := c.m.connectNode(*server)
		if err != nil {
			return err
		}
		defer nc.Close()
		msgs := make(chan *nats.Msg, 1024)
		sub, err := nc.ChanSubscribe(pos[0], msgs)
		if err != nil {
			return usagef("listen %q: %v", pos[0], err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := nc.Flush(); err != nil {
			return fmt.Errorf("listen: %v", err)
		}
		closed := make(chan struct{})
		nc.SetClosedHandler(func(*nats.Conn) { close(closed) })
		for n := 0; *count == 0 || n < *count; n++ {
			select {
			case <-ctx.Done():
				return nil
			case <-closed:
				return &exitError{code: 1, msg: "the node closed the connection"}
			case m := <-msgs:
				line := m.Subject
				if o := m.Header.Get(wire.HeaderOrigin); o != "" {
					line += " (from " + o + ")"
				}
				fmt.Fprintf(c.m.Stdout, "%s: %s\n", line, m.Data)
				if *verbose {
					printHeaders(c.m.Stdout, m.Header)
				}
			}
		}
		return nil
	}
}
