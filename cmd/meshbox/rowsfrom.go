package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/meshbox/meshbox/appliance/rows"
)

// rows put TABLE --from FILE: many rows from a file of JSON lines, one
// write a line, sent in batches (the API's putmany). Each batch is
// committed on the node all or nothing. A file is checked whole before
// anything is sent, so a bad line writes nothing; standard input (-)
// cannot be read twice, so each batch is checked before it is sent and
// a bad line stops the command with the batches before it written.

// maxRowLine bounds a line of the input: a write carries at most
// rows.MaxRowBytes, which JSON's escapes may make several times longer.
const maxRowLine = 1 << 20

// rowLines reads the writes of a JSON lines input, one a line; blank
// lines are skipped.
type rowLines struct {
	r    *bufio.Reader
	line int // the number of the line read last
}

func newRowLines(r io.Reader) *rowLines { return &rowLines{r: bufio.NewReaderSize(r, 64<<10)} }

// next returns the next write and its encoding as a putmany carries it;
// io.EOF at the end. A bad line is an error naming its number.
func (l *rowLines) next() (rows.RowPut, []byte, error) {
	for {
		raw, err := l.readLine()
		if err != nil {
			return rows.RowPut{}, nil, err
		}
		if len(bytes.TrimSpace(raw)) == 0 {
			continue
		}
		w, err := parseRowLine(raw)
		if err != nil {
			return rows.RowPut{}, nil, usagef("line %d: %v", l.line, err)
		}
		enc, _ := json.Marshal(w) // plain values: cannot fail
		return w, enc, nil
	}
}

// readLine reads one line, without its end.
func (l *rowLines) readLine() ([]byte, error) {
	var line []byte
	for {
		chunk, err := l.r.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > maxRowLine {
			l.line++
			return nil, usagef("line %d: longer than %d bytes", l.line, maxRowLine)
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(line) > 0:
		case err != nil:
			return nil, err
		}
		l.line++
		return bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r")), nil
	}
}

// parseRowLine reads one write: {"row": R, "set": {F: V}, "delete": [F]},
// checked as the node checks it.
func parseRowLine(raw []byte) (rows.RowPut, error) {
	var w rows.RowPut
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return w, fmt.Errorf(`not a write as {"row": R, "set": {F: V, ...}, "delete": [F, ...]}: %v`, err)
	}
	if dec.More() {
		return w, errors.New("more than one JSON value on the line")
	}
	set := make(map[string][]byte, len(w.Set))
	for f, v := range w.Set {
		set[f] = []byte(v)
	}
	if err := rows.CheckWrite(w.Row, set, w.Delete); err != nil {
		return w, err
	}
	return w, nil
}

// rowBatch is the writes of one putmany and the lines they came from.
type rowBatch struct {
	puts        []rows.RowPut
	first, last int // lines
	size        int // of the request's body
}

// batchLimit is the most bytes a putmany's body may hold to reach the
// node: its max_payload, less room for headers.
func batchLimit(maxPayload int64) int {
	if maxPayload <= 0 {
		maxPayload = 1 << 20
	}
	return int(maxPayload) - 1024
}

// batches reads l and calls send with each batch: at most
// rows.MaxPutMany writes and limit bytes of body. It stops at the first
// error of reading or sending.
func batches(l *rowLines, limit int, send func(rowBatch) error) error {
	const head = len(`{"rows":[]}`)
	b := rowBatch{size: head}
	for {
		w, enc, err := l.next()
		if errors.Is(err, io.EOF) {
			if len(b.puts) == 0 {
				return nil
			}
			return send(b)
		}
		if err != nil {
			return err
		}
		if head+len(enc) > limit {
			return usagef("line %d: a write of %d bytes does not fit in a message to the node (at most about %d)", l.line, len(enc), limit-head)
		}
		if len(b.puts) == rows.MaxPutMany || b.size+len(enc)+1 > limit {
			if err := send(b); err != nil {
				return err
			}
			b = rowBatch{size: head}
		}
		if len(b.puts) == 0 {
			b.first = l.line
		}
		b.puts, b.last, b.size = append(b.puts, w), l.line, b.size+len(enc)+1
	}
}

// putFrom writes the rows of path ("-": standard input) to table
// through the node at server.
func (c *RowsCommand) putFrom(ctx context.Context, server string, timeout time.Duration, table, path string, asJSON bool) error {
	what := "rows put " + table + " --from " + path
	open := func() (io.ReadCloser, error) {
		if path == "-" {
			return io.NopCloser(c.m.Stdin), nil
		}
		f, err := os.Open(path)
		if err != nil {
			return nil, usagef("%s: %v", what, err)
		}
		return f, nil
	}
	if path != "-" {
		// Checked whole first: a bad line writes nothing.
		f, err := open()
		if err != nil {
			return err
		}
		err = batches(newRowLines(f), batchLimit(0), func(rowBatch) error { return nil })
		_ = f.Close()
		if err != nil {
			return fromFailure(what, err, 0)
		}
	}
	nc, err := c.m.connectNode(server)
	if err != nil {
		return err
	}
	defer nc.Close()
	r := rowsClient{nc: nc, timeout: timeout}
	limit := batchLimit(nc.MaxPayload())
	f, err := open()
	if err != nil {
		return err
	}
	defer f.Close()
	written, requests, node := 0, 0, ""
	err = batches(newRowLines(f), limit, func(b rowBatch) error {
		raw, err := r.ask(ctx, table, rows.OpPutMany, rows.Request{Rows: b.puts})
		if err != nil {
			return prefixed(fmt.Sprintf("lines %d to %d, not written", b.first, b.last), err)
		}
		var w rows.WrittenRows
		if err := json.Unmarshal(raw, &w); err != nil || len(w.Rows) != len(b.puts) {
			return badAnswer(rows.OpPutMany, fmt.Errorf("%d rows answered of %d: %v", len(w.Rows), len(b.puts), err))
		}
		if asJSON {
			fmt.Fprintf(c.m.Stdout, "%s\n", raw)
		}
		written, requests, node = written+len(b.puts), requests+1, w.Node
		return nil
	})
	if err != nil {
		return fromFailure(what, err, written)
	}
	if !asJSON {
		if written == 0 {
			fmt.Fprintf(c.m.Stdout, "no rows in %s: nothing written\n", path)
			return nil
		}
		fmt.Fprintf(c.m.Stdout, "written %d rows of %s on node %s (%d requests)\n", written, table, node, requests)
	}
	return nil
}

// fromFailure is the error of a put --from: what failed, and how many
// rows the batches before it wrote, with the exit status of the cause.
func fromFailure(what string, err error, written int) error {
	code := 1
	var ee *exitError
	var ue *usageError
	switch {
	case errors.As(err, &ee):
		code = ee.code
	case errors.As(err, &ue):
		code = 2
	}
	msg := what + ": " + err.Error()
	if written > 0 {
		msg += fmt.Sprintf(" (the %d rows before it are written)", written)
	}
	return &exitError{code: code, msg: msg}
}
