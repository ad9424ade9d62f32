package main

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
)

// TestRowsArguments: what rows' commands accept, and how they refuse
// what they do not, before anything reaches a node.
func TestRowsArguments(t *testing.T) {
	for _, tt := range []struct {
		sub  string
		pos  []string
		del  []string
		want rows.Request
		err  string // "" for none
	}{
		{"put", []string{"jobs", "42", "status=queued", "note=a=b", "empty="}, nil,
			rows.Request{Row: "42", Set: map[string]string{"status": "queued", "note": "a=b", "empty": ""}}, ""},
		{"put", []string{"jobs", "42"}, []string{"note", "note", "worker"}, rows.Request{Row: "42", Delete: []string{"note", "worker"}}, ""},
		{"put", []string{"jobs", "42", "status"}, nil, rows.Request{}, `"status" is not FIELD=VALUE: give each field with its value, as status=queued`},
		{"put", []string{"jobs", "42", "=x"}, nil, rows.Request{}, `field "": a field name is`},
		{"put", []string{"jobs", "42", "a.b=x"}, nil, rows.Request{}, `field "a.b"`},
		{"put", []string{"jobs", "42", "a=1", "a=2"}, nil, rows.Request{}, "field a given twice"},
		{"put", []string{"jobs", "42", "a=1"}, []string{"a"}, rows.Request{}, "field a is both set"},
		{"put", []string{"jobs", "42"}, nil, rows.Request{}, "nothing to write"},
		{"put", []string{"jobs", "42", "big=" + strings.Repeat("x", rows.MaxValueLen+1)}, nil, rows.Request{}, "bytes belong in a blob"},
		{"put", []string{"jobs"}, nil, rows.Request{}, "usage: meshbox rows put TABLE ROW FIELD=VALUE..."},
		{"put", []string{"Jobs", "42", "a=1"}, nil, rows.Request{}, `table "Jobs": a table name is`},
		{"put", []string{"jobs", ".42", "a=1"}, nil, rows.Request{}, `row ".42": a row key is`},
		{"get", []string{"jobs", "a.b=c-d_e"}, nil, rows.Request{Row: "a.b=c-d_e"}, ""},
		{"get", []string{"jobs", "42", "status"}, nil, rows.Request{}, "usage: meshbox rows get TABLE ROW (got 3 arguments)"},
		{"get", []string{"jobs", "4 2"}, nil, rows.Request{}, `row "4 2"`},
		{"list", []string{"jobs"}, nil, rows.Request{}, ""},
		{"list", []string{"jobs", "42"}, nil, rows.Request{}, "usage: meshbox rows list TABLE"},
		{"watch", []string{"jobs"}, nil, rows.Request{}, ""},
		{"watch", []string{"jobs", "42"}, nil, rows.Request{Row: "42"}, ""},
		{"watch", []string{"jobs", "*"}, nil, rows.Request{}, `row "*"`},
		{"delete", []string{"jobs", "42"}, nil, rows.Request{Row: "42"}, ""},
		{"delete", []string{"jobs"}, nil, rows.Request{}, "usage: meshbox rows delete TABLE ROW"},
		{"history", []string{"jobs", "42", "status"}, nil, rows.Request{Row: "42", Field: "status"}, ""},
		{"history", []string{"jobs", "42", "st.atus"}, nil, rows.Request{}, `field "st.atus"`},
		{"history", []string{"jobs", "42"}, nil, rows.Request{}, "usage: meshbox rows history TABLE ROW FIELD"},
	} {
		got, err := rowsRequest(tt.sub, tt.pos, tt.del)
		if tt.err == "" {
			if err != nil {
				t.Errorf("rows %s %q --delete %q: %v", tt.sub, tt.pos, tt.del, err)
				continue
			}
			g, _ := json.Marshal(got)
			w, _ := json.Marshal(tt.want)
			if string(g) != string(w) {
				t.Errorf("rows %s %q --delete %q: got %s, want %s", tt.sub, tt.pos, tt.del, g, w)
			}
			continue
		}
		var ue *usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.err) {
			t.Errorf("rows %s %q --delete %q: got %v, want a usage error saying %q", tt.sub, tt.pos, tt.del, err, tt.err)
		}
	}
}

