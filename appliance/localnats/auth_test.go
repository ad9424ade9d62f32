package localnats

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance/blobs"
	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/nats-io/nats.go"
)

// startAuthNATS runs the embedded server with local authentication as a
// node in a mesh has it (anonymous false) or a standalone one (true).
func startAuthNATS(t *testing.T, anonymous bool) (*Server, *localAuth) {
	t.Helper()
	auth, err := newLocalAuth(t.TempDir(), anonymous)
	if err != nil {
		t.Fatal(err)
	}
	n, err := startNATS("127.0.0.1:0", "alpha", "", blobs.DefaultMaxBytes, auth, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	return n, auth
}

// programConn connects as program p with its credential at creds.
func programConn(t *testing.T, url, creds string, p programs.Program, opts ...nats.Option) (*nats.Conn, <-chan error) {
	t.Helper()
	nk, err := nats.NkeyOptionFromSeed(creds)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 16)
	opts = append([]nats.Option{nk, nats.CustomInboxPrefix(p.InboxPrefix()), nats.NoReconnect(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errs <- err:
			default:
			}
		})}, opts...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("program %s: %v", p.Name, err)
	}
	t.Cleanup(nc.Close)
	return nc, errs
}

// violation waits for the server's permissions violation on errs.
func violation(t *testing.T, errs <-chan error, subject string) {
	t.Helper()
	select {
	case err := <-errs:
		if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), subject) {
			t.Fatalf("got %v, want a permissions violation for %s", err, subject)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("no permissions violation for %s", subject)
	}
}

func TestMeshNATSRefusesAnonymousAndLimitsPrograms(t *testing.T) {
	n, auth := startAuthNATS(t, false)
	if _, err := nats.Connect(n.URL(), nats.NoReconnect()); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("anonymous connection: got %v, want an authorization violation", err)
	}
	admin, err := n.Connect("test-admin")
	if err != nil {
		t.Fatalf("the node's own credential: %v", err)
	}
	defer admin.Close()

	p := programs.Program{Name: "echo", Host: []string{"echo"}}
	creds, err := auth.store.Put(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := auth.reload(n.srv, n.opts); err != nil {
		t.Fatal(err)
	}
	prog, errs := programConn(t, n.URL(), creds, p)
	if _, err := prog.Subscribe("cap.echo", func(m *nats.Msg) { _ = m.Respond(append([]byte("echo "), m.Data...)) }); err != nil {
		t.Fatal(err)
	}
	if err := prog.Flush(); err != nil {
		t.Fatal(err)
	}
	reply, err := admin.Request("cap.echo", []byte("hi"), 5*time.Second)
	if err != nil || string(reply.Data) != "echo hi" {
		t.Fatalf("call to the program: got %v %v, want echo hi (it may answer what it hosts)", reply, err)
	}
	for _, subj := range []string{"work.>", "_INBOX.>", "$MESH.status", "cap.other"} {
		if _, err := prog.Subscribe(subj, func(*nats.Msg) {}); err != nil {
			t.Fatal(err)
		}
		violation(t, errs, subj)
	}
	if err := prog.Publish("cmd.x", nil); err != nil {
		t.Fatal(err)
	}
	violation(t, errs, "cmd.x")

	// Removed: its connection is cut.
	closed := make(chan struct{})
	prog.SetClosedHandler(func(*nats.Conn) { close(closed) })
	if err := auth.store.Remove("echo"); err != nil {
		t.Fatal(err)
	}
	if _, err := auth.reload(n.srv, n.opts); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("a removed program stays connected")
	}
	if !admin.IsConnected() {
		t.Error("the node's own connection was cut by the reload")
	}
}

func TestProgramGetsNewPermissionsOnReload(t *testing.T) {
	n, auth := startAuthNATS(t, false)
	p := programs.Program{Name: "grow", Call: []string{"a"}}
	creds, err := auth.store.Put(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := auth.reload(n.srv, n.opts); err != nil {
		t.Fatal(err)
	}
	prog, errs := programConn(t, n.URL(), creds, p)
	if err := prog.Publish("evt.t", nil); err != nil {
		t.Fatal(err)
	}
	violation(t, errs, "evt.t")

	p.Publish = []string{"t"}
	if _, err := auth.store.Put(p); err != nil {
		t.Fatal(err)
	}
	if _, err := auth.reload(n.srv, n.opts); err != nil {
		t.Fatal(err)
	}
	admin, err := n.Connect("test-admin")
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	sub, err := admin.SubscribeSync("evt.t")
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := prog.Publish("evt.t", []byte("now")); err != nil {
		t.Fatal(err)
	}
	if m, err := sub.NextMsg(5 * time.Second); err != nil || string(m.Data) != "now" {
		t.Fatalf("event after the change: got %v %v, want now", m, err)
	}
}

func TestStandaloneNATSIsOpenButKeepsTheNodesSubjects(t *testing.T) {
	n, _ := startAuthNATS(t, true)
	errs := make(chan error, 4)
	nc, err := nats.Connect(n.URL(), nats.NoReconnect(), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatalf("anonymous connection to a standalone node: %v", err)
	}
	defer nc.Close()
	if _, err := nc.Subscribe("$MESH.status", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	violation(t, errs, "$MESH.status")
	if _, err := nc.Subscribe("cap.anything", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errs:
		t.Fatalf("anonymous host on a standalone node: %v", err)
	default:
	}
}

func TestLocalAuthReportsBadProgramAndKeepsTheOthers(t *testing.T) {
	n, auth := startAuthNATS(t, false)
	if _, err := auth.store.Put(programs.Program{Name: "good"}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(auth.store.Dir(), "bad.json"), []byte(`{"name":"bad"`), 0o600); err != nil {
		t.Fatal(err)
	}
	rep, err := auth.reload(n.srv, n.opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Programs) != 1 || rep.Programs[0] != "good" {
		t.Errorf("programs: got %v, want [good]", rep.Programs)
	}
	if len(rep.Errors) != 1 || !strings.Contains(rep.Errors[0], "bad.json") {
		t.Errorf("errors: got %v, want one naming bad.json", rep.Errors)
	}
}
