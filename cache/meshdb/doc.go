// Package meshdb is the mesh database: the PostgreSQL schema that holds a
// mesh's bindings, its migrations (embedded, applied with tern), loading a
// node's bindings, following changes with LISTEN/NOTIFY, and the
// administrative operations behind `meshbox init` and `meshbox mesh`.
//
// Every change to a binding table bumps the single mesh revision, once per
// transaction, and sends NOTIFY meshbox_bindings with the new revision; SQL
// triggers do both, so every writer (these operations, psql, another tool)
// is covered. Each administrative operation runs in one transaction and
// validates its input before touching the database: bad input changes
// nothing.
//
// Each node added with an identity (AddNodeIdentity) has a PostgreSQL role
// of its own. Row-level security, in the database and not in this client,
// lets a node role read every node record and setting but only its own
// assignments, overrides, grants, broker credential rows and sealed copies
// of content keys; it writes only its own public key, and (through definer
// functions that check it acts for itself) the keys it claims or seals for
// other nodes. Its join token is kept as a SHA-256 of its secret and
// redeemed once, before it expires, by the node role (Redeem).
//
// Keys (keys.go, migration 004): the database holds each node's public
// key, content key ids, and content keys and grant credentials only sealed
// to a node's public key (internal/seal); it can read none of them. Who
// seals a content key for a node that lacks it: any node holding it, when
// it sees that node's public key with no copy sealed to it; a key's bytes
// are made by the first node that claims its id. No admin command handles
// key bytes.
//
// Scopes (scopes.go, migration 005): a scope has content keys of its own
// (content_keys.scope), members (scope_members) and the capabilities,
// stages and topics bound to it (scope_bindings). The definer functions
// store a copy of a scope's key only for a member, and only from a member;
// a node that leaves a scope loses its copies. RotateKey rotates the
// mesh's keys, RotateScopeKey one scope's.
//
// Migrate lets every role read the schema version; Load reads it first
// and refuses a schema newer than the migrations this binary ships
// (*SchemaError): a node older than its mesh keeps running from its cache
// instead of misreading tables it does not know.
//
// # Credential rotation
//
// A node's credential comes in generations, one row each in
// node_credentials: a broker user (node.<n>.g<k>) and, from the first
// rotation on, a PostgreSQL login role of its own. A role per generation,
// because PostgreSQL keeps one password per role: changing it (ALTER ROLE
// ... PASSWORD) or letting VALID UNTIL pass refuses every new connection of
// the node at once, before it could learn the new password. With a second
// role — same rights, mapped to the same node by node_roles — the node logs
// in with the new role while the old still works, and the old is dropped
// only after. The steps: AddCredentialGeneration (admin: row and role);
// the node reads them with its bindings, switches its connections to the
// new role (SwitchLogin: the new login is tried first, then the pool and
// the LISTEN connection move to it) and its broker link to the new user,
// and records it with CredentialSwitched (through a SECURITY DEFINER
// function that touches only the calling role's node's row, and only as
// the new role); DeleteCredentialGeneration (admin) then drops the row and
// every role of the node no remaining generation names, and ends their
// sessions. The first generation's role is the join token's. Package
// nodecred runs the admin's steps together with the broker's.
//
// Since migration 7 no row holds a password in plain text (sealedcred.go):
// a generation handed out with a join token has its broker password sealed
// under the password of the token's login, a rotated generation both
// passwords sealed to the node's public key (internal/seal, an HPKE info
// that binds node, generation and purpose). Roles are made from a
// SCRAM-SHA-256 verifier (scram.go), broker users from a salted hash, so
// neither server sees the password either. Load opens the node's newest
// row with Options.NodeKey; rows of an older meshbox are read as they are
// until the next rotation revokes them.
//
// DB is safe for concurrent use. Connections, statements and lock waits
// are bounded (Options): pgx's own defaults would wait for minutes.
// Watch owns one dedicated connection for LISTEN while it runs.
package meshdb
