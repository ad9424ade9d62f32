package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/appliance/rows"
)

// jobLines is n JSON lines of writes to rows j-<from>..., one a line.
func jobLines(from, n int) string {
	var b strings.Builder
	for i := from; i < from+n; i++ {
		fmt.Fprintf(&b, `{"row":"j-%05d","set":{"status":"queued","n":"%d"}}`+"\n", i, i)
	}
	return b.String()
}

// rowCount lists table jobs on the node at c's server, page by page,
// and counts its rows.
func rowCount(t *testing.T, c cli) int {
	t.Helper()
	nc, err := nats.Connect(c.env["MESHBOX_SERVER"])
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	n, after := 0, ""
	for {
		raw, err := (rowsClient{nc: nc, timeout: rowsTimeout}).ask(t.Context(), "jobs", rows.OpList, rows.Request{After: after, Limit: rows.MaxListLimit})
		if err != nil {
			t.Fatal(err)
		}
		var l rows.ListDoc
		if err := json.Unmarshal(raw, &l); err != nil {
			t.Fatal(err)
		}
		n += len(l.Rows)
		if !l.More {
			return n
		}
		after = l.Rows[len(l.Rows)-1].Row
	}
}

// TestRowsPutFrom: rows put --from writes a file's rows and standard
// input's in batches of at most rows.MaxPutMany; a bad line is refused
// naming its line, and a file with one writes nothing, standard input
// nothing of its batch; a batch the node refuses is written not at all.
func TestRowsPutFrom(t *testing.T) {
	c := cli{env: map[string]string{"MESHBOX_SERVER": rowsNode(t)}}
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	// 2,500 rows, blank lines and CRLF too: three requests.
	good := file("good.jsonl", jobLines(0, 1200)+"\n  \n"+strings.ReplaceAll(jobLines(1200, 1300), "\n", "\r\n"))
	if out := c.ok(t, "rows", "put", "jobs", "--from", good); out != "written 2500 rows of jobs on node solo (3 requests)\n" {
		t.Errorf("rows put --from: got %q", out)
	}
	if out := c.ok(t, "rows", "get", "jobs", "j-02499", "--field", "n"); out != "2499\n" {
		t.Errorf("the last row's n: got %q, want 2499", out)
	}

	// A later line of the same row wins; deletes; --json prints each
	// batch's answer.
	in := cli{env: c.env, stdin: `{"row":"j-00000","set":{"status":"running"}}` + "\n" +
		`{"row":"j-00000","set":{"status":"done"},"delete":["n"]}` + "\n"}
	var w rows.WrittenRows
	if err := json.Unmarshal([]byte(in.ok(t, "rows", "put", "jobs", "--from", "-", "--json")), &w); err != nil ||
		len(w.Rows) != 2 || w.Rows[1].Row != "j-00000" || w.Rows[1].Stamp <= w.Rows[0].Stamp || w.Node != "solo" {
		t.Errorf("rows put --from - --json: %+v %v", w, err)
	}
	var d rows.RowDoc
	if err := json.Unmarshal([]byte(c.ok(t, "rows", "get", "jobs", "j-00000", "--json")), &d); err != nil || d.Fields["status"] != "done" || !d.Versions["n"].Deleted {
		t.Errorf("j-00000 after two writes in one batch: %+v %v", d, err)
	}

	// Bad lines: the file is refused whole, naming the line.
	for _, tt := range []struct{ line, want string }{
		{`{"row":"x","set":{"a.b":"1"}}`, `line 1502: bad input: field "a.b"`},
		{`{"row":".x","set":{"a":"1"}}`, `line 1502: bad input: row ".x"`},
		{`{"row":"x"}`, "line 1502: bad input: a write sets or deletes at least one field"},
		{`{"row":"x","sett":{"a":"1"}}`, `line 1502: not a write as {"row": R`},
		{`{"row":"x","set":{"a":"1"}} {"row":"y"}`, "line 1502: more than one JSON value"},
		{`["x"]`, "line 1502: not a write"},
		{`{"row":"x","set":{"a":"` + strings.Repeat("v", rows.MaxValueLen+1) + `"}}`, "line 1502: bad input: field a: value of"},
	} {
		bad := file("bad.jsonl", jobLines(5000, 1500)+"\n"+tt.line+"\n"+jobLines(7000, 10))
		_, _, err := c.run(t, "rows", "put", "jobs", "--from", bad)
		if exitStatus(err) != 2 || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "written") {
			t.Errorf("a file with %.40s: got %v (exit %d), want exit 2 saying %q", tt.line, err, exitStatus(err), tt.want)
		}
	}
	if n := rowCount(t, c); n != 2500 {
		t.Fatalf("after the bad files: %d rows, want the 2500 before", n)
	}

	// From standard input, the batches before the bad line are written,
	// not the one it is in.
	in = cli{env: c.env, stdin: jobLines(5000, 1500) + `{"row":"x"}` + "\n"}
	_, _, err := in.run(t, "rows", "put", "jobs", "--from", "-")
	if exitStatus(err) != 2 || !strings.Contains(err.Error(), "rows put jobs --from -: line 1501: bad input") ||
		!strings.Contains(err.Error(), "(the 1000 rows before it are written)") {
		t.Errorf("standard input with a bad line: got %v (exit %d)", err, exitStatus(err))
	}
	if n := rowCount(t, c); n != 3500 {
		t.Errorf("after standard input's bad line: %d rows, want 3500 (its first batch)", n)
	}

	// The node's refusal of a batch: nothing of it is written.
	_, _, err = c.run(t, "rows", "put", "other", "--from", good)
	if exitStatus(err) != exitNotFound || !strings.Contains(err.Error(), "lines 1 to 1000, not written: no such table") {
		t.Errorf("a table that does not exist: got %v (exit %d)", err, exitStatus(err))
	}

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"rows", "put", "jobs", "42", "--from", good}, "usage: meshbox rows put TABLE --from FILE"},
		{[]string{"rows", "put", "jobs", "--from", good, "--delete", "a"}, "usage: meshbox rows put TABLE --from FILE"},
		{[]string{"rows", "put", "jobs", "--from", filepath.Join(dir, "none")}, "no such file"},
		{[]string{"rows", "put", "Jobs", "--from", good}, `table "Jobs"`},
	} {
		c.fails(t, tt.want, tt.args...)
	}
	if out := (cli{env: c.env, stdin: "\n\n"}).ok(t, "rows", "put", "jobs", "--from", "-"); out != "no rows in -: nothing written\n" {
		t.Errorf("empty input: got %q", out)
	}
}

