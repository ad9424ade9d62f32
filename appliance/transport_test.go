package appliance

import (
	"slices"
	"strings"
	"testing"

	"github.com/meshbox/meshbox/appliance/localnats"
	"github.com/meshbox/meshbox/appliance/programs"
)

func TestWeakTransport(t *testing.T) {
	for _, tt := range []struct {
		broker, db string
		want       []string // a piece of each problem, in order
	}{
		{"", "", nil},
		{"amqp://127.0.0.1:5672/", "postgres://u@127.0.0.1/db?sslmode=disable", nil},
		{"amqp://[::1]:5672/", "postgres://u@localhost/db", nil},
		{"amqps://broker.example.org/mesh", "postgres://u@db.example.org/mesh?sslmode=verify-full", nil},
		{"amqp://u:p@broker.example.org/mesh", "", []string{"broker.example.org is not encrypted"}},
		{"amqp://192.168.1.10/", "", []string{"192.168.1.10 is not encrypted"}},
		{"", "postgres://u@db.example.org/mesh?sslmode=verify-ca", []string{"sslmode verify-ca"}},
		{"", "postgres://u@db.example.org/mesh", []string{"sslmode prefer (the default)"}},
		{"", "postgres:///mesh?host=db.example.org&sslmode=require", []string{"db.example.org has sslmode require"}},
		{"", "postgres:///mesh?host=/run/postgresql", nil},
		{"amqp://b.example/", "postgres://u@d.example/db", []string{"b.example", "d.example"}},
		{"amqps://a.example/m,amqp://b.example/m", "", []string{"b.example is not encrypted"}},
	} {
		got := WeakTransport(tt.broker, tt.db)
		if len(got) != len(tt.want) {
			t.Errorf("broker %q db %q: got %q, want %d problems", tt.broker, tt.db, got, len(tt.want))
			continue
		}
		for i, w := range tt.want {
			if !strings.Contains(got[i], w) {
				t.Errorf("broker %q db %q: problem %q, want it to say %q", tt.broker, tt.db, got[i], w)
			}
		}
	}
}

// A standalone node is open, says so in its status as a note (it logs it
// at INFO: a standalone node is open by design, so it is no warning), and
// lists its programs; it has no problems, and its warnings hold no weak
// link (it has none).
func TestStandaloneStatusWarnsOpenNATS(t *testing.T) {
	dir := t.TempDir()
	store, err := programs.Open(programs.Dir(dir))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Put(programs.Program{Name: "early"}); err != nil {
		t.Fatal(err)
	}
	a := startNode(t, "alpha", dir)
	st := a.Status()
	if st.NATS.Auth != AuthOpen || !slices.Contains(st.Notes, localnats.WarnOpen) || slices.Contains(st.Warnings, localnats.WarnOpen) {
		t.Errorf("standalone status: auth %q notes %q warnings %q, want open, and it in the notes, not the warnings", st.NATS.Auth, st.Notes, st.Warnings)
	}
	if !st.Standalone || len(st.Problems) != 0 {
		t.Errorf("standalone status: standalone %v problems %q, want standalone without problems", st.Standalone, st.Problems)
	}
	for _, e := range st.Errors {
		if strings.Contains(e.Message, "local NATS server is open") {
			t.Errorf("standalone status: the open NATS server among the logged warnings and errors: %+v", e)
		}
	}
	if !slices.Equal(st.NATS.Programs, []string{"early"}) {
		t.Errorf("programs: got %v, want [early] (defined before start)", st.NATS.Programs)
	}
	if _, err := a.PutProgram(programs.Program{Name: "later", Call: []string{"x"}}); err != nil {
		t.Fatal(err)
	}
	if got := a.Status().NATS.Programs; !slices.Equal(got, []string{"early", "later"}) {
		t.Errorf("programs after PutProgram: got %v, want [early later]", got)
	}
	if err := a.RemoveProgram("early"); err != nil {
		t.Fatal(err)
	}
	if got := a.Status().NATS.Programs; !slices.Equal(got, []string{"later"}) {
		t.Errorf("programs after RemoveProgram: got %v, want [later]", got)
	}
}
