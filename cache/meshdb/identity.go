package meshdb

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/internal/names"
)

// This file holds a node's identity in the mesh database: its PostgreSQL
// role (row-level security lets it read only its own assignments,
// overrides, grants and credentials; migration 002), its broker credential
// rows, and its join tokens.

// DefaultJoinTTL is how long a join token stays valid unless told.
const DefaultJoinTTL = 24 * time.Hour

// rolePrefix starts every node role's name; node roles are cluster-wide, so
// the name ends in a random suffix and node_roles maps it to its node.
const rolePrefix = "meshbox_node_"

// BrokerCredential is one generation of a node's broker credential, as
// stored in its own row.
type BrokerCredential = cache.BrokerCredential

// NewNode describes a node that AddNodeIdentity records.
type NewNode struct {
	Record cache.NodeRecord
	Stages []string         // the stages it may consume ("*": all; nil: none)
	Broker BrokerCredential // generation 1, made on the broker
	TTL    time.Duration    // of the join token (0: DefaultJoinTTL)
	// Scopes are the scopes the node is made a member of, each existing
	// (its keys are sealed for it by a member, or by the recovery kit).
	Scopes []string
}

// AddedNode is what AddNodeIdentity made.
type AddedNode struct {
	Change
	Role  string    // the node's PostgreSQL role
	Token JoinToken // one use, expiring
}

// NodeExists reports whether a node record exists.
func (db *DB) NodeExists(ctx context.Context, name string) (bool, error) {
	var ok bool
	if err := db.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM nodes WHERE name = $1)`, name).Scan(&ok); err != nil {
		return false, db.wrap("find node", err)
	}
	return ok, nil
}

// NodeHasIdentity reports whether node name is recorded and whether it
// has an identity of its own (a database role: it was added with one).
// A node recorded without one (by init, or --record-only) gets it from
// AddNodeIdentity.
func (db *DB) NodeHasIdentity(ctx context.Context, name string) (exists, identity bool, err error) {
	err = db.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM nodes WHERE name = $1),
		EXISTS (SELECT 1 FROM node_roles WHERE node = $1)`, name).Scan(&exists, &identity)
	if err != nil {
		return false, false, db.wrap("find node", err)
	}
	return exists, identity, nil
}

