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
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats.go"
)

// RowsCommand reads and writes the mesh's tables of rows through the
// local node's rows API ($MESH.rows.<table>.<op>): a write is answered
// once it is on the node's disk; the node carries it to the others.
type RowsCommand struct{ m *Main }

const rowsUsage = `Usage: meshbox rows <command> [--server URL] [flags]

Commands:
  put TABLE ROW FIELD=VALUE... [--delete FIELD]...
                                  write fields of a row (and delete others);
                                  each field converges on its own
  put TABLE --from FILE           write many rows: FILE (- for standard input)
                                  holds a JSON line a row, as
                                  {"row":"r1","set":{"f":"v"},"delete":["g"]}
  get TABLE ROW [--field F]       a row's fields, with who wrote each and when
  list TABLE [--prefix P] [--limit N]
                                  the rows of a table, in key order
  watch TABLE [ROW] [--count N]   print each change this node applies (its own
                                  writes and those of other nodes) until
                                  interrupted
  delete TABLE ROW                delete every field of a row
  history TABLE ROW FIELD         the versions of a field this node holds,
                                  newest first

Every command takes --json (the node's answer as JSON) and --timeout.
Exit status: 0 done, 1 the node failed or did not answer, 2 a usage error or
input the node refused, 3 no such table, row or field.

A table is defined for the whole mesh with meshbox mesh table add TABLE.
`

// Exit statuses of the rows commands beyond 0, 1 and 2 (usage).
const exitNotFound = 3

// rowsTimeout is how long a command waits for the node's answer.
const rowsTimeout = 10 * time.Second

// rowsOp is one of rows' commands: its arguments and the operation of
// the rows API it asks the node for.
type rowsOp struct {
	name     string
	args     string // its arguments, as usage errors name them
	more     string // the rest of its synopsis: its own flags
	op       string // of the rows API; "" for watch, which listens
	min, max int    // how many arguments it takes (max -1: any number)
}

// rowsOps are rows' commands, in the order help lists them.
var rowsOps = []rowsOp{
	{"put", "TABLE ROW FIELD=VALUE...", "[--delete FIELD]... | rows put TABLE --from FILE", rows.OpPut, 2, -1},
	{"get", "TABLE ROW", "[--field F]", rows.OpGet, 2, 2},
	{"list", "TABLE", "[--prefix P] [--limit N]", rows.OpList, 1, 1},
	{"watch", "TABLE [ROW]", "[--count N]", "", 1, 2},
	{"delete", "TABLE ROW", "", rows.OpDelete, 2, 2},
	{"history", "TABLE ROW FIELD", "", rows.OpHistory, 3, 3},
}

// rowsCommands are rows' subcommands, one for each of rowsOps.
func rowsCommands() []command {
	var out []command
	for _, o := range rowsOps {
		out = append(out, command{
			name:     o.name,
			synopsis: strings.Join(strings.Fields("rows "+o.name+" "+o.args+" "+o.more), " ") + " [--server URL] [--json]",
			args:     []word{wordTable},
			flags:    func(m *Main, fs *flag.FlagSet) action { return (&RowsCommand{m: m}).flags(o, fs) },
		}.withValues(map[string]word{"from": wordFile}))
	}
	return out
}

// rowsOpNamed is the rows command named name.
func rowsOpNamed(name string) (rowsOp, bool) {
	for _, o := range rowsOps {
		if o.name == name {
			return o, true
		}
	}
	return rowsOp{}, false
}

