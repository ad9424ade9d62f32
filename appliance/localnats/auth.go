package localnats

import (
	"fmt"
	"strings"
	"sync"

	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Who may connect to the embedded NATS server (see package programs):
//
//   - the node itself and its CLI, with the administrative nkey in the
//     data directory (programs.AdminFile), without limits;
//   - each local program, with its own nkey and permissions;
//   - clients without a credential ("anonymous"): always on a standalone
//     node, so that `meshbox run` needs no configuration, and in a mesh
//     only when the configuration says so (nats_anonymous). Either way the
//     status warns that the local NATS server is open. Anonymous clients
//     may do anything but subscribe to the node's own subjects ($MESH.>)
//     and make, change or delete JetStream streams (they may use the blob
//     store the node made).
//
// JetStream (the blob store) is reached through the JetStream API
// subjects like everything else, so a program's rights cover it: a
// program may use it only when its definition says blobs (package
// programs), and then only the blob store's stream.

// Auth modes of the embedded NATS server, as the status reports them.
const (
	AuthCredentials = "credentials" // every client needs a credential
	AuthOpen        = "open"        // clients without one are let in too
)

// WarnOpen is what the node says of an open server (AuthOpen): a
// warning in a mesh, a note on a standalone node.
const WarnOpen = "the local NATS server is open: programs without a credential can connect and do anything but take the node's own subjects"

// anonymousJSDeny are the JetStream API requests clients without a
// credential may not make: they could otherwise make a stream that
// captures the node's own subjects.
var anonymousJSDeny = []string{
	"$JS.API.STREAM.CREATE.>",
	"$JS.API.STREAM.UPDATE.>",
	"$JS.API.STREAM.DELETE.>",
	"$JS.API.STREAM.RESTORE.>",
}

// ProgramsReport is what the node knows of its programs after a (re)load:
// the answer to wire.SubjectReloadPrograms.
type ProgramsReport struct {
	Programs []string `json:"programs"`
	Errors   []string `json:"errors,omitempty"`
	// Reconnected names the programs whose MQTT devices the reload
	// disconnected, their subscribe rights changed (see reload).
	Reconnected []string `json:"reconnected,omitempty"`
}

// localAuth builds the embedded server's users. Its mutex serializes
// reloads.
type localAuth struct {
	admin     *programs.Key
	store     *programs.Store
	anonymous bool
	// mqttOffLoopback and wsOffLoopback say the MQTT and the WebSocket
	// listeners take clients from the network: then no client comes in
	// there without a credential, open node or not (anonymousTypes).
	mqttOffLoopback, wsOffLoopback bool
	// anonKey is the public nkey clients without a credential are taken
	// for (the server's no_auth_user); its seed was never kept: a client
	// becomes it by presenting no credential (or this public key), with
	// the rights of a client without one.
	anonKey string
	// responder signs in the node's responder connection, which may
	// publish on _INBOX.> and nothing else (rights.go); made at
	// start, never written down.
	responder    nkeys.KeyPair
	responderKey string // its public key
	// rights are the loaded programs' rights, for the checks of
	// rights.go.
	rights Rights

	// doorMu guards doorPass and mqttProgs, which the MQTT door reads
	// (mqttdoor.go). doorPass is each MQTT program's door password: the
	// server's password of its MQTT user, which only the door knows and
	// gives in place of the device's (checked against mqttProgs' hash);
	// it lasts as long as the process.
	doorMu    sync.Mutex
	doorPass  map[string]string
	mqttProgs map[string]doorProgram

	mu     sync.Mutex
	report ProgramsReport // the last load
	// mqttSubs is each MQTT program's subscribe allow list as the last
	// load gave it, joined: what a reload compares.
	mqttSubs map[string]string
}

// newLocalAuth loads (or makes) the administrative credential and opens
// the programs' store in dataDir.
func newLocalAuth(dataDir string, anonymous bool) (*localAuth, error) {
	admin, err := programs.EnsureAdmin(dataDir)
	if err != nil {
		return nil, err
	}
	store, err := programs.Open(programs.Dir(dataDir))
	if err != nil {
		return nil, err
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, fmt.Errorf("anonymous user: %w", err)
	}
	anonKey, err := kp.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("anonymous user: %w", err)
	}
	kp.Wipe()
	responder, err := nkeys.CreateUser()
	if err != nil {
		return nil, fmt.Errorf("responder user: %w", err)
	}
	responderKey, err := responder.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("responder user: %w", err)
	}
	return &localAuth{admin: admin, store: store, anonymous: anonymous, anonKey: anonKey,
		responder: responder, responderKey: responderKey}, nil
}

// mode is AuthOpen or AuthCredentials.
func (l *localAuth) mode() string {
	if l.anonymous {
		return AuthOpen
	}
	return AuthCredentials
}

