package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/nats-io/nats.go"
)

// rpNode starts a one-node mesh (alpha, on the real broker and database)
// whose settings define the tables named, and returns once the node
// reads each table's log and holds the mesh's key (it seals writes).
func rpNode(t *testing.T, tables ...string) (*meshtest.Process, string) {
	t.Helper()
	meshtest.Binary(t) // built before cli's timeout starts
	vhost := meshtest.RabbitMQ(t).Vhost(t)
	db := meshtest.Postgres(t).Database(t)
	if code, _, errOut := cli(t, "init", "--db", db, "--node", "alpha", "--broker", meshtest.NoCredential(vhost)); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	for _, tb := range tables {
		mesh(t, db, "setting", "set", appliance.TableSettingPrefix+tb, "{}")
	}
	p := meshtest.StartProcess(t, "--node", "alpha", "--db", db)
	waitKeysInStep(t, p)
	meshtest.WaitStatus(t, p.HTTPURL(), 30*time.Second, "tables "+strings.Join(tables, ", ")+" synced", func(s appliance.Status) bool {
		synced := 0
		for _, ts := range s.Rows {
			if slices.Contains(tables, ts.Table) && ts.Synced {
				synced++
			}
		}
		return synced == len(tables)
	})
	return p, db
}

// rpCall makes one request of the rows API and decodes its answer into
// out (when not nil); an error answer comes back as "code: text".
func rpCall(nc *nats.Conn, table, op string, req rows.Request, out any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	m, err := nc.Request(rows.Subject(table, op), body, 10*time.Second)
	if err != nil {
		return err
	}
	if code := m.Header.Get("Nats-Service-Error-Code"); code != "" {
		return fmt.Errorf("%s: %s", code, m.Header.Get("Nats-Service-Error"))
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(m.Data, out)
}

// rpMust is rpCall failing the test on an error.
func rpMust(t *testing.T, nc *nats.Conn, table, op string, req rows.Request, out any) {
	t.Helper()
	if err := rpCall(nc, table, op, req, out); err != nil {
		t.Fatalf("%s %s %+v: %v", table, op, req, err)
	}
}

// violations collects a connection's asynchronous errors (the server's
// permissions violations) for refusedBy.
type violations chan error

func (v violations) handler() nats.Option {
	return nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case v <- err:
		default:
		}
	})
}

// refused waits for the server's permissions violation on subject.
func (v violations) refused(t *testing.T, subject string) {
	t.Helper()
	select {
	case err := <-v:
		if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), `"`+subject+`"`) {
			t.Fatalf("got %v, want the permissions violation for %s", err, subject)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no permissions violation within 10s", subject)
	}
}

// none checks that no violation came.
func (v violations) none(t *testing.T, who string) {
	t.Helper()
	select {
	case err := <-v:
		t.Errorf("%s: got %v, want no permissions violation", who, err)
	default:
	}
}