// flags defines the flags of rows command o on fs; its action asks the
// node.
func (c *RowsCommand) flags(o rowsOp, fs *flag.FlagSet) action {
	sub := o.name
	server := c.m.serverFlag(fs)
	asJSON := fs.Bool("json", false, "print the node's answer as JSON (watch: one change per line)")
	timeout := fs.Duration("timeout", rowsTimeout, "how long to wait for the node's answer")
	var del listFlag
	var field, prefix, from *string
	var limit, count *int
	switch o.op {
	case rows.OpPut:
		fs.Var(&del, "delete", "delete this field of the row (repeatable, or comma-separated)")
		from = fs.String("from", "", "write the rows of this file of JSON lines, one row a line (- for standard input), in batches")
	case rows.OpGet:
		field = fs.String("field", "", "print only this field's value, as it is")
	case rows.OpList:
		prefix = fs.String("prefix", "", "only the rows whose key starts with this")
		limit = fs.Int("limit", rows.DefaultListLimit, fmt.Sprintf("the most rows to print (at most %d)", rows.MaxListLimit))
	case "":
		count = fs.Int("count", 0, "exit after this many changes (0: until interrupted)")
	}
	return func(ctx context.Context, pos []string) error {
		if *timeout <= 0 {
			return usagef("rows %s: --timeout must be positive", sub)
		}
		if from != nil && *from != "" {
			if len(pos) != 1 || len(del) > 0 {
				return usagef("usage: meshbox rows put TABLE --from FILE: the rows, their fields and deletes come from the file")
			}
			if err := rows.ValidTable(pos[0]); err != nil {
				return usagef("rows put: %v", err)
			}
			return c.putFrom(ctx, *server, *timeout, pos[0], *from, *asJSON)
		}
		req, err := rowsRequest(sub, pos, del)
		if err != nil {
			return err
		}
		table := pos[0]
		switch {
		case field != nil && *field != "":
			if err := rows.ValidField(*field); err != nil {
				return usagef("rows get: --field: %v", err)
			}
		case limit != nil:
			if *limit <= 0 || *limit > rows.MaxListLimit {
				return usagef("rows list: --limit %d: want 1 to %d", *limit, rows.MaxListLimit)
			}
			req.Prefix, req.Limit = *prefix, *limit
		case count != nil && *count < 0:
			return usagef("rows watch: --count must not be negative")
		}
		nc, err := c.m.connectNode(*server)
		if err != nil {
			return err
		}
		defer nc.Close()
		r := rowsClient{nc: nc, timeout: *timeout}
		if o.op == "" {
			return c.watch(ctx, r, table, req.Row, *count, *asJSON)
		}
		op := o.op
		raw, err := r.ask(ctx, table, op, req)
		if err != nil {
			return prefixed("rows "+sub+" "+strings.Join(pos[:min(len(pos), 3)], " "), err)
		}
		if *asJSON && (field == nil || *field == "") {
			return printJSON(c.m.Stdout, raw)
		}
		out := c.m.Stdout
		switch op {
		case rows.OpPut, rows.OpDelete:
			var w rows.Written
			if err := json.Unmarshal(raw, &w); err != nil {
				return badAnswer(op, err)
			}
			verb := map[string]string{rows.OpPut: "written", rows.OpDelete: "deleted"}[op]
			fmt.Fprintf(out, "%s %s/%s on node %s, stamp %s\n", verb, w.Table, w.Row, w.Node, w.Stamp)
		case rows.OpGet:
			var d rows.RowDoc
			if err := json.Unmarshal(raw, &d); err != nil {
				return badAnswer(op, err)
			}
			if *field != "" {
				v, ok := d.Fields[*field]
				if !ok {
					return &exitError{code: exitNotFound, msg: fmt.Sprintf("rows get %s %s: row %s has no field %s", table, req.Row, req.Row, *field)}
				}
				if *asJSON {
					return writeJSON(out, d.Versions[*field])
				}
				_, err := fmt.Fprintln(out, v)
				return err
			}
			return printRow(out, d)
		case rows.OpList:
			var d rows.ListDoc
			if err := json.Unmarshal(raw, &d); err != nil {
				return badAnswer(op, err)
			}
			printRowList(out, d, req.Prefix)
			if d.More {
				fmt.Fprintf(c.m.Stderr, "more rows follow: --limit N prints more, --prefix P fewer\n")
			}
		case rows.OpHistory:
			var d rows.HistoryDoc
			if err := json.Unmarshal(raw, &d); err != nil {
				return badAnswer(op, err)
			}
			if len(d.Versions) == 0 {
				return &exitError{code: exitNotFound, msg: fmt.Sprintf("rows history %s %s %s: this node holds no version of field %s of row %s", table, req.Row, req.Field, req.Field, req.Row)}
			}
			printHistory(out, d)
		}
		return nil
	}
}