// apply sets opts' users from the store as it is now and returns what it
// loaded. A program whose file is bad, or whose key another program
// already has, is left out and reported.
func (l *localAuth) apply(opts *server.Options) ProgramsReport {
	progs, errs := l.store.List()
	rep := ProgramsReport{Programs: []string{}}
	keys := map[string]string{l.admin.Public(): "the node's administrator"}
	l.mqttSubs = map[string]string{}
	opts.Nkeys = []*server.NkeyUser{{Nkey: l.admin.Public()}, {
		Nkey: l.responderKey,
		Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{responderAllow}},
			Subscribe: &server.SubjectPermission{Deny: []string{">"}},
		},
	}}
	var accepted []programs.Program
	var mqttUsers []*server.User
	l.doorMu.Lock()
	defer l.doorMu.Unlock()
	if l.doorPass == nil {
		l.doorPass = map[string]string{}
	}
	l.mqttProgs = map[string]doorProgram{}
	for _, p := range progs {
		if other, dup := keys[p.Key]; dup {
			errs = append(errs, fmt.Errorf("program %s: its key is %s's: left out", p.Name, other))
			continue
		}
		keys[p.Key] = "program " + p.Name
		opts.Nkeys = append(opts.Nkeys, &server.NkeyUser{Nkey: p.Key, Permissions: p.Permissions()})
		if p.MQTT && p.MQTTPassword != "" {
			// Its password opens the MQTT listener only: on the NATS and
			// WebSocket doors the program signs with its nkey.
			// It comes in through the node's door, which checks the
			// device's password and gives the server the program's door
			// password instead.
			perms := mqttPermissions(p)
			if l.doorPass[p.Name] == "" {
				l.doorPass[p.Name] = newDoorPassword()
			}
			l.mqttProgs[p.Name] = doorProgram{hash: p.MQTTPassword, doorPassword: l.doorPass[p.Name], limits: p.Limits()}
			mqttUsers = append(mqttUsers, &server.User{Username: p.Name, Password: l.doorPass[p.Name], Permissions: perms,
				AllowedConnectionTypes: map[string]struct{}{jwt.ConnectionTypeMqtt: {}}})
			l.mqttSubs[p.Name] = strings.Join(perms.Subscribe.Allow, "\n")
		}
		rep.Programs = append(rep.Programs, p.Name)
		accepted = append(accepted, p)
	}
	l.rights.set(accepted, l.anonymous)
	for _, err := range errs {
		rep.Errors = append(rep.Errors, err.Error())
	}
	opts.Users, opts.NoAuthUser = mqttUsers, ""
	if l.anonymous {
		opts.Nkeys = append(opts.Nkeys, &server.NkeyUser{
			Nkey:                   l.anonKey,
			AllowedConnectionTypes: l.anonymousTypes(),
			Permissions: &server.Permissions{
				// JetStream: the streams that exist (the blob store), no new
				// ones and no changes to them.
				Publish:   &server.SubjectPermission{Deny: anonymousJSDeny},
				Subscribe: &server.SubjectPermission{Deny: []string{wire.MeshSubjects}},
			},
		})
		opts.NoAuthUser = l.anonKey
	}
	l.report = rep
	return rep
}

// anonymousTypes are the kinds of connection a client without a
// credential may open on an open node: not those of a listener off
// loopback (MQTT, WebSocket), which takes clients from the network, where
// a device or a page signs in as a program, and never MQTT over
// WebSocket: MQTT comes in through the node's door alone (mqttdoor.go).
// The plain NATS port stays as configured (loopback by default).
func (l *localAuth) anonymousTypes() map[string]struct{} {
	types := map[string]struct{}{jwt.ConnectionTypeStandard: {}, jwt.ConnectionTypeInProcess: {}}
	if !l.mqttOffLoopback {
		types[jwt.ConnectionTypeMqtt] = struct{}{}
	}
	if !l.wsOffLoopback {
		types[jwt.ConnectionTypeWebsocket] = struct{}{}
	}
	return types
}

// doorProgram is what the MQTT door knows of an MQTT program: its
// password's bcrypt hash, its door password and its limits.
type doorProgram struct {
	hash, doorPassword string
	limits             programs.MQTTLimits
}

// mqttProgram is MQTT program name as the last load gave it.
func (l *localAuth) mqttProgram(name string) (doorProgram, bool) {
	l.doorMu.Lock()
	defer l.doorMu.Unlock()
	p, ok := l.mqttProgs[name]
	return p, ok
}

// mqttLimits are program's limits (clients without a credential: the
// defaults).
func (l *localAuth) mqttLimits(program string) programs.MQTTLimits {
	if p, ok := l.mqttProgram(program); ok {
		return p.limits
	}
	return programs.DefaultMQTTLimits
}

