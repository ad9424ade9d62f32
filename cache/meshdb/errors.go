package meshdb

import (
	"errors"
	"fmt"
	"time"

	"github.com/meshbox/meshbox/cache"
)

// Errors returned by operations on the mesh database.
var (
	// ErrNotInitialized means the database has no mesh schema yet.
	ErrNotInitialized = errors.New("mesh database is not initialised (run meshbox init)")
	// ErrLoginRefused: the database answered and refused the login (a
	// wrong password, or no such role): it is reachable, the credential
	// is wrong.
	ErrLoginRefused = errors.New("the database refused the login")
	// ErrNotFound means the named row does not exist.
	ErrNotFound = errors.New("not found")
	// ErrExists means a row with that name already exists.
	ErrExists = errors.New("already exists")
	// ErrInUse means a node still has bindings (see *InUseError).
	ErrInUse = errors.New("node still has bindings")
	// ErrMeshExists means Init found a different mesh (see *MeshExistsError).
	ErrMeshExists = errors.New("the database already holds a different mesh")
	// ErrRequired means the operation would remove something every node needs.
	ErrRequired = errors.New("required setting")
	// ErrNoPublicKey means a credential cannot be sealed to a node that has
	// not published its public key yet (it does when it first starts).
	ErrNoPublicKey = errors.New("no public key yet")
)

// NotFoundError names the row that does not exist.
type NotFoundError struct {
	What string // e.g. `node "n1"`, `setting "forge.url"`
}

func (e *NotFoundError) Error() string { return e.What + " not found" }

// Unwrap returns ErrNotFound.
func (e *NotFoundError) Unwrap() error { return ErrNotFound }

// ExistsError names the row that already exists.
type ExistsError struct {
	What string
}

func (e *ExistsError) Error() string { return e.What + " already exists" }

// Unwrap returns ErrExists.
func (e *ExistsError) Unwrap() error { return ErrExists }

// InUseError reports what a node still has, refusing its removal.
type InUseError struct {
	Node                           string
	Assignments, Overrides, Grants int
}

func (e *InUseError) Error() string {
	return fmt.Sprintf("node %q still has %d assignments, %d overrides and %d grants (use --force to remove them too)",
		e.Node, e.Assignments, e.Overrides, e.Grants)
}

// Unwrap returns ErrInUse.
func (e *InUseError) Unwrap() error { return ErrInUse }

// MeshExistsError describes the mesh Init found.
type MeshExistsError struct {
	FirstNode string // the existing mesh's first node ("" if unknown)
	BrokerURL string // its broker.url, password redacted
	Differs   string // what differs: "first node", "broker.url" or both
}

func (e *MeshExistsError) Error() string {
	return fmt.Sprintf("the database already holds a mesh with a different %s (first node %q, broker %s); use --force to overwrite",
		e.Differs, e.FirstNode, e.BrokerURL)
}

// Unwrap returns ErrMeshExists.
func (e *MeshExistsError) Unwrap() error { return ErrMeshExists }

// Errors of join tokens.
var (
	// ErrTokenFormat means a string is not a join token.
	ErrTokenFormat = errors.New("not a meshbox join token")
	// ErrTokenUnknown means the database knows no such token for this node
	// (or its secret is wrong).
	ErrTokenUnknown = errors.New("unknown join token")
	// ErrTokenUsed is wrapped by *TokenUsedError.
	ErrTokenUsed = errors.New("token already used")
	// ErrTokenExpired is wrapped by *TokenExpiredError.
	ErrTokenExpired = errors.New("token expired")
)

// TokenUsedError says when a join token (of node Node) was used.
type TokenUsedError struct {
	At   time.Time
	Node string
}

func (e *TokenUsedError) Error() string {
	return "token already used at " + e.At.UTC().Format(time.RFC3339) + ": a join token works once; " + rejoinHint(e.Node)
}

// rejoinHint says how to get a new join token for node.
func rejoinHint(node string) string {
	if node == "" {
		node = "NODE"
	}
	return "for a new one, run on the admin's machine: meshbox mesh node rejoin " + node
}

// Unwrap returns ErrTokenUsed.
func (e *TokenUsedError) Unwrap() error { return ErrTokenUsed }

// TokenExpiredError says when a join token (of node Node) expired.
type TokenExpiredError struct {
	At   time.Time
	Node string
}

func (e *TokenExpiredError) Error() string {
	return "token expired at " + e.At.UTC().Format(time.RFC3339) + "; " + rejoinHint(e.Node)
}

// Unwrap returns ErrTokenExpired.
func (e *TokenExpiredError) Unwrap() error { return ErrTokenExpired }

// SchemaError is returned by Load when the database's schema is newer than
// the migrations this binary ships (the mesh was upgraded, this node not
// yet). It wraps cache.ErrSourceNewer: the node keeps running from its
// cached bindings.
type SchemaError struct {
	DB     string // the database's address, without password
	Schema int32  // the database's schema version
	Known  int32  // the newest schema version this binary knows
}

func (e *SchemaError) Error() string {
	return fmt.Sprintf("mesh database %s has schema version %d, newer than this meshbox knows (%d): upgrade meshbox on this node",
		e.DB, e.Schema, e.Known)
}

// Unwrap returns cache.ErrSourceNewer.
func (e *SchemaError) Unwrap() error { return cache.ErrSourceNewer }

// ErrCredentialSealed is wrapped by *CredentialSealedError.
var ErrCredentialSealed = errors.New("this node's credential does not open here")

// CredentialSealedError is returned by Load when the node's newest
// credential row is sealed to a key or a login this node does not have:
// its data directory (and key pair) was replaced, or its configuration is
// not the join token's of that generation. The way out is a new join token
// (meshbox mesh node rejoin).
type CredentialSealedError struct {
	Node       string
	Generation int
	SealedFor  string // fingerprint of the public key it is sealed to; "" when sealed with the join token's login
	NodeKey    string // fingerprint of this node's public key ("" if it has none)
}

func (e *CredentialSealedError) Error() string {
	what := fmt.Sprintf("generation %d of node %s's credential is sealed with the database login of its join token, which does not open it", e.Generation, e.Node)
	if e.SealedFor != "" {
		have := "this node has no key"
		if e.NodeKey != "" {
			have = "this node's key is " + e.NodeKey
		}
		what = fmt.Sprintf("generation %d of node %s's credential is sealed to node key %s, but %s (its data directory was replaced?)",
			e.Generation, e.Node, e.SealedFor, have)
	}
	return what + fmt.Sprintf("; on the admin's machine run meshbox mesh node rejoin %s, then here meshbox join TOKEN --force", e.Node)
}

// Unwrap returns ErrCredentialSealed.
func (e *CredentialSealedError) Unwrap() error { return ErrCredentialSealed }
