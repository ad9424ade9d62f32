package e2e

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// TestRowsPutManyRights: a batch put is a write. A program with --read
// jobs only is refused putmany by the server (a permissions violation)
// and writes nothing; the control, a program with --write jobs, writes
// the same batch, and both its rows are there for the reader to get.
func TestRowsPutManyRights(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, RabbitMQ and a node")
	}
	t.Parallel()
	p, _ := rpNode(t, "jobs")
	reader := programs.Program{Name: "reader", Read: []string{"jobs"}}
	writer := programs.Program{Name: "writer", Write: []string{"jobs"}}
	viol := map[string]violations{}
	conns := map[string]*nats.Conn{}
	for _, prog := range []programs.Program{reader, writer} {
		viol[prog.Name] = make(violations, 16)
		creds := meshtest.AddProgram(t, p.NATSURL(), p.DataDir(), prog)
		conns[prog.Name] = meshtest.ProgramConn(t, p.NATSURL(), creds, prog, nats.NoReconnect(), viol[prog.Name].handler())
	}
	rc, wc := conns["reader"], conns["writer"]
	batch := rows.Request{Rows: []rows.RowPut{
		{Row: "b1", Set: map[string]string{"status": "queued"}},
		{Row: "b2", Set: map[string]string{"status": "queued"}},
	}}

	if err := rc.PublishRequest(rows.Subject("jobs", rows.OpPutMany), rc.NewRespInbox(), []byte(`{"rows":[{"row":"b1","set":{"status":"forged"}},{"row":"b2","set":{"status":"forged"}}]}`)); err != nil {
		t.Fatal(err)
	}
	viol["reader"].refused(t, rows.Subject("jobs", rows.OpPutMany))
	for _, row := range []string{"b1", "b2"} {
		if err := rpCall(rc, "jobs", rows.OpGet, rows.Request{Row: row}, nil); err == nil || err.Error()[:3] != "404" {
			t.Fatalf("reader gets %s after its refused putmany: %v, want 404", row, err)
		}
	}

	var w rows.WrittenRows
	rpMust(t, wc, "jobs", rows.OpPutMany, batch, &w)
	if len(w.Rows) != 2 || w.Rows[0].Row != "b1" || w.Rows[1].Row != "b2" || w.Node != "alpha" {
		t.Fatalf("writer's putmany: %+v, want b1 and b2 written on alpha", w)
	}
	for _, row := range []string{"b1", "b2"} {
		var d rows.RowDoc
		rpMust(t, rc, "jobs", rows.OpGet, rows.Request{Row: row}, &d)
		if d.Fields["status"] != "queued" {
			t.Fatalf("reader gets %s: %+v, want status queued", row, d)
		}
	}
	viol["writer"].none(t, "the writer's putmany")
	viol["reader"].none(t, "the reader's gets")
}