// TestRowsProgramRights runs the rows API on a mesh node for programs
// with and without table rights: --read jobs may get, list, read the
// history of and watch jobs, but its put and delete are the server's
// permissions violations and write nothing, and table other it can
// neither read nor watch (nor forge a change of jobs); --write jobs may
// put (and not read); a program with no table rights can do nothing with
// rows. Each refusal has its control: the party with the right succeeds.
func TestRowsProgramRights(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, RabbitMQ and a node")
	}
	t.Parallel()
	p, _ := rpNode(t, "jobs", "other")
	admin := p.Connect(t)

	reader := programs.Program{Name: "reader", Read: []string{"jobs"}}
	writer := programs.Program{Name: "writer", Write: []string{"jobs"}}
	// Rights elsewhere, none on tables: it may receive events of every
	// topic and publish door.opened.
	norows := programs.Program{Name: "norows", Publish: []string{"door.opened"}, Subscribe: []string{">"}}
	viol := map[string]violations{}
	conns := map[string]*nats.Conn{}
	for _, prog := range []programs.Program{reader, writer, norows} {
		viol[prog.Name] = make(violations, 64)
		creds := meshtest.AddProgram(t, p.NATSURL(), p.DataDir(), prog)
		conns[prog.Name] = meshtest.ProgramConn(t, p.NATSURL(), creds, prog, nats.NoReconnect(), viol[prog.Name].handler())
	}
	rc, wc, nc := conns["reader"], conns["writer"], conns["norows"]

	rpMust(t, admin, "jobs", rows.OpPut, rows.Request{Row: "j1", Set: map[string]string{"status": "queued"}}, nil)
	rpMust(t, admin, "other", rows.OpPut, rows.Request{Row: "o1", Set: map[string]string{"secret": "s1"}}, nil)
	// Everything the node publishes on the tables' changes, as the admin
	// sees it.
	changes, err := admin.SubscribeSync(rows.ChangedSubject("*", ">"))
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Flush(); err != nil {
		t.Fatal(err)
	}

	// The reader: get, list, history and watch (the controls).
	var row rows.RowDoc
	rpMust(t, rc, "jobs", rows.OpGet, rows.Request{Row: "j1"}, &row)
	if row.Fields["status"] != "queued" || row.Versions["status"].Node != "alpha" {
		t.Fatalf("reader gets j1: %+v, want status queued written by alpha", row)
	}
	var list rows.ListDoc
	rpMust(t, rc, "jobs", rows.OpList, rows.Request{}, &list)
	if len(list.Rows) != 1 || list.Rows[0].Row != "j1" || list.More {
		t.Fatalf("reader lists jobs: %+v, want j1 alone", list)
	}
	var hist rows.HistoryDoc
	rpMust(t, rc, "jobs", rows.OpHistory, rows.Request{Row: "j1", Field: "status"}, &hist)
	if len(hist.Versions) != 1 || hist.Versions[0].Value != "queued" {
		t.Fatalf("reader reads j1's history: %+v, want the one version queued", hist)
	}
	watch, err := rc.SubscribeSync(rows.ChangedSubject("jobs", ">"))
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Flush(); err != nil {
		t.Fatal(err)
	}
	rpMust(t, wc, "jobs", rows.OpPut, rows.Request{Row: "j1", Set: map[string]string{"status": "running"}}, nil) // the writer may put
	m, err := watch.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("reader watches jobs: %v", err)
	}
	var ch rows.ChangedDoc
	if err := json.Unmarshal(m.Data, &ch); err != nil || ch.Row != "j1" || ch.Fields["status"] != "running" {
		t.Fatalf("reader's change of j1: %s (%v), want status running", m.Data, err)
	}
	if m, err := changes.NextMsg(10 * time.Second); err != nil || m.Subject != rows.ChangedSubject("jobs", "j1") {
		t.Fatalf("admin's change of j1: %v %v", m, err)
	}
	viol["reader"].none(t, "the reader's rights")
	viol["writer"].none(t, "the writer's put")

	// The reader's writes: the server refuses them, nothing is written.
	if err := rc.PublishRequest(rows.Subject("jobs", rows.OpPut), rc.NewRespInbox(), []byte(`{"row":"j1","set":{"status":"forged"}}`)); err != nil {
		t.Fatal(err)
	}
	viol["reader"].refused(t, rows.Subject("jobs", rows.OpPut))
	if err := rc.PublishRequest(rows.Subject("jobs", rows.OpDelete), rc.NewRespInbox(), []byte(`{"row":"j1"}`)); err != nil {
		t.Fatal(err)
	}
	viol["reader"].refused(t, rows.Subject("jobs", rows.OpDelete))
	// Nor may it forge a change, or read or watch another table.
	if err := rc.Publish(rows.ChangedSubject("jobs", "j1"), []byte(`{"table":"jobs","row":"j1","fields":{"status":"forged"}}`)); err != nil {
		t.Fatal(err)
	}
	viol["reader"].refused(t, rows.ChangedSubject("jobs", "j1"))
	for _, op := range []string{rows.OpGet, rows.OpList, rows.OpHistory, rows.OpPut} {
		if err := rc.PublishRequest(rows.Subject("other", op), rc.NewRespInbox(), []byte(`{"row":"o1","field":"secret"}`)); err != nil {
			t.Fatal(err)
		}
		viol["reader"].refused(t, rows.Subject("other", op))
	}
	var leaked []*nats.Subscription
	for _, subj := range []string{rows.ChangedSubject("other", ">"), rows.ChangedSubject("*", ">"), "$MESH.rows.>", "$MESH.>", rows.Subject("jobs", rows.OpPut)} {
		s, err := rc.SubscribeSync(subj)
		if err != nil {
			t.Fatal(err)
		}
		viol["reader"].refused(t, subj)
		leaked = append(leaked, s)
	}
	rpMust(t, admin, "other", rows.OpPut, rows.Request{Row: "o1", Set: map[string]string{"secret": "s2"}}, nil)
	rpMust(t, wc, "jobs", rows.OpPut, rows.Request{Row: "j2", Set: map[string]string{"status": "queued"}}, nil)
	// Control: the admin sees both changes, the reader only jobs' (its
	// subscription on jobs is in order: once j2's change is there, other's
	// would have been, on a subscription the server had let through).
	for _, want := range []string{rows.ChangedSubject("other", "o1"), rows.ChangedSubject("jobs", "j2")} {
		if m, err := changes.NextMsg(10 * time.Second); err != nil || m.Subject != want {
			t.Fatalf("admin's change: got %v %v, want %s", m, err, want)
		}
	}
	if m, err := watch.NextMsg(10 * time.Second); err != nil || m.Subject != rows.ChangedSubject("jobs", "j2") {
		t.Fatalf("reader's change of j2: %v %v", m, err)
	}
	for _, s := range leaked {
		if m, err := s.NextMsg(200 * time.Millisecond); err == nil {
			t.Errorf("a refused subscription %s received %s %s", s.Subject, m.Subject, m.Data)
		}
	}
	var j1 rows.RowDoc
	rpMust(t, admin, "jobs", rows.OpGet, rows.Request{Row: "j1"}, &j1)
	if j1.Fields["status"] != "running" {
		t.Errorf("j1 after the reader's refused writes: %+v, want status running (the writer's)", j1.Fields)
	}
	var hj1 rows.HistoryDoc
	rpMust(t, admin, "jobs", rows.OpHistory, rows.Request{Row: "j1", Field: "status"}, &hj1)
	for _, v := range hj1.Versions {
		if v.Value == "forged" || v.Deleted {
			t.Errorf("j1's history holds a refused write: %+v", hj1.Versions)
		}
	}

	// The writer puts (above) but reads nothing.
	for _, op := range []string{rows.OpGet, rows.OpList} {
		if err := wc.PublishRequest(rows.Subject("jobs", op), wc.NewRespInbox(), []byte(`{"row":"j2"}`)); err != nil {
			t.Fatal(err)
		}
		viol["writer"].refused(t, rows.Subject("jobs", op))
	}
	if _, err := wc.SubscribeSync(rows.ChangedSubject("jobs", ">")); err != nil {
		t.Fatal(err)
	}
	viol["writer"].refused(t, rows.ChangedSubject("jobs", ">"))
	if err := wc.PublishRequest(rows.Subject("other", rows.OpPut), wc.NewRespInbox(), []byte(`{"row":"o1","set":{"secret":"forged"}}`)); err != nil {
		t.Fatal(err)
	}
	viol["writer"].refused(t, rows.Subject("other", rows.OpPut))

	// No table rights: nothing on rows, whatever the operation.
	for _, op := range []string{rows.OpGet, rows.OpList, rows.OpHistory, rows.OpPut, rows.OpDelete} {
		for _, tb := range []string{"jobs", "other"} {
			if err := nc.PublishRequest(rows.Subject(tb, op), nc.NewRespInbox(), []byte(`{"row":"j1","field":"status","set":{"status":"forged"}}`)); err != nil {
				t.Fatal(err)
			}
			viol["norows"].refused(t, rows.Subject(tb, op))
		}
	}
	for _, subj := range []string{rows.ChangedSubject("jobs", ">"), rows.ChangedSubject("jobs", "j1"), "$MESH.rows.>"} {
		if _, err := nc.SubscribeSync(subj); err != nil {
			t.Fatal(err)
		}
		viol["norows"].refused(t, subj)
	}
	// Its other rights still work (the control): it receives an event.
	evts, err := nc.SubscribeSync("evt.door.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Publish("evt.door.opened", []byte("front")); err != nil {
		t.Fatal(err)
	}
	if m, err := evts.NextMsg(10 * time.Second); err != nil || string(m.Data) != "front" {
		t.Fatalf("norows receives its event: %v %v", m, err)
	}

	// Nothing the refused requests named was written: other's o1 is the
	// admin's, and jobs holds j1 and j2 alone.
	var o1 rows.RowDoc
	rpMust(t, admin, "other", rows.OpGet, rows.Request{Row: "o1"}, &o1)
	if o1.Fields["secret"] != "s2" {
		t.Errorf("o1: %+v, want secret s2", o1.Fields)
	}
	rpMust(t, admin, "jobs", rows.OpList, rows.Request{}, &list)
	if len(list.Rows) != 2 || list.Rows[0].Row != "j1" || list.Rows[1].Row != "j2" || list.Rows[0].Fields["status"] != "running" {
		t.Errorf("jobs after the refusals: %+v, want j1 running and j2", list.Rows)
	}
	if m, err := changes.NextMsg(time.Second); err == nil {
		t.Errorf("a change was published after the refusals: %s %s", m.Subject, m.Data)
	}
}