// knownProgram reports whether program may hold MQTT sessions now.
func (l *localAuth) knownProgram(program string) bool {
	if program == Anonymous {
		return l.anonymous
	}
	_, ok := l.mqttProgram(program)
	return ok
}

// reload applies the store as it is now to the running server srv, whose
// options at start were base.
func (l *localAuth) reload(srv *server.Server, base *server.Options) (ProgramsReport, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	opts := base.Clone()
	before := l.mqttSubs
	rep := l.apply(opts)
	if err := srv.ReloadOptions(opts); err != nil {
		return rep, fmt.Errorf("reload programs: %w", err)
	}
	// The server applies a program's new rights to its connections, but
	// an MQTT device's QoS 1 subscriptions are delivered through the
	// server's own subscriptions, which it does not check again: a
	// device whose subscribe rights shrank would go on receiving what
	// they no longer grant. Its connections are closed; the device
	// reconnects (devices do) under its new rights.
	for name, subs := range before {
		if now, ok := l.mqttSubs[name]; !ok || now == subs {
			continue // removed (the server closed its connections) or unchanged
		}
		if n := disconnectMQTT(srv, name); n > 0 {
			rep.Reconnected = append(rep.Reconnected, name)
		}
	}
	l.report = rep
	return rep, nil
}

// disconnectMQTT closes the MQTT connections signed in as program name
// and returns how many it closed. (Connz fails only on sort, state and
// subject-filter options, which these are not.)
func disconnectMQTT(srv *server.Server, name string) int {
	cz, err := srv.Connz(&server.ConnzOptions{User: name, Limit: 1 << 16})
	if err != nil {
		return 0
	}
	n := 0
	for _, c := range cz.Conns {
		if c.Type == "mqtt" && srv.DisconnectClientByID(c.Cid) == nil {
			n++
		}
	}
	return n
}

// lastReport is what the last load found.
func (l *localAuth) lastReport() ProgramsReport {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.report
}

// connOption authenticates one of the node's own connections.
func (l *localAuth) connOption() nats.Option { return nats.Nkey(l.admin.Public(), l.admin.Sign) }

// responderOption authenticates the node's responder connection.
func (l *localAuth) responderOption() nats.Option {
	return nats.Nkey(l.responderKey, l.responder.Sign)
}

// mqttPermissions are program p's rights on the MQTT listener: its own,
// and for each subject it may subscribe to that ends in ">", the subject
// above it too. MQTT's multi-level wildcard matches its parent level
// (home/# is home and everything under it), so the server subscribes a
// device to both, and refuses the whole subscription when one is not
// allowed: a device with the right to evt.home.> gets evt/home/# as it
// expects, and the parent topic itself with it.
func mqttPermissions(p programs.Program) *server.Permissions {
	perms := p.Permissions()
	sub := perms.Subscribe.Allow
	for _, s := range sub {
		if parent, ok := strings.CutSuffix(s, ".>"); ok && !strings.HasSuffix(parent, "*") && parent != "_INBOX."+p.Name {
			sub = append(sub, parent)
		}
	}
	perms.Subscribe.Allow = sub
	return perms
}

// Reload reads the programs' definitions again and applies them to the
// running server: new programs may connect, changed ones get their new
// permissions, removed ones are disconnected.
func (n *Server) Reload() (ProgramsReport, error) { return n.auth.reload(n.srv, n.opts) }

// PutProgram creates or changes program p in the programs' store and
// returns the path of its credential file; Reload applies it.
func (n *Server) PutProgram(p programs.Program) (credsPath string, err error) {
	return n.auth.store.Put(p)
}

// RemoveProgram deletes program name from the programs' store; Reload
// disconnects its clients.
func (n *Server) RemoveProgram(name string) error { return n.auth.store.Remove(name) }

// Programs is what the last load of the programs found.
func (n *Server) Programs() ProgramsReport { return n.auth.lastReport() }

// AuthMode is AuthOpen or AuthCredentials.
func (n *Server) AuthMode() string { return n.auth.mode() }

// Anonymous reports whether clients without a credential are let in.
func (n *Server) Anonymous() bool { return n.auth.anonymous }

// Rights answers the questions of the node's parts about what local
// clients may do (rights.go).
func (n *Server) Rights() *Rights { return &n.auth.rights }

// WebSocketURL is the WebSocket listener's URL (ws:// or wss://), ""
// without one.
func (n *Server) WebSocketURL() string { return n.wsURL }

// MQTTURL is the MQTT listener's URL (mqtt:// or mqtts://), "" without
// one; MQTTPlain reports whether it is off loopback without TLS.
func (n *Server) MQTTURL() string { return n.mqttURL }

// MQTTPlain reports whether the MQTT listener is off loopback without TLS
// (WarnMQTTPlain).
func (n *Server) MQTTPlain() bool { return n.mqttPlain }