// TestRowsFlags: flags are checked before the node is asked (the server
// named is not there: a check that passed would fail to reach it).
func TestRowsFlags(t *testing.T) {
	c := cli{env: map[string]string{"MESHBOX_SERVER": "nats://" + meshtest.ClosedAddr(t)}}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"rows"}, "no command given"},
		{[]string{"rows", "frobnicate", "jobs"}, `unknown command "frobnicate"`},
		{[]string{"rows", "list", "jobs", "--limit", "0"}, "--limit 0: want 1 to 10000"},
		{[]string{"rows", "list", "jobs", "--limit", "10001"}, "--limit 10001"},
		{[]string{"rows", "get", "jobs", "42", "--field", "a.b"}, `--field: bad input: field "a.b"`},
		{[]string{"rows", "watch", "jobs", "--count", "-1"}, "--count must not be negative"},
		{[]string{"rows", "get", "jobs", "42", "--timeout", "0s"}, "--timeout must be positive"},
		{[]string{"rows", "put", "jobs", "42", "--prefix", "x", "a=1"}, "flag provided but not defined: -prefix"},
	} {
		_, _, err := c.run(t, tt.args...)
		var ue *usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("meshbox %s: got %v, want a usage error saying %q", strings.Join(tt.args, " "), err, tt.want)
		}
	}
	c.fails(t, "cannot reach the node", "rows", "get", "jobs", "42")
}

