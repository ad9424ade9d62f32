package meshtest

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/nats-io/nats.go"
)

// A node in a mesh lets only clients with a credential onto its NATS
// server (see package programs). These helpers give a test the node's
// administrative connection, or a local program with the rights it names.

// DataDir returns the node's data directory (its --data; empty when the
// process was started without one, which StartProcess never does).
func (p *Process) DataDir() string {
	args := p.cmd.Args
	for i, a := range args {
		a = strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		if a == "data" && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, "data="); ok {
			return v
		}
	}
	return ""
}

// Connect opens an administrative connection to the node's NATS server
// (AdminConn), closed in cleanup.
func (p *Process) Connect(tb testing.TB, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	return AdminConn(tb, p.NATSURL(), p.DataDir(), opts...)
}

// AdminOption authenticates a NATS client with the administrative
// credential of the node whose data directory is dataDir (what the node's
// own clients and its CLI use: no limits).
func AdminOption(tb testing.TB, dataDir string) nats.Option {
	tb.Helper()
	key, err := programs.LoadKey(filepath.Join(dataDir, programs.AdminFile))
	if err != nil {
		tb.Fatalf("meshtest: admin credential: %v", err)
	}
	return nats.Nkey(key.Public(), key.Sign)
}

// AdminConn connects to the NATS server at url with the administrative
// credential in dataDir; closed in cleanup.
func AdminConn(tb testing.TB, url, dataDir string, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	nc, err := nats.Connect(url, append([]nats.Option{AdminOption(tb, dataDir)}, opts...)...)
	if err != nil {
		tb.Fatalf("meshtest: admin connection to %s: %v", url, err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// AddProgram defines program p on the node whose data directory is dataDir
// and whose NATS server is at url (running: it is told to apply it) and
// returns the path of the program's credential file.
func AddProgram(tb testing.TB, url, dataDir string, p programs.Program) string {
	tb.Helper()
	store, err := programs.Open(programs.Dir(dataDir))
	if err != nil {
		tb.Fatalf("meshtest: %v", err)
	}
	path, err := store.Put(p)
	if err != nil {
		tb.Fatalf("meshtest: add program %s: %v", p.Name, err)
	}
	nc := AdminConn(tb, url, dataDir)
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, appliance.SubjectReloadPrograms, nil)
	if err != nil {
		tb.Fatalf("meshtest: add program %s: the node did not reload: %v", p.Name, err)
	}
	var rep appliance.ProgramsReport
	if err := json.Unmarshal(msg.Data, &rep); err != nil || len(rep.Errors) > 0 {
		tb.Fatalf("meshtest: add program %s: reload: %s (%v)", p.Name, msg.Data, err)
	}
	return path
}

// ProgramConn connects to the NATS server at url as program p, with the
// credential file creds (from AddProgram) and the program's own inbox
// prefix; closed in cleanup.
func ProgramConn(tb testing.TB, url, creds string, p programs.Program, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	nk, err := nats.NkeyOptionFromSeed(creds)
	if err != nil {
		tb.Fatalf("meshtest: program %s: %v", p.Name, err)
	}
	nc, err := nats.Connect(url, append([]nats.Option{nk, nats.CustomInboxPrefix(p.InboxPrefix()), nats.Name(p.Name)}, opts...)...)
	if err != nil {
		tb.Fatalf("meshtest: program %s connects to %s: %v", p.Name, url, err)
	}
	tb.Cleanup(nc.Close)
	return nc
}