// TestRowsPutManyAPI: the API's putmany checks every write before it
// writes any, and bounds a batch.
func TestRowsPutManyAPI(t *testing.T) {
	url := rowsNode(t)
	c := cli{env: map[string]string{"MESHBOX_SERVER": url}}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	r := rowsClient{nc: nc, timeout: rowsTimeout}
	ask := func(puts []rows.RowPut) error {
		_, err := r.ask(t.Context(), "jobs", rows.OpPutMany, rows.Request{Rows: puts})
		return err
	}
	many := make([]rows.RowPut, rows.MaxPutMany+1)
	for i := range many {
		many[i] = rows.RowPut{Row: fmt.Sprintf("r%d", i), Set: map[string]string{"a": "1"}}
	}
	for _, tt := range []struct {
		puts []rows.RowPut
		want string
	}{
		{nil, "a batch put writes at least one row"},
		{many, fmt.Sprintf("%d rows in one batch put, at most %d", rows.MaxPutMany+1, rows.MaxPutMany)},
		{append(many[:3:3], rows.RowPut{Row: "r9", Set: map[string]string{"a": "1"}, Delete: []string{"a"}}),
			`write 4 of 4 (row "r9"): bad input: field a both set and deleted`},
	} {
		if err := ask(tt.puts); exitStatus(err) != 2 || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%d writes: got %v, want a refusal saying %q", len(tt.puts), err, tt.want)
		}
	}
	if n := rowCount(t, c); n != 0 {
		t.Errorf("after refused batches: %d rows, want none", n)
	}
	if err := ask(many[:rows.MaxPutMany]); err != nil {
		t.Fatal(err)
	}
	if n := rowCount(t, c); n != rows.MaxPutMany {
		t.Errorf("after a batch of %d: %d rows", rows.MaxPutMany, n)
	}
}