// rowsNode serves the rows API of a node without a broker (its tables
// stay on it) on a NATS server, with table jobs, and returns its URL.
func rowsNode(t *testing.T) string {
	t.Helper()
	srv := natstest.Start(t)
	e, err := rows.Open(rows.Config{Node: "solo", Path: filepath.Join(t.TempDir(), "rows.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	e.SetTables(map[string]rows.TableSpec{"jobs": {}})
	nc := natstest.Connect(t, srv)
	sub, err := e.Serve(rows.ServeConfig{Conn: nc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return srv.ClientURL()
}

// exitStatus is the status meshbox exits with for err.
func exitStatus(err error) int {
	var b strings.Builder
	return exitCode(&b, err)
}

func TestRowsCommands(t *testing.T) {
	c := cli{env: map[string]string{"MESHBOX_SERVER": rowsNode(t)}}

	// watch, started first, prints the changes that follow.
	watched := make(chan string, 1)
	go func() {
		out, _, err := c.run(t, "rows", "watch", "jobs", "--count", "2")
		if err != nil {
			out = err.Error()
		}
		watched <- out
	}()
	// Nothing tells when watch has subscribed: writes go on until it
	// printed two changes.
	var out string
	meshtest.WaitFor(t, 10*time.Second, "watch printing two changes", func() bool {
		c.ok(t, "rows", "put", "jobs", "w1", "status=queued")
		select {
		case out = <-watched:
			return true
		case <-time.After(100 * time.Millisecond):
			return false
		}
	})
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[0], "w1: status=queued (by solo, stamp ") {
		t.Errorf("rows watch: got %q, want two lines of w1: status=queued (by solo, stamp ...)", out)
	}

	out = c.ok(t, "rows", "put", "jobs", "42", "status=queued", "note=two words", "owner=")
	if !strings.HasPrefix(out, "written jobs/42 on node solo, stamp ") {
		t.Errorf("rows put: got %q", out)
	}
	var w rows.Written
	if err := json.Unmarshal([]byte(c.ok(t, "rows", "put", "jobs", "42", "status=running", "--json")), &w); err != nil || w.Row != "42" || w.Node != "solo" || w.Stamp == "" {
		t.Errorf("rows put --json: %+v %v", w, err)
	}
	out = c.ok(t, "rows", "get", "jobs", "42")
	for _, want := range []string{"FIELD", "status  running", "note    two words ", `owner   ""`, "solo"} {
		if !strings.Contains(out, want) {
			t.Errorf("rows get: %q lacks %q", out, want)
		}
	}
	if out := c.ok(t, "rows", "get", "jobs", "42", "--field", "note"); out != "two words\n" {
		t.Errorf("rows get --field note: got %q", out)
	}
	_, _, err := c.run(t, "rows", "get", "jobs", "42", "--field", "nothing")
	if exitStatus(err) != exitNotFound || !strings.Contains(err.Error(), "row 42 has no field nothing") {
		t.Errorf("rows get --field nothing: got %v (exit %d), want exit 3", err, exitStatus(err))
	}
	var d rows.RowDoc
	if err := json.Unmarshal([]byte(c.ok(t, "rows", "get", "jobs", "42", "--json")), &d); err != nil || d.Fields["status"] != "running" || d.Versions["status"].Node != "solo" {
		t.Errorf("rows get --json: %+v %v", d, err)
	}

	c.ok(t, "rows", "put", "jobs", "42", "--delete", "note")
	if out := c.ok(t, "rows", "get", "jobs", "42"); strings.Contains(out, "note") {
		t.Errorf("rows get after --delete note: %q", out)
	}
	out = c.ok(t, "rows", "history", "jobs", "42", "status")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 3 || !strings.HasSuffix(lines[1], "running") || !strings.HasSuffix(lines[2], "queued") {
		t.Errorf("rows history: got %q, want a header, running, then queued", out)
	}
	if out := c.ok(t, "rows", "history", "jobs", "42", "note"); !strings.Contains(out, "(deleted)") {
		t.Errorf("rows history of a deleted field: %q", out)
	}
	_, _, err = c.run(t, "rows", "history", "jobs", "42", "never")
	if exitStatus(err) != exitNotFound {
		t.Errorf("rows history of a field never written: got %v, want exit 3", err)
	}

	for _, r := range []string{"a.1", "a.2", "b.1"} {
		c.ok(t, "rows", "put", "jobs", r, "n="+r)
	}
	out = c.ok(t, "rows", "list", "jobs", "--prefix", "a.")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 3 || !strings.HasPrefix(lines[1], "a.1  n=a.1") || !strings.HasPrefix(lines[2], "a.2") {
		t.Errorf("rows list --prefix a.: got %q", out)
	}
	out, errOut, err := c.run(t, "rows", "list", "jobs", "--limit", "2")
	if err != nil || strings.Count(out, "\n") != 3 || !strings.Contains(errOut, "more rows follow") {
		t.Errorf("rows list --limit 2: %v, stdout %q, stderr %q", err, out, errOut)
	}
	if out := c.ok(t, "rows", "list", "jobs", "--prefix", "zzz"); out != "no rows starting with zzz in table jobs\n" {
		t.Errorf("rows list of nothing: %q", out)
	}
	var l rows.ListDoc
	if err := json.Unmarshal([]byte(c.ok(t, "rows", "list", "jobs", "--json")), &l); err != nil || len(l.Rows) != 5 || l.More {
		t.Errorf("rows list --json: %+v %v", l, err)
	}

	if out := c.ok(t, "rows", "delete", "jobs", "42"); !strings.HasPrefix(out, "deleted jobs/42 on node solo") {
		t.Errorf("rows delete: %q", out)
	}
	// The node's refusals, each with its status.
	for _, tt := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"rows", "get", "jobs", "42"}, exitNotFound, "rows get jobs 42: no such row: 42 in table jobs"},
		{[]string{"rows", "delete", "jobs", "42"}, exitNotFound, "no such row"},
		{[]string{"rows", "get", "other", "1"}, exitNotFound, `no such table: "other" (meshbox mesh table add other makes it)`},
		{[]string{"rows", "watch", "other"}, exitNotFound, `rows watch other: no such table`},
		{[]string{"rows", "put", "jobs", "42", "a=" + strings.Repeat("x", 10<<10), "b=" + strings.Repeat("x", 10<<10),
			"c=" + strings.Repeat("x", 10<<10), "d=" + strings.Repeat("x", 10<<10), "e=" + strings.Repeat("x", 10<<10),
			"f=" + strings.Repeat("x", 10<<10), "g=" + strings.Repeat("x", 10<<10)}, 2, "bad input: a write of"},
	} {
		_, _, err := c.run(t, tt.args...)
		if err == nil || exitStatus(err) != tt.code || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("meshbox %s: got %v (exit %d), want exit %d saying %q", clip(strings.Join(tt.args, " "), 60), err, exitStatus(err), tt.code, tt.want)
		}
	}
}