// rowsRequest checks the positional arguments of sub (and put's deleted
// fields) and builds its request. pos[0] is the table of every command.
func rowsRequest(sub string, pos []string, del []string) (rows.Request, error) {
	var req rows.Request
	o, _ := rowsOpNamed(sub)
	if len(pos) < o.min || (o.max >= 0 && len(pos) > o.max) {
		return req, usagef("usage: meshbox rows %s %s (got %d arguments)", sub, o.args, len(pos))
	}
	if err := rows.ValidTable(pos[0]); err != nil {
		return req, usagef("rows %s: %v", sub, err)
	}
	if len(pos) > 1 {
		req.Row = pos[1]
		if err := rows.ValidRow(req.Row); err != nil {
			return req, usagef("rows %s: %v", sub, err)
		}
	}
	switch o.op {
	case rows.OpHistory:
		req.Field = pos[2]
		if err := rows.ValidField(req.Field); err != nil {
			return req, usagef("rows history: %v", err)
		}
	case rows.OpPut:
		set, err := parseAssignments(pos[2:])
		if err != nil {
			return req, err
		}
		for _, f := range del {
			if err := rows.ValidField(f); err != nil {
				return req, usagef("rows put: --delete: %v", err)
			}
			if _, both := set[f]; both {
				return req, usagef("rows put: field %s is both set (%s=...) and deleted (--delete %s): give one", f, f, f)
			}
			if slices.Contains(req.Delete, f) {
				continue
			}
			req.Delete = append(req.Delete, f)
		}
		if len(set)+len(req.Delete) == 0 {
			return req, usagef("rows put %s %s: nothing to write: give fields as FIELD=VALUE (status=queued), or --delete FIELD", pos[0], pos[1])
		}
		if n := len(set) + len(req.Delete); n > rows.MaxFields {
			return req, usagef("rows put: %d fields in one write, at most %d", n, rows.MaxFields)
		}
		if len(set) > 0 {
			req.Set = set
		}
	}
	return req, nil
}

// parseAssignments reads put's FIELD=VALUE arguments. A value may hold
// any byte, '=' included (the field ends at the first); an empty value
// sets the field to "".
func parseAssignments(args []string) (map[string]string, error) {
	set := map[string]string{}
	for _, a := range args {
		f, v, ok := strings.Cut(a, "=")
		if !ok {
			return nil, usagef("rows put: %q is not FIELD=VALUE: give each field with its value, as status=queued (an empty value is status=); to delete a field, --delete %s", a, a)
		}
		if err := rows.ValidField(f); err != nil {
			return nil, usagef("rows put: %q: %v", a, err)
		}
		if _, dup := set[f]; dup {
			return nil, usagef("rows put: field %s given twice", f)
		}
		if len(v) > rows.MaxValueLen {
			return nil, usagef("rows put: field %s: a value of %d bytes, at most %d (bytes belong in a blob: meshbox blob put FILE, and the row holds its reference)", f, len(v), rows.MaxValueLen)
		}
		set[f] = v
	}
	return set, nil
}

// rowsClient sends requests of the rows API to the local node.
type rowsClient struct {
	nc      *nats.Conn
	timeout time.Duration
}

