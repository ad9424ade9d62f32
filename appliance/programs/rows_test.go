package programs

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/nats-io/nats-server/v2/server"
)

// TestRowsPermissions: --read gives publish on the read operations of the
// table and subscribe on its changes; --write publish on the write
// operations only (put, putmany, delete); neither reaches another table, the changes' subjects
// as a publisher, or the node's other $MESH subjects.
func TestRowsPermissions(t *testing.T) {
	for _, tt := range []struct {
		name     string
		p        Program
		pub, sub []string
	}{
		{"read", Program{Name: "reader", Read: []string{"jobs"}},
			[]string{"$MESH.rows.jobs.get", "$MESH.rows.jobs.history", "$MESH.rows.jobs.list"},
			[]string{"$MESH.rows.jobs.changed.>", "_INBOX.reader.>"}},
		{"write", Program{Name: "writer", Write: []string{"jobs"}},
			[]string{"$MESH.rows.jobs.delete", "$MESH.rows.jobs.put", "$MESH.rows.jobs.putmany"},
			[]string{"_INBOX.writer.>"}},
		{"read and write", Program{Name: "worker", Read: []string{"tasks"}, Write: []string{"tasks"}},
			[]string{"$MESH.rows.tasks.delete", "$MESH.rows.tasks.get", "$MESH.rows.tasks.history", "$MESH.rows.tasks.list", "$MESH.rows.tasks.put", "$MESH.rows.tasks.putmany"},
			[]string{"$MESH.rows.tasks.changed.>", "_INBOX.worker.>"}},
		{"two tables read, one written", Program{Name: "p", Read: []string{"b", "a"}, Write: []string{"a"}},
			[]string{"$MESH.rows.a.delete", "$MESH.rows.a.get", "$MESH.rows.a.history", "$MESH.rows.a.list", "$MESH.rows.a.put", "$MESH.rows.a.putmany",
				"$MESH.rows.b.get", "$MESH.rows.b.history", "$MESH.rows.b.list"},
			[]string{"$MESH.rows.a.changed.>", "$MESH.rows.b.changed.>", "_INBOX.p.>"}},
		{"every table", Program{Name: "all", Read: []string{"*"}, Write: []string{"*"}},
			[]string{"$MESH.rows.*.delete", "$MESH.rows.*.get", "$MESH.rows.*.history", "$MESH.rows.*.list", "$MESH.rows.*.put", "$MESH.rows.*.putmany"},
			[]string{"$MESH.rows.*.changed.>", "_INBOX.all.>"}},
		{"none", Program{Name: "none", Call: []string{"echo"}},
			[]string{"cap.echo", "node.*.cap.echo"},
			[]string{"_INBOX.none.>"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			perms := tt.p.Permissions()
			if !slices.Equal(perms.Publish.Allow, tt.pub) {
				t.Errorf("publish: got %v, want %v", perms.Publish.Allow, tt.pub)
			}
			if !slices.Equal(perms.Subscribe.Allow, tt.sub) {
				t.Errorf("subscribe: got %v, want %v", perms.Subscribe.Allow, tt.sub)
			}
			if perms.Response != nil || perms.Publish.Deny != nil || perms.Subscribe.Deny != nil {
				t.Errorf("got responses %+v, publish deny %v, subscribe deny %v; want none", perms.Response, perms.Publish.Deny, perms.Subscribe.Deny)
			}
		})
	}
}