// TestRowsProgramReplySubjects lets programs aim the node's answers
// where they may not receive: a get, a list, a history and a put whose
// reply subject is a command's (cmd.somestage), an event's (evt.x),
// another program's inbox (_INBOX.norows.x, _INBOX.reader.x for a put
// the reader may not send), the bare prefix of its own (_INBOX.worker)
// or a change's subject. The node answers none of them, acts on none
// (the puts write nothing and publish no change), and counts each
// refusal; the same requests on the program's own inbox are answered.
func TestRowsProgramReplySubjects(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, RabbitMQ and a node")
	}
	t.Parallel()
	p, _ := rpNode(t, "jobs")
	admin := p.Connect(t)

	worker := programs.Program{Name: "worker", Read: []string{"jobs"}, Write: []string{"jobs"}}
	reader := programs.Program{Name: "reader", Read: []string{"jobs"}}
	norows := programs.Program{Name: "norows", Subscribe: []string{"x"}}
	conns := map[string]*nats.Conn{}
	viol := map[string]violations{}
	for _, prog := range []programs.Program{worker, reader, norows} {
		viol[prog.Name] = make(violations, 16)
		creds := meshtest.AddProgram(t, p.NATSURL(), p.DataDir(), prog)
		conns[prog.Name] = meshtest.ProgramConn(t, p.NATSURL(), creds, prog, nats.NoReconnect(), viol[prog.Name].handler())
	}
	wc := conns["worker"]
	rpMust(t, admin, "jobs", rows.OpPut, rows.Request{Row: "j1", Set: map[string]string{"status": "queued"}}, nil)

	// Whatever lands where the attacks aim, seen by the admin (who may
	// subscribe anywhere) and by the programs whose subjects they are.
	landed := make(chan string, 64)
	count := func(who string) nats.MsgHandler {
		return func(m *nats.Msg) { landed <- who + ": " + m.Subject + " " + string(m.Data) }
	}
	for _, subj := range []string{"cmd.>", "evt.>", "_INBOX.norows.>", "_INBOX.reader.>", "_INBOX.worker", rows.ChangedSubject("jobs", ">")} {
		if _, err := admin.Subscribe(subj, count("admin")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conns["norows"].Subscribe("evt.x", count("norows")); err != nil {
		t.Fatal(err)
	}
	if _, err := conns["norows"].Subscribe("_INBOX.norows.>", count("norows")); err != nil {
		t.Fatal(err)
	}
	if _, err := conns["reader"].Subscribe("_INBOX.reader.>", count("reader")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*nats.Conn{admin, conns["norows"], conns["reader"]} {
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	refusedReplies := func() float64 {
		v, _ := scrape(t, p.HTTPURL()).value("meshbox_rows_errors_total", "kind=reply_refused")
		return v
	}
	before := refusedReplies()

	replies := []string{"cmd.somestage", "evt.x", "_INBOX.norows.x", "_INBOX.worker", rows.ChangedSubject("jobs", "j1")}
	type attack struct{ op, reply, body string }
	var attacks []attack
	for _, reply := range replies {
		attacks = append(attacks,
			attack{rows.OpGet, reply, `{"row":"j1"}`},
			attack{rows.OpList, reply, `{}`},
			attack{rows.OpHistory, reply, `{"row":"j1","field":"status"}`},
			attack{rows.OpPut, reply, `{"row":"forged","set":{"by":"` + reply + `"}}`},
			attack{rows.OpDelete, reply, `{"row":"j1"}`})
	}
	// The reader may read jobs, so its inbox may receive a get's answer;
	// it may not put, so it may not receive a put's.
	attacks = append(attacks, attack{rows.OpPut, "_INBOX.reader.x", `{"row":"forged","set":{"by":"reader"}}`},
		attack{rows.OpDelete, "_INBOX.reader.x", `{"row":"j1"}`})
	for _, a := range attacks {
		if err := wc.PublishRequest(rows.Subject("jobs", a.op), a.reply, []byte(a.body)); err != nil {
			t.Fatal(err)
		}
	}
	// Control, after the attacks on the same subscription of the node (it
	// handles them in order): its own inbox gets the answers.
	var row rows.RowDoc
	rpMust(t, wc, "jobs", rows.OpGet, rows.Request{Row: "j1"}, &row)
	if row.Fields["status"] != "queued" {
		t.Fatalf("control: worker gets j1: %+v, want status queued (not deleted)", row)
	}
	var w rows.Written
	rpMust(t, wc, "jobs", rows.OpPut, rows.Request{Row: "j1", Set: map[string]string{"claim": "worker"}}, &w)
	if w.Row != "j1" || w.Node != "alpha" || w.Stamp == "" {
		t.Fatalf("control: worker puts j1: %+v", w)
	}
	var hist rows.HistoryDoc
	rpMust(t, wc, "jobs", rows.OpHistory, rows.Request{Row: "j1", Field: "claim"}, &hist)
	if len(hist.Versions) != 1 || hist.Versions[0].Value != "worker" {
		t.Fatalf("control: worker reads j1's claim history: %+v", hist)
	}
	viol["worker"].none(t, "the worker")

	// The control's own change is the one thing published.
	select {
	case got := <-landed:
		if !strings.HasPrefix(got, "admin: "+rows.ChangedSubject("jobs", "j1")+" ") || !strings.Contains(got, `"fields":{"claim":"worker"}`) {
			t.Errorf("an attack landed: %s", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("control: the worker's put published no change")
	}
	deadline := time.After(2 * time.Second)
	for done := false; !done; {
		select {
		case got := <-landed:
			t.Errorf("an attack landed: %s", got)
		case <-deadline:
			done = true
		}
	}
	// The forged puts and deletes were not acted on.
	if err := rpCall(admin, "jobs", rows.OpGet, rows.Request{Row: "forged"}, nil); err == nil || !strings.HasPrefix(err.Error(), "404:") {
		t.Errorf("row forged: got %v, want 404 (never written)", err)
	}
	var list rows.ListDoc
	rpMust(t, admin, "jobs", rows.OpList, rows.Request{}, &list)
	if len(list.Rows) != 1 || list.Rows[0].Row != "j1" || list.Rows[0].Fields["status"] != "queued" {
		t.Errorf("jobs after the attacks: %+v, want j1 alone, queued", list.Rows)
	}
	if got, want := refusedReplies()-before, float64(len(attacks)); got != want {
		t.Errorf("meshbox_rows_errors_total{kind=reply_refused} grew by %v, want %v (one per attack)", got, want)
	}
	if n := logLines(p.Output(), "rows request refused", "subject="+rows.Subject("jobs", rows.OpPut)); n != 1 {
		t.Errorf("alpha logged the refused puts %d times, want once", n)
	}
}