// ask sends req for op on table and returns the node's answer, or an
// error that says what failed (an *exitError for the node's refusals).
func (r rowsClient) ask(ctx context.Context, table, op string, req rows.Request) ([]byte, error) {
	data, _ := json.Marshal(req) // plain values: cannot fail
	subject := rows.Subject(table, op)
	if err := fitsMessage(r.nc, data); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	msg, err := r.nc.RequestWithContext(ctx, subject, data)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return nil, &exitError{code: 1, msg: fmt.Sprintf("nothing answers %s: the node serves no tables of rows (an older meshbox? meshbox version shows the node's)", subject)}
	case errors.Is(err, context.DeadlineExceeded):
		return nil, &exitError{code: 1, msg: fmt.Sprintf("no answer to %s within %s", subject, r.timeout)}
	case err != nil:
		return nil, fmt.Errorf("%s: %v", subject, err)
	}
	if se := wire.ErrorOf(msg.Header); se != nil {
		return nil, rowsFailure(se.Code, se.Text)
	}
	return msg.Data, nil
}

// rowsFailure is the exit error of a refusal of the rows API.
func rowsFailure(code int, text string) error {
	switch code {
	case 400:
		return &exitError{code: 2, msg: text}
	case 404:
		return &exitError{code: exitNotFound, msg: text}
	case 503:
		return &exitError{code: 1, msg: text + " (the node can write this table once it holds the key: meshbox status shows its keys)"}
	}
	return &exitError{code: 1, msg: fmt.Sprintf("the node failed (error %d): %s", code, text)}
}