func TestRowsLines(t *testing.T) {
	at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	d := rows.ChangedDoc{Table: "jobs", Row: "42", Fields: map[string]string{"status": "done", "note": "a, b"}, Deleted: []string{"worker"},
		Versions: map[string]rows.Version{
			"status": {Value: "done", Stamp: "2026-12-02T10:00:00.000Z+1", At: at, Node: "beta"},
			"note":   {Value: "a, b", Stamp: "2026-12-02T10:00:00.000Z+0", At: at, Node: "alpha"},
			"worker": {Deleted: true, Stamp: "2026-12-02T10:00:00.000Z+1", At: at, Node: "beta"},
		}}
	if got, want := changeLine(d), `42: note="a, b", status=done, worker deleted (by beta, stamp 2026-12-02T10:00:00.000Z+1)`; got != want {
		t.Errorf("changeLine:\ngot  %q\nwant %q", got, want)
	}
	for _, tt := range []struct {
		v      string
		inline bool
		want   string
	}{
		{"queued", false, "queued"},
		{"two words", false, "two words"},
		{"two words", true, `"two words"`},
		{"", false, `""`},
		{"line\nbreak", false, `"line\nbreak"`},
		{" padded", false, `" padded"`},
		{"\xff", false, `"\xff"`},
	} {
		if got := valueText(tt.v, tt.inline); got != tt.want {
			t.Errorf("valueText(%q, %v): got %s, want %s", tt.v, tt.inline, got, tt.want)
		}
	}
	line := tableLine(rows.TableStatus{Table: "jobs", Rows: 12, Pending: 1, Synced: true, Behind: 3, Gap: true,
		Refused: map[string]int{"future": 2}, Alarm: "stamp ... is 2m0s ahead of this node's clock"})
	for _, want := range []string{"jobs: 12 rows, 1 writes waiting", "reading its log (3 behind)", "GAP", "ALARM (2 future refused): stamp"} {
		if !strings.Contains(line, want) {
			t.Errorf("tableLine: %q lacks %q", line, want)
		}
	}
	if !strings.Contains(usageText(), "\n  rows ") {
		t.Errorf("meshbox help does not list rows:\n%s", usageText())
	}
}

// TestRowsCompletion: completion offers rows' commands and each one's
// own flags, and mesh table's.
func TestRowsCompletion(t *testing.T) {
	c := cli{env: map[string]string{}}
	for _, tt := range []struct {
		words []string
		want  []string
		not   []string
	}{
		{[]string{"rows"}, []string{"put", "get", "list", "watch", "delete", "history"}, nil},
		{[]string{"rows", "put"}, []string{"--delete", "--from", "--json", "--server", "--timeout"}, []string{"--prefix", "--count"}},
		{[]string{"rows", "list"}, []string{"--prefix", "--limit"}, []string{"--delete"}},
		{[]string{"rows", "watch"}, []string{"--count"}, nil},
		{[]string{"mesh", "table"}, []string{"add", "bind", "list"}, nil},
		{[]string{"mesh", "table", "add"}, []string{"--scope", "--broker-admin", "--db"}, nil},
		{[]string{"mesh", "scope", "bind"}, []string{"--table"}, nil},
	} {
		got := strings.Fields(c.ok(t, append([]string{"__complete"}, tt.words...)...))
		for _, w := range tt.want {
			if !contains(got, w) {
				t.Errorf("__complete %v: %v lacks %s", tt.words, got, w)
			}
		}
		for _, w := range tt.not {
			if contains(got, w) {
				t.Errorf("__complete %v: %v offers %s", tt.words, got, w)
			}
		}
	}
	if out := c.ok(t, "help", "rows"); !strings.Contains(out, "put TABLE ROW FIELD=VALUE...") {
		t.Errorf("help rows: %q", out)
	}
	if out := c.ok(t, "mesh", "help"); !strings.Contains(out, "table add TABLE [--scope S]") {
		t.Errorf("mesh help lacks the table commands:\n%s", out)
	}
}
