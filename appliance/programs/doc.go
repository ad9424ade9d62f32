// Package programs keeps the credentials of a node's local programs: who
// may connect to the node's embedded NATS server, and what each may do
// there.
//
// # Model
//
// A program is a name and six lists: the capabilities it may host
// (subscribe cap.X) and call (publish cap.X and node.*.cap.X), the
// command stages it may serve (subscribe work.X, in any queue group) and
// submit to (publish cmd.X), and the event topics it may publish (evt.T)
// and subscribe to (evt.T; topics may hold the wildcards * and >, as may
// the names it calls and submits to). Every program has its own reply
// inbox, _INBOX.<name>.>, and may answer the requests it receives once
// each (the NATS server's allow_responses). Nothing else is allowed: not
// the node's own subjects ($MESH.>), not another program's inbox, not
// work.> or cap.> beyond its lists.
//
// Permissions say what a program may do on its own node's NATS server
// and nothing more: whether a capability, stage or topic may cross the
// mesh is the mesh's business (bindings, broker permissions).
//
// # NATS micro services
//
// A program may run its capabilities as a NATS micro service (nats.go's
// micro package and its kin): the endpoints are its hosted capabilities
// (subject cap.X) or served stages (work.X), and the service answers the
// framework's discovery requests ($SRV.PING, $SRV.INFO, $SRV.STATS, each
// also for its name and for its instance id). The service names it may
// answer for are a list of their own (Service, `meshbox program add
// --service NAME`), not derived from what it hosts: a service name is one
// subject token and a capability name may hold dots, one service usually
// serves several capabilities, and the name a program answers discovery
// for is a claim other clients trust (a program that may answer for
// service "billing" can pass for it in `nats micro ls`), so the admin
// grants it by name. A program without it cannot subscribe to any $SRV
// subject.
//
// # Credentials: NATS nkeys
//
// Each program has an Ed25519 key pair in the NATS nkey encoding. The
// node's NATS server knows the public key with the program's permissions
// (an nkey user); the program proves it holds the seed by signing the
// server's nonce. The seed is written to <dir>/<name>.nk (mode 0600) in
// the form every NATS client reads: the official CLI takes it with
// `nats --nkey FILE`, nats.go with nats.NkeyOptionFromSeed(FILE), and
// the other clients have the same option.
//
// Why nkey users and not the JWT ".creds" of operator mode: in operator
// mode the NATS server accepts no user without a JWT, so a standalone
// node could no longer let programs in without any configuration, and a
// mesh could not allow anonymous programs when its configuration says so
// (the server's no_auth_user is incompatible with trusted operators).
// Nkey users keep one server shape for both, keep the server's account
// layout as it is (the watcher of local interest imports the system
// account's connect events), and the server reloads them in place: a
// program added gets in, a program whose lists change gets its new
// permissions (subscriptions it may no longer hold are dropped), and a
// removed program's connections are cut, all without a restart.
//
// # Files
//
// A Store keeps one definition per program in <dir>/<name>.json (the
// lists and the public key) beside its seed, both mode 0600 in a
// directory of mode 0700. List reads them all; a definition that does
// not parse or breaks the rules is reported with its file's name and
// does not keep the other programs out. The node's own administrative
// credential (its in-process clients and the meshbox CLI) is an nkey
// too, in the data directory (AdminFile); it has no limits.
//
// A Store is safe for concurrent use within one process; two processes
// writing the same program at once may leave either's version.
package programs