// prefixed puts what failed before err's message, keeping an
// *exitError's status.
func prefixed(what string, err error) error {
	var ee *exitError
	if errors.As(err, &ee) {
		return &exitError{code: ee.code, msg: what + ": " + ee.msg}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// badAnswer is the error of an answer that does not decode.
func badAnswer(op string, err error) error {
	return fmt.Errorf("the node's answer to %s is not one of the rows API: %v", op, err)
}

// watch prints every change of table (of row, when given) the node
// applies, until ctx ends or count changes were printed.
func (c *RowsCommand) watch(ctx context.Context, r rowsClient, table, row string, count int, asJSON bool) error {
	subject := rows.ChangedSubject(table, ">")
	if row != "" {
		subject = rows.ChangedSubject(table, row)
	}
	msgs := make(chan *nats.Msg, 1024)
	sub, err := r.nc.ChanSubscribe(subject, msgs)
	if err != nil {
		return fmt.Errorf("rows watch: subscribe %s: %v", subject, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := r.nc.Flush(); err != nil {
		return fmt.Errorf("rows watch: %v", err)
	}
	// The table must exist: else nothing would ever arrive.
	if _, err := r.ask(ctx, table, rows.OpList, rows.Request{Limit: 1}); err != nil {
		return prefixed("rows watch "+table, err)
	}
	if !asJSON {
		what := "table " + table
		if row != "" {
			what = "row " + row + " of table " + table
		}
		fmt.Fprintf(c.m.Stderr, "watching %s (interrupt to stop)\n", what)
	}
	closed := make(chan struct{})
	r.nc.SetClosedHandler(func(*nats.Conn) { close(closed) })
	for n := 0; count == 0 || n < count; n++ {
		select {
		case <-ctx.Done():
			return nil
		case <-closed:
			return &exitError{code: 1, msg: "rows watch: the node closed the connection"}
		case m := <-msgs:
			if asJSON {
				var v any
				if err := json.Unmarshal(m.Data, &v); err != nil {
					return badAnswer("a change", err)
				}
				b, _ := json.Marshal(v)
				fmt.Fprintf(c.m.Stdout, "%s\n", b)
				continue
			}
			var d rows.ChangedDoc
			if err := json.Unmarshal(m.Data, &d); err != nil {
				return badAnswer("a change", err)
			}
			fmt.Fprintln(c.m.Stdout, changeLine(d))
		}
	}
	return nil
}

// changeLine is one change as watch prints it:
//
//	42: status=done, worker deleted (by beta, stamp 2026-12-02T10:00:00.000Z+0)
func changeLine(d rows.ChangedDoc) string {
	var parts []string
	for _, f := range slices.Sorted(maps.Keys(d.Fields)) {
		parts = append(parts, f+"="+valueText(d.Fields[f], true))
	}
	deleted := slices.Sorted(slices.Values(d.Deleted))
	for _, f := range deleted {
		parts = append(parts, f+" deleted")
	}
	line := d.Row + ": " + strings.Join(parts, ", ")
	if v, ok := newestVersion(d.Versions); ok {
		line += fmt.Sprintf(" (by %s, stamp %s)", v.Node, v.Stamp)
	}
	return line
}

// newestVersion is the version with the largest stamp.
func newestVersion(vs map[string]rows.Version) (rows.Version, bool) {
	var best rows.Version
	found := false
	for _, f := range slices.Sorted(maps.Keys(vs)) {
		if v := vs[f]; !found || v.At.After(best.At) || (v.At.Equal(best.At) && v.Stamp > best.Stamp) {
			best, found = v, true
		}
	}
	return best, found
}

// printRow writes a row's fields, one per line, with who wrote each and
// when.
func printRow(w io.Writer, d rows.RowDoc) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FIELD\tVALUE\tNODE\tSTAMP")
	for _, f := range slices.Sorted(maps.Keys(d.Fields)) {
		v := d.Versions[f]
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f, valueText(d.Fields[f], false), v.Node, v.Stamp)
	}
	return tw.Flush()
}

// printRowList writes one line per row: its key and its fields.
func printRowList(w io.Writer, d rows.ListDoc, prefix string) {
	if len(d.Rows) == 0 {
		if prefix != "" {
			fmt.Fprintf(w, "no rows starting with %s in table %s\n", prefix, d.Table)
		} else {
			fmt.Fprintf(w, "no rows in table %s\n", d.Table)
		}
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ROW\tFIELDS")
	for _, r := range d.Rows {
		var parts []string
		for _, f := range slices.Sorted(maps.Keys(r.Fields)) {
			parts = append(parts, f+"="+valueText(r.Fields[f], true))
		}
		fmt.Fprintf(tw, "%s\t%s\n", r.Row, strings.Join(parts, " "))
	}
	_ = tw.Flush()
}

// printHistory writes a field's versions, newest first.
func printHistory(w io.Writer, d rows.HistoryDoc) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STAMP\tNODE\tVALUE")
	for _, v := range d.Versions {
		val := valueText(v.Value, false)
		if v.Deleted {
			val = "(deleted)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", v.Stamp, v.Node, val)
	}
	_ = tw.Flush()
}

// valueText is a value as a line of text shows it: as it is, or quoted
// (Go syntax) when it is empty, holds control characters or is not UTF-8,
// or (inline, among other fields) holds a space or a comma.
func valueText(v string, inline bool) string {
	quote := v == "" || !utf8.ValidString(v) || strings.TrimSpace(v) != v
	for _, r := range v {
		if unicode.IsControl(r) || (inline && (r == ' ' || r == ',' || r == '"')) {
			quote = true
			break
		}
	}
	if quote {
		return strconv.Quote(v)
	}
	return v
}

// tableLine is a table's line of meshbox status.
func tableLine(t rows.TableStatus) string {
	v := fmt.Sprintf("%s: %d rows, %d writes waiting for the broker", t.Table, t.Rows, t.Pending)
	if t.Scope != "" {
		v += ", scope " + t.Scope
	}
	if t.Synced {
		v += fmt.Sprintf(", reading its log (%d behind)", t.Behind)
	} else {
		v += ", not reading its log"
	}
	if t.Gap {
		v += ", GAP: this node was away longer than the log keeps changes and converged from its newest snapshot"
	}
	if t.Alarm != "" {
		var causes []string
		for _, c := range slices.Sorted(maps.Keys(t.Refused)) {
			causes = append(causes, fmt.Sprintf("%d %s", t.Refused[c], c))
		}
		v += " — ALARM (" + strings.Join(causes, ", ") + " refused): " + t.Alarm
	}
	return v
}
