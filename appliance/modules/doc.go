// Package modules runs the modules the mesh assigns to this node, the way
// systemd runs units: "the repository defines what exists; the database
// defines what runs where".
//
// # Model
//
// The catalog is a directory with one folder per module, each holding a
// manifest.json (see Manifest): the module's selections (command,
// arguments, working directory, environment), the user it runs as, what it
// hosts and uses on the node's NATS server, its stop and start graces, and
// how overrides and grants reach it. A bad manifest makes only its own
// module fail, with an error that names the file and the field.
//
// The node's bindings (cache.Bindings) say which modules it hosts, at which
// selection, whether they start by themselves (autostart), with which
// overrides, and which grants the node holds. Prepare reads the catalog and
// resolves the bindings against it into a Plan; Apply makes the running
// modules match it:
//
//   - an assignment with autostart runs its module at the assignment's
//     selection; one without waits for a manual Start;
//   - a module no longer assigned is stopped; one whose assignment,
//     overrides, grants or manifest changed is restarted (and a manual
//     Start or Stop since the last change is forgotten);
//   - an assignment the catalog cannot run (no such module, a bad
//     manifest, a selection the manifest lacks) is a failed module in the
//     status, with the reason, never a silent skip.
//
// The supervisor never reads the database: it runs from whatever bindings
// it was given last, so modules keep running while the database is away,
// and bindings that come back unchanged change nothing.
//
// # What a module gets
//
// A module's environment is built from nothing of the node's own (which
// may hold the database's password), in layers, each beating the one
// before: PATH, HOME, USER; the selection's env; what the node sets
// (MESHBOX_NODE, MESHBOX_MODULE, MESHBOX_SELECTION, MESHBOX_RUNTIME_DIR,
// MESHBOX_GRANTS_DIR, NATS_URL; NATS_NKEY, the module's own local
// credential (an nkey seed file in its runtime directory) and
// NATS_INBOX_PREFIX, the inbox prefix it must use, when the node made one;
// and the grant variables); the overrides last. An override arrives
// in the variable its manifest maps its key to, else in
// MESHBOX_OVERRIDE_<KEY> (OverrideEnv).
//
// Each run gets a fresh private runtime directory, <run dir>/<module>
// (0700, owned by the module's user), with a grants folder holding one
// file per grant of this node for a resource the manifest names (0600,
// named by GrantFile). The variable MESHBOX_GRANT_<RESOURCE> (GrantEnv, or
// the manifest's name for it) holds the file's path (several providers:
// paths separated by ':'). A grant's credential is only ever in its file:
// never in the environment, the arguments, a log line or the status. The
// directory goes when the module stops (by hand, unassigned, or with the
// node).
//
// # Supervision
//
// A module's process runs in a process group of its own. Stopping it sends
// SIGTERM to the group and SIGKILL after the manifest's stop grace. A run
// that ends while the module is wanted is restarted after a jittered,
// doubling pause (Config.Restart); Config.CrashLoopRestarts failures within
// Config.CrashLoopWindow make it crash-looping, tried again only every
// Config.CrashLoopRetry (a retry that fails is crash-looping again at
// once). A run that lasted the whole window counts as a success, and a
// change of the module or a manual start gives it a fresh round. A program that cannot be started (missing, not executable, a
// user the node may not switch to) is failed, and tried again as slowly.
//
// A node killed with SIGKILL leaves no module behind. On Linux every
// module's own process gets SIGKILL from the kernel when the node dies
// (Pdeathsig). The signal is tied to the thread that started the child, so
// every module is started from one goroutine locked to its OS thread for
// the supervisor's life (see spawn_linux.go). What the module started in
// turn (a shell script's programs) is in its process group, which the
// guard (Config.Guard, see guard.go) kills when the node's end closes its
// input; and what is left of a group after the module's process ended is
// killed with it. A module that leaves its process group (setsid) is on
// its own.
//
// Every line a module writes to stdout or stderr goes to the node's log
// with the module's name, and the last Config.LogLines lines are kept for
// Logs.
//
// # Concurrency
//
// Each assigned module has one runner goroutine, the only one that starts
// and stops its process; Apply, Start, Stop and Restart change what the
// runner wants under its mutex and wake it. Each process has a waiter
// goroutine and two output readers, all ending once the process is reaped
// and its output closed. Close ends every runner, each stopping its module,
// all at once, and returns when every one of these goroutines is gone.
package modules