// TestRowsPermissionsMatch checks the lists the way the NATS server reads
// them: what a reader, a writer and a program without tables may publish
// and subscribe to, subject by subject.
func TestRowsPermissionsMatch(t *testing.T) {
	reader := Program{Name: "reader", Read: []string{"jobs"}}.Permissions()
	writer := Program{Name: "writer", Write: []string{"jobs"}}.Permissions()
	every := Program{Name: "all", Read: []string{"*"}}.Permissions()
	none := Program{Name: "none", Publish: []string{"door.opened"}, Subscribe: []string{">"}}.Permissions()
	allows := func(list []string, subj string) bool {
		for _, p := range list {
			if server.SubjectMatchesFilter(subj, p) {
				return true
			}
		}
		return false
	}
	for _, c := range []struct {
		who   string
		perms *server.Permissions
		pub   bool // publish, else subscribe
		subj  string
		want  bool
	}{
		{"reader", reader, true, rows.Subject("jobs", rows.OpGet), true},
		{"reader", reader, true, rows.Subject("jobs", rows.OpList), true},
		{"reader", reader, true, rows.Subject("jobs", rows.OpHistory), true},
		{"reader", reader, true, rows.Subject("jobs", rows.OpPut), false},
		{"reader", reader, true, rows.Subject("jobs", rows.OpPutMany), false},
		{"reader", reader, true, rows.Subject("jobs", rows.OpDelete), false},
		{"reader", reader, true, rows.Subject("other", rows.OpGet), false},
		{"reader", reader, true, rows.ChangedSubject("jobs", "j1"), false}, // forging a change
		{"reader", reader, true, "$MESH.status", false},
		{"reader", reader, true, "_INBOX.reader.x", false}, // answers no one
		{"reader", reader, false, rows.ChangedSubject("jobs", "j1"), true},
		{"reader", reader, false, rows.ChangedSubject("jobs", "a.b.c"), true}, // row keys may hold dots
		{"reader", reader, false, rows.ChangedSubject("other", "j1"), false},
		{"reader", reader, false, rows.Subject("jobs", rows.OpPut), false}, // another's writes
		{"reader", reader, false, rows.Subject("jobs", rows.OpGet), false},
		{"writer", writer, true, rows.Subject("jobs", rows.OpPut), true},
		{"writer", writer, true, rows.Subject("jobs", rows.OpPutMany), true},
		{"writer", writer, true, rows.Subject("other", rows.OpPutMany), false},
		{"writer", writer, true, rows.Subject("jobs", rows.OpDelete), true},
		{"writer", writer, true, rows.Subject("jobs", rows.OpGet), false},
		{"writer", writer, true, rows.Subject("other", rows.OpPut), false},
		{"writer", writer, false, rows.ChangedSubject("jobs", "j1"), false},
		{"every table", every, true, rows.Subject("anything", rows.OpList), true},
		{"every table", every, true, rows.Subject("anything", rows.OpPut), false},
		{"every table", every, false, rows.ChangedSubject("anything", "r"), true},
		{"no tables", none, true, rows.Subject("jobs", rows.OpGet), false},
		{"no tables", none, true, rows.Subject("jobs", rows.OpPut), false},
		// evt.> is what it subscribes, not $MESH: "subscribe >" is a topic
		// pattern under evt.
		{"no tables", none, false, rows.ChangedSubject("jobs", "j1"), false},
	} {
		list := c.perms.Subscribe.Allow
		verb := "subscribe"
		if c.pub {
			list, verb = c.perms.Publish.Allow, "publish"
		}
		if got := allows(list, c.subj); got != c.want {
			t.Errorf("%s may %s %s: got %v, want %v (lists %v)", c.who, verb, c.subj, got, c.want, list)
		}
	}
}

// TestValidateTables: --read and --write take table names (the rule of
// rows.ValidTable) or * alone; a NATS wildcard, a dot or an upper-case
// letter would reach other subjects or other tables.
func TestValidateTables(t *testing.T) {
	for _, tt := range []struct {
		name string
		p    Program
		want string // "" valid, else a piece of the error
	}{
		{"read", Program{Name: "p", Read: []string{"jobs"}}, ""},
		{"write", Program{Name: "p", Write: []string{"jobs", "tasks_2", "a-b", "0"}}, ""},
		{"every table", Program{Name: "p", Read: []string{"*"}, Write: []string{"*"}}, ""},
		{"longest name", Program{Name: "p", Read: []string{strings.Repeat("t", rows.MaxTableLen)}}, ""},
		{"too long", Program{Name: "p", Read: []string{strings.Repeat("t", rows.MaxTableLen+1)}}, "read"},
		{"empty", Program{Name: "p", Read: []string{""}}, "read"},
		{"gt", Program{Name: "p", Read: []string{">"}}, "read"},
		{"gt write", Program{Name: "p", Write: []string{">"}}, "write"},
		{"star in a name", Program{Name: "p", Write: []string{"jobs*"}}, "write"},
		{"dotted", Program{Name: "p", Read: []string{"jobs.put"}}, "read"},
		{"dotted wildcard", Program{Name: "p", Write: []string{"*.put"}}, "write"},
		{"upper case", Program{Name: "p", Read: []string{"Jobs"}}, "read"},
		{"leading dash", Program{Name: "p", Write: []string{"-jobs"}}, "write"},
		{"space", Program{Name: "p", Read: []string{"my jobs"}}, "read"},
		{"one bad among good", Program{Name: "p", Read: []string{"jobs", "a..b"}}, "read"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("got %v, want valid", err)
			case tt.want != "" && err == nil:
				t.Fatalf("got valid, want an error with %q", tt.want)
			case tt.want != "" && (!strings.Contains(err.Error(), tt.want) || !errors.Is(err, ErrInvalid) || !errors.Is(err, rows.ErrBadInput)):
				t.Fatalf("got %v, want ErrInvalid (and rows.ErrBadInput) with %q", err, tt.want)
			}
		})
	}
}

// TestStorePutNormalizesTables: the tables are stored sorted and once,
// like the other lists, so that a definition is stored one way.
func TestStorePutNormalizesTables(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "programs"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(Program{Name: "w", Read: []string{"tasks", "jobs", "tasks"}, Write: []string{"jobs", "jobs"}}); err != nil {
		t.Fatal(err)
	}
	p, err := s.Get("w")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.Read, []string{"jobs", "tasks"}) || !slices.Equal(p.Write, []string{"jobs"}) {
		t.Errorf("stored read %v write %v, want [jobs tasks] and [jobs]", p.Read, p.Write)
	}
	if _, err := s.Put(Program{Name: "bad", Write: []string{"a.b"}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("put with table a.b: got %v, want ErrInvalid", err)
	}
	if _, err := s.Get("bad"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a refused definition: get gives %v, want ErrNotFound (nothing stored)", err)
	}
}