// CheckCanAddNodes says what is missing for the database user to add
// nodes: every node gets a role of its own, which needs CREATEROLE (or a
// superuser).
func (db *DB) CheckCanAddNodes(ctx context.Context) error {
	var user string
	var ok bool
	err := db.pool.QueryRow(ctx, `SELECT current_user, rolcreaterole OR rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&user, &ok)
	if err != nil {
		return db.wrap("check database role", err)
	}
	if !ok {
		ident := user
		if !regexp.MustCompile(`^[a-z_][a-z0-9_]*$`).MatchString(user) {
			ident = pgx.Identifier{user}.Sanitize()
		}
		return fmt.Errorf("the database user %s may not create roles, and every node gets a role of its own: as PostgreSQL's superuser, run: ALTER ROLE %s CREATEROLE", user, ident)
	}
	return nil
}

// NodeStages returns the stage allow-list of a node, or *NotFoundError.
func (db *DB) NodeStages(ctx context.Context, name string) ([]string, error) {
	var stages []string
	err := db.pool.QueryRow(ctx, `SELECT stages FROM nodes WHERE name = $1`, name).Scan(&stages)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("node stages: %w", &NotFoundError{What: fmt.Sprintf("node %q", name)})
	}
	if err != nil {
		return nil, db.wrap("node stages", err)
	}
	return stages, nil
}

// AddNodeIdentity records a new node with its identity, in one
// transaction: the node record with its stage allow-list, a PostgreSQL role
// (LOGIN, a random password, read-only rights filtered by row-level
// security), the broker credential in the node's own row (its password
// sealed under the role's: sealedcred.go), and a join token.
// The token's database URL is adminURL with the node role's user and
// password. An existing node gives *ExistsError and changes nothing.
func (db *DB) AddNodeIdentity(ctx context.Context, adminURL string, n NewNode) (AddedNode, error) {
	if err := validateNode(n.Record); err != nil {
		return AddedNode{}, fmt.Errorf("add node: %w", err)
	}
	stages, err := validStages(n.Stages)
	if err != nil {
		return AddedNode{}, fmt.Errorf("add node: %w", err)
	}
	if n.Broker.Generation < 1 || n.Broker.User == "" || n.Broker.Password == "" {
		return AddedNode{}, errors.New("add node: no broker credential")
	}
	ttl := n.TTL
	if ttl <= 0 {
		ttl = DefaultJoinTTL
	}
	node := n.Record.Name
	role := roleName(node)
	rolePassword := randomText(32)
	if _, err := withUser(adminURL, role, rolePassword); err != nil {
		return AddedNode{}, fmt.Errorf("add node: %w", err)
	}
	var out AddedNode
	out.Change, err = db.change(ctx, "add node", func(tx pgx.Tx) error {
		// A node recorded without an identity of its own (by init, or
		// --record-only) gets one, with the stages given; one that has an
		// identity exists.
		tag, err := tx.Exec(ctx, `INSERT INTO nodes (name, public_name, identity, stages) VALUES ($1, $2, $3, $4)
			ON CONFLICT (name) DO UPDATE SET stages = EXCLUDED.stages,
				public_name = CASE WHEN EXCLUDED.public_name <> '' THEN EXCLUDED.public_name ELSE nodes.public_name END
			WHERE NOT EXISTS (SELECT 1 FROM node_roles r WHERE r.node = nodes.name)`,
			node, n.Record.PublicName, n.Record.Identity, stages)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return &ExistsError{What: fmt.Sprintf("node %q", node)}
		}
		if err := createNodeRole(ctx, tx, node, role, rolePassword); err != nil {
			return err
		}
		if err := joinScopes(ctx, tx, node, n.Scopes); err != nil {
			return err
		}
		// The node opens its broker password with its join token's login.
		row, err := sealWithLogin(node, n.Broker.Generation, n.Broker.Password.Reveal(), rolePassword)
		if err != nil {
			return err
		}
		if err := insertCredential(ctx, tx, node, n.Broker.Generation, n.Broker.User, "", row); err != nil {
			return err
		}
		out.Token, err = insertJoinToken(ctx, tx, adminURL, node, role, rolePassword, ttl)
		return err
	})
	if err != nil {
		return AddedNode{}, err
	}
	out.Role = role
	return out, nil
}

// insertJoinToken makes a join token for node inside tx, valid for ttl,
// whose database URL is adminURL with role and rolePassword.
func insertJoinToken(ctx context.Context, tx pgx.Tx, adminURL, node, role, rolePassword string, ttl time.Duration) (JoinToken, error) {
	tok := JoinToken{Node: node, ID: hex.EncodeToString(randomBytes(16)), Secret: randomText(32)}
	var err error
	if tok.DB, err = withUser(adminURL, role, rolePassword); err != nil {
		return JoinToken{}, err
	}
	sum := sha256.Sum256([]byte(tok.Secret))
	err = tx.QueryRow(ctx, `INSERT INTO join_tokens (id, node, secret_sha256, expires_at) VALUES ($1, $2, $3, now() + $4::interval)
		RETURNING expires_at`, tok.ID, node, sum[:], ttl.String()).Scan(&tok.Expires)
	return tok, err
}

// createNodeRole creates the login role of node inside tx, with password,
// the rights meshbox_grant_node gives, and its row in node_roles.
func createNodeRole(ctx context.Context, tx pgx.Tx, node, role, password string) error {
	ident := pgx.Identifier{role}.Sanitize()
	// Utility statements take no parameters; the verifier is base64 and
	// separators, so it needs no escaping inside the quotes. The server
	// gets only the password's SCRAM verifier (scram.go).
	if _, err := tx.Exec(ctx, `CREATE ROLE `+ident+` LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION CONNECTION LIMIT 16 PASSWORD '`+scramVerifier(password)+`'`); err != nil {
		return fmt.Errorf("create role: %w", err)
	}
	if _, err := tx.Exec(ctx, `SELECT meshbox_grant_node($1)`, role); err != nil {
		return fmt.Errorf("grant role: %w", err)
	}
	_, err := tx.Exec(ctx, `INSERT INTO node_roles (role, node) VALUES ($1, $2)`, role, node)
	return err
}

// dropRole drops one node role inside tx (its grants first).
func dropRole(ctx context.Context, tx pgx.Tx, r string) error {
	ident := pgx.Identifier{r}.Sanitize()
	if _, err := tx.Exec(ctx, `DROP OWNED BY `+ident); err != nil {
		return fmt.Errorf("drop role %s: %w", r, err)
	}
	if _, err := tx.Exec(ctx, `DROP ROLE IF EXISTS `+ident); err != nil {
		return fmt.Errorf("drop role %s: %w", r, err)
	}
	_, err := tx.Exec(ctx, `DELETE FROM node_roles WHERE role = $1`, r)
	return err
}

// dropNodeRoles drops the roles of node inside tx (before its node row
// goes, which cascades to node_roles).
func dropNodeRoles(ctx context.Context, tx pgx.Tx, node string) error {
	var roles []string
	if err := collect(ctx, tx, &roles, `SELECT role FROM node_roles WHERE node = $1`, []any{node},
		func(r pgx.Rows, s *string) error { return r.Scan(s) }); err != nil {
		return err
	}
	for _, r := range roles {
		if err := dropRole(ctx, tx, r); err != nil {
			return err
		}
	}
	return nil
}

// BrokerCredentials returns the broker credential rows the connected role
// may read, newest generation first: for a node role, only its own (the
// database filters); for the admin, node's. The password is the row's
// plain text: empty for a sealed row (Load opens those).
func (db *DB) BrokerCredentials(ctx context.Context, node string) ([]BrokerCredential, error) {
	var out []BrokerCredential
	err := collect(ctx, db.pool, &out, `SELECT generation, broker_user, broker_password, created_at FROM node_credentials
		WHERE node = $1 ORDER BY generation DESC`, []any{node},
		func(r pgx.Rows, c *BrokerCredential) error {
			var pw string
			err := r.Scan(&c.Generation, &c.User, &pw, &c.CreatedAt)
			c.Password = cache.Credential(pw)
			return err
		})
	if err != nil {
		return nil, db.wrap("read broker credentials", err)
	}
	return out, nil
}

// Redeem redeems a join token as the node role the DB is connected as: in
// one transaction the token is checked and marked used. It returns the
// node's name, or ErrTokenUnknown, a *TokenUsedError or a
// *TokenExpiredError.
func (db *DB) Redeem(ctx context.Context, tok JoinToken) (string, error) {
	var outcome string
	var node *string
	var at *time.Time
	err := db.pool.QueryRow(ctx, `SELECT outcome, node, at FROM meshbox_redeem_join_token($1, $2)`, tok.ID, []byte(tok.Secret)).
		Scan(&outcome, &node, &at)
	if err != nil {
		return "", db.wrap("redeem join token", err)
	}
	switch outcome {
	case "ok":
		return *node, nil
	case "used":
		return "", fmt.Errorf("redeem join token: %w", &TokenUsedError{At: *at, Node: tok.Node})
	case "expired":
		return "", fmt.Errorf("redeem join token: %w", &TokenExpiredError{At: *at, Node: tok.Node})
	default:
		return "", fmt.Errorf("redeem join token: %w", ErrTokenUnknown)
	}
}

// validStages checks a stage allow-list; nil means no stage (an empty
// array, not NULL, in the database).
func validStages(stages []string) ([]string, error) {
	if len(stages) == 0 {
		return []string{}, nil
	}
	for _, s := range stages {
		if s == "*" {
			continue
		}
		if err := names.Stage(s); err != nil {
			return nil, err
		}
	}
	return stages, nil
}

// roleName returns a fresh role name for node: the prefix, the node name
// cut to 40 bytes, and 8 random hex digits (at most 62 bytes).
func roleName(node string) string {
	if len(node) > 40 {
		node = node[:40]
	}
	return rolePrefix + node + "_" + hex.EncodeToString(randomBytes(4))
}

// withUser returns rawURL with user and password replaced.
func withUser(rawURL, user, password string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Host == "" {
		return "", errors.New("database URL: not a postgres:// URL with a host")
	}
	u.User = url.UserPassword(user, password)
	return u.String(), nil
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	return b
}

// randomText returns n random bytes as base64url without padding.
func randomText(n int) string { return base64.RawURLEncoding.EncodeToString(randomBytes(n)) }

// JoinToken is what `meshbox join` needs to make a node of a machine: the
// database URL with the node role's credential, the node's name, and the
// token's id and secret (the database keeps only the secret's SHA-256).
// It prints redacted; Encode gives the one-line form.
type JoinToken struct {
	DB      string    `json:"db"`
	Node    string    `json:"node"`
	ID      string    `json:"id"`
	Secret  string    `json:"secret"`
	Expires time.Time `json:"-"`
	// NodeKey is the node's private key (seal.NodeKey.MarshalText), in
	// a token of a node whose keys were sealed for it with the recovery
	// kit (`mesh node add --kit`): join writes it to the node's data
	// directory. Such a token opens the mesh's keys: keep it as secret as
	// the node itself.
	NodeKey string `json:"-"`
}

// joinPrefix starts the one-line form of a join token.
const joinPrefix = "meshbox-join-v1."

// Encode returns the token as one line: meshbox-join-v1.<base64url of the
// fields, separated by newlines: node, id, secret, database URL, and the
// node's key (base64url of its text) when it has one>.
func (t JoinToken) Encode() string {
	f := []string{t.Node, t.ID, t.Secret, t.DB}
	if t.NodeKey != "" {
		f = append(f, base64.RawURLEncoding.EncodeToString([]byte(t.NodeKey)))
	}
	raw := strings.Join(f, "\n")
	return joinPrefix + base64.RawURLEncoding.EncodeToString([]byte(raw))
}

// String returns a redacted description.
func (t JoinToken) String() string { return fmt.Sprintf("join token %s for node %q", t.ID, t.Node) }

// ParseJoinToken reads a token made by Encode.
func ParseJoinToken(s string) (JoinToken, error) {
	s = strings.TrimSpace(s)
	body, ok := strings.CutPrefix(s, joinPrefix)
	if !ok {
		return JoinToken{}, fmt.Errorf("%w: does not start with %s", ErrTokenFormat, joinPrefix)
	}
	raw, err := base64.RawURLEncoding.DecodeString(body)
	if err != nil {
		return JoinToken{}, fmt.Errorf("%w: not base64url", ErrTokenFormat)
	}
	f := strings.Split(string(raw), "\n")
	if len(f) != 4 && len(f) != 5 {
		return JoinToken{}, fmt.Errorf("%w: want 4 or 5 fields, got %d", ErrTokenFormat, len(f))
	}
	t := JoinToken{Node: f[0], ID: f[1], Secret: f[2], DB: f[3]}
	if len(f) == 5 {
		key, err := base64.RawURLEncoding.DecodeString(f[4])
		if err != nil || len(key) == 0 {
			return JoinToken{}, fmt.Errorf("%w: its node key is not base64url", ErrTokenFormat)
		}
		t.NodeKey = string(key)
	}
	if err := cache.ValidateNodeName(t.Node); err != nil {
		return JoinToken{}, fmt.Errorf("%w: %v", ErrTokenFormat, err)
	}
	if t.ID == "" || t.Secret == "" {
		return JoinToken{}, fmt.Errorf("%w: no id or secret", ErrTokenFormat)
	}
	if _, err := Address(t.DB); err != nil {
		return JoinToken{}, fmt.Errorf("%w: %v", ErrTokenFormat, err)
	}
	return t, nil
}
