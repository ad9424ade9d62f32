package meshdb

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/internal/seal"
)

// SettingBrokerURL is the mesh setting that tells nodes where the broker is.
const SettingBrokerURL = "broker.url"

// Change is the outcome of an administrative operation.
type Change struct {
	Revision int64 // the mesh revision after the operation
	Changed  bool  // false when the database already held exactly this
}

// NodeAssignment is an assignment with the node it belongs to.
type NodeAssignment struct {
	Node string
	cache.Assignment
}

// NodeOverride is an override with the node it belongs to.
type NodeOverride struct {
	Node string
	cache.Override
}

// change runs fn in one transaction and reports the revision after it.
// The triggers bump the revision (once) and notify if fn changed a row.
func (db *DB) change(ctx context.Context, op string, fn func(pgx.Tx) error) (Change, error) {
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return Change{}, db.wrap(op, err)
	}
	defer rollback(tx)
	var before int64
	if err := tx.QueryRow(ctx, "SELECT revision FROM mesh_revision").Scan(&before); err != nil {
		return Change{}, db.wrap(op, err)
	}
	if err := fn(tx); err != nil {
		return Change{}, db.wrap(op, err)
	}
	var after int64
	if err := tx.QueryRow(ctx, "SELECT revision FROM mesh_revision").Scan(&after); err != nil {
		return Change{}, db.wrap(op, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return Change{}, db.wrap(op, err)
	}
	return Change{Revision: after, Changed: after != before}, nil
}

// AddNode records a new node. An existing name gives *ExistsError.
func (db *DB) AddNode(ctx context.Context, n cache.NodeRecord) (Change, error) {
	if err := validateNode(n); err != nil {
		return Change{}, fmt.Errorf("add node: %w", err)
	}
	return db.change(ctx, "add node", func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO nodes (name, public_name, identity) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING`,
			n.Name, n.PublicName, n.Identity)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return &ExistsError{What: fmt.Sprintf("node %q", n.Name)}
		}
		return nil
	})
}

// UpdateNode changes an existing node's public name and identity.
func (db *DB) UpdateNode(ctx context.Context, n cache.NodeRecord) (Change, error) {
	if err := validateNode(n); err != nil {
		return Change{}, fmt.Errorf("update node: %w", err)
	}
	return db.change(ctx, "update node", func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE nodes SET public_name = $2, identity = $3 WHERE name = $1`, n.Name, n.PublicName, n.Identity)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return &NotFoundError{What: fmt.Sprintf("node %q", n.Name)}
		}
		return nil
	})
}

// RemoveNode removes a node. A node that still has assignments, overrides
// or grants is kept (*InUseError) unless force, which removes them too.
func (db *DB) RemoveNode(ctx context.Context, name string, force bool) (Change, error) {
	if err := cache.ValidateNodeName(name); err != nil {
		return Change{}, fmt.Errorf("remove node: %w", err)
	}
	return db.change(ctx, "remove node", func(tx pgx.Tx) error { return removeNode(ctx, tx, name, force) })
}

// removeNode removes node name inside tx (see RemoveNode).
func removeNode(ctx context.Context, tx pgx.Tx, name string, force bool) error {
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM nodes WHERE name = $1)`, name).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		return &NotFoundError{What: fmt.Sprintf("node %q", name)}
	}
	if !force {
		use := &InUseError{Node: name}
		err := tx.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM assignments WHERE node = $1),
			(SELECT count(*) FROM overrides WHERE node = $1),
			(SELECT count(*) FROM grants WHERE consumer = $1)`, name).Scan(&use.Assignments, &use.Overrides, &use.Grants)
		if err != nil {
			return err
		}
		if use.Assignments+use.Overrides+use.Grants > 0 {
			return use
		}
	}
	if err := dropNodeRoles(ctx, tx, name); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `DELETE FROM nodes WHERE name = $1`, name)
	return err
}

// Nodes lists every node record, by name.
func (db *DB) Nodes(ctx context.Context) ([]cache.NodeRecord, error) {
	var out []cache.NodeRecord
	err := collect(ctx, db.pool, &out, `SELECT name, public_name, identity FROM nodes ORDER BY name`, nil,
		func(r pgx.Rows, n *cache.NodeRecord) error { return r.Scan(&n.Name, &n.PublicName, &n.Identity) })
	if err != nil {
		return nil, db.wrap("list nodes", err)
	}
	return out, nil
}

// Assign makes node host a module (creating or replacing the assignment).
func (db *DB) Assign(ctx context.Context, node string, a cache.Assignment) (Change, error) {
	if err := firstErr(cache.ValidateNodeName(node), cache.ValidateModuleName(a.Module),
		cache.ValidateValue("selection", a.Selection)); err != nil {
		return Change{}, fmt.Errorf("assign: %w", err)
	}
	return db.change(ctx, "assign", func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO assignments (node, module, selection, autostart) VALUES ($1, $2, $3, $4)
			ON CONFLICT (node, module) DO UPDATE SET selection = EXCLUDED.selection, autostart = EXCLUDED.autostart`,
			node, a.Module, a.Selection, a.Autostart)
		return missingNode(err, "node", node)
	})
}

// Unassign removes node's assignment of module.
func (db *DB) Unassign(ctx context.Context, node, module string) (Change, error) {
	if err := firstErr(cache.ValidateNodeName(node), cache.ValidateModuleName(module)); err != nil {
		return Change{}, fmt.Errorf("unassign: %w", err)
	}
	return db.change(ctx, "unassign", func(tx pgx.Tx) error {
		return deleteOne(ctx, tx, fmt.Sprintf("assignment of module %q to node %q", module, node),
			`DELETE FROM assignments WHERE node = $1 AND module = $2`, node, module)
	})
}

// Assignments lists assignments, of one node or (node "") of all.
func (db *DB) Assignments(ctx context.Context, node string) ([]NodeAssignment, error) {
	var out []NodeAssignment
	err := collect(ctx, db.pool, &out, `SELECT node, module, selection, autostart FROM assignments
		WHERE $1 = '' OR node = $1 ORDER BY node, module`, []any{node},
		func(r pgx.Rows, a *NodeAssignment) error {
			return r.Scan(&a.Node, &a.Module, &a.Selection, &a.Autostart)
		})
	if err != nil {
		return nil, db.wrap("list assignments", err)
	}
	return out, nil
}

// SetOverride sets a per-node, per-module value.
func (db *DB) SetOverride(ctx context.Context, node string, o cache.Override) (Change, error) {
	if err := firstErr(cache.ValidateNodeName(node), cache.ValidateModuleName(o.Module),
		cache.ValidateOverrideKey(o.Key), cache.ValidateValue("override value", o.Value)); err != nil {
		return Change{}, fmt.Errorf("set override: %w", err)
	}
	return db.change(ctx, "set override", func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO overrides (node, module, key, value) VALUES ($1, $2, $3, $4)
			ON CONFLICT (node, module, key) DO UPDATE SET value = EXCLUDED.value`, node, o.Module, o.Key, o.Value)
		return missingNode(err, "node", node)
	})
}

// UnsetOverride removes a per-node, per-module value.
func (db *DB) UnsetOverride(ctx context.Context, node, module, key string) (Change, error) {
	if err := firstErr(cache.ValidateNodeName(node), cache.ValidateModuleName(module), cache.ValidateOverrideKey(key)); err != nil {
		return Change{}, fmt.Errorf("unset override: %w", err)
	}
	return db.change(ctx, "unset override", func(tx pgx.Tx) error {
		return deleteOne(ctx, tx, fmt.Sprintf("override %s/%s of node %q", module, key, node),
			`DELETE FROM overrides WHERE node = $1 AND module = $2 AND key = $3`, node, module, key)
	})
}

// Overrides lists overrides, of one node or (node "") of all.
func (db *DB) Overrides(ctx context.Context, node string) ([]NodeOverride, error) {
	var out []NodeOverride
	err := collect(ctx, db.pool, &out, `SELECT node, module, key, value FROM overrides
		WHERE $1 = '' OR node = $1 ORDER BY node, module, key`, []any{node},
		func(r pgx.Rows, o *NodeOverride) error { return r.Scan(&o.Node, &o.Module, &o.Key, &o.Value) })
	if err != nil {
		return nil, db.wrap("list overrides", err)
	}
	return out, nil
}

// ValidateSetting checks a mesh setting: the key's form, the value's
// size, broker.url as an amqp(s) URL, any other *.url as an absolute URL.
func ValidateSetting(key, value string) error {
	if err := firstErr(cache.ValidateSettingKey(key), cache.ValidateValue("setting value", value)); err != nil {
		return err
	}
	switch {
	case key == SettingBrokerURL:
		return cache.ValidateBrokerURL(value)
	case strings.HasSuffix(key, ".url"):
		u, err := url.Parse(value)
		if err != nil || u.Scheme == "" || u.Host == "" {
			return &cache.NameError{Field: "value of " + key, Value: cache.RedactURL(value), Reason: "not an absolute URL"}
		}
	}
	return nil
}

// SetSetting sets a mesh setting.
func (db *DB) SetSetting(ctx context.Context, key, value string) (Change, error) {
	if err := ValidateSetting(key, value); err != nil {
		return Change{}, fmt.Errorf("set setting: %w", err)
	}
	return db.change(ctx, "set setting", func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO settings (key, value) VALUES ($1, $2)
			ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value`, key, value)
		return err
	})
}

// UnsetSetting removes a mesh setting. broker.url cannot be removed
// (every node needs it): set a new value instead.
func (db *DB) UnsetSetting(ctx context.Context, key string) (Change, error) {
	if err := cache.ValidateSettingKey(key); err != nil {
		return Change{}, fmt.Errorf("unset setting: %w", err)
	}
	if key == SettingBrokerURL {
		return Change{}, fmt.Errorf("unset setting: %w: every node reads %s; set a new value instead", ErrRequired, key)
	}
	return db.change(ctx, "unset setting", func(tx pgx.Tx) error {
		return deleteOne(ctx, tx, fmt.Sprintf("setting %q", key), `DELETE FROM settings WHERE key = $1`, key)
	})
}

// Setting returns one mesh setting's value, or *NotFoundError.
func (db *DB) Setting(ctx context.Context, key string) (string, error) {
	if err := cache.ValidateSettingKey(key); err != nil {
		return "", fmt.Errorf("get setting: %w", err)
	}
	var v string
	err := db.pool.QueryRow(ctx, `SELECT value FROM settings WHERE key = $1`, key).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("get setting: %w", &NotFoundError{What: fmt.Sprintf("setting %q", key)})
	}
	if err != nil {
		return "", db.wrap("get setting", err)
	}
	return v, nil
}

// Settings returns every mesh setting.
func (db *DB) Settings(ctx context.Context) (map[string]string, error) {
	var rows []kv
	err := collect(ctx, db.pool, &rows, `SELECT key, value FROM settings`, nil,
		func(r pgx.Rows, s *kv) error { return r.Scan(&s.k, &s.v) })
	if err != nil {
		return nil, db.wrap("list settings", err)
	}
	out := make(map[string]string, len(rows))
	for _, s := range rows {
		out[s.k] = s.v
	}
	return out, nil
}

func validateGrantNames(consumer, resource, provider string) error {
	return firstErr(cache.ValidateNodeName(consumer), cache.ValidateResourceName("resource", resource),
		cache.ValidateResourceName("provider", provider))
}

// Grant gives consumer (a node) resource from provider with a credential,
// replacing the credential of an existing grant. The credential is stored
// only sealed to the consumer's public key (seal.GrantInfo): the database
// and every other node hold it sealed, the consumer opens it in memory
// when it uses it. A consumer that has not published its public key yet
// (it does when it first starts) gives ErrNoPublicKey.
func (db *DB) Grant(ctx context.Context, g cache.Grant) (Change, error) {
	if err := firstErr(validateGrantNames(g.Consumer, g.Resource, g.Provider),
		cache.ValidateValue("credential", g.Credential.Reveal())); err != nil {
		return Change{}, fmt.Errorf("grant: %w", err)
	}
	return db.change(ctx, "grant", func(tx pgx.Tx) error {
		var pub []byte
		err := tx.QueryRow(ctx, `SELECT public_key FROM nodes WHERE name = $1 FOR SHARE`, g.Consumer).Scan(&pub)
		if errors.Is(err, pgx.ErrNoRows) {
			return &NotFoundError{What: fmt.Sprintf("consumer node %q", g.Consumer)}
		}
		if err != nil {
			return err
		}
		// The credential is stored only sealed to the consumer's public
		// key: neither the database nor another node can read it.
		var sealed []byte
		if g.Credential != "" {
			if len(pub) == 0 {
				return fmt.Errorf("node %q has %w (it publishes one when it first starts): grant it a credential after that", g.Consumer, ErrNoPublicKey)
			}
			sealed, err = seal.SealTo(pub, seal.GrantInfo(g.Consumer, g.Resource, g.Provider), []byte(g.Credential.Reveal()))
			if err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, `INSERT INTO grants (consumer, resource, provider, credential, sealed_credential) VALUES ($1, $2, $3, '', $4)
			ON CONFLICT (consumer, resource, provider) DO UPDATE SET credential = '', sealed_credential = EXCLUDED.sealed_credential
			WHERE grants.credential <> '' OR grants.sealed_credential IS DISTINCT FROM EXCLUDED.sealed_credential`,
			g.Consumer, g.Resource, g.Provider, sealed)
		return missingNode(err, "consumer node", g.Consumer)
	})
}

// Revoke removes a grant.
func (db *DB) Revoke(ctx context.Context, consumer, resource, provider string) (Change, error) {
	if err := validateGrantNames(consumer, resource, provider); err != nil {
		return Change{}, fmt.Errorf("revoke: %w", err)
	}
	return db.change(ctx, "revoke", func(tx pgx.Tx) error {
		return deleteOne(ctx, tx, fmt.Sprintf("grant of %q from %q to node %q", resource, provider, consumer),
			`DELETE FROM grants WHERE consumer = $1 AND resource = $2 AND provider = $3`, consumer, resource, provider)
	})
}

// Grants lists grants, of one consumer or (consumer "") of all, with
// their credentials (which print redacted).
func (db *DB) Grants(ctx context.Context, consumer string) ([]cache.Grant, error) {
	var out []cache.Grant
	err := collect(ctx, db.pool, &out, `SELECT consumer, resource, provider, credential, sealed_credential FROM grants
		WHERE $1 = '' OR consumer = $1 ORDER BY consumer, resource, provider`, []any{consumer},
		func(r pgx.Rows, g *cache.Grant) error {
			var cred string
			var sealed []byte
			err := r.Scan(&g.Consumer, &g.Resource, &g.Provider, &cred, &sealed)
			g.Credential = cache.Credential(cred)
			if len(sealed) > 0 {
				g.SealedCredential = base64.StdEncoding.EncodeToString(sealed)
			}
			return err
		})
	if err != nil {
		return nil, db.wrap("list grants", err)
	}
	return out, nil
}

func validateNode(n cache.NodeRecord) error {
	return firstErr(cache.ValidateNodeName(n.Name), cache.ValidatePublicName(n.PublicName),
		cache.ValidateValue("identity", n.Identity))
}

// deleteOne runs a DELETE that must remove exactly one row.
func deleteOne(ctx context.Context, tx pgx.Tx, what, query string, args ...any) error {
	tag, err := tx.Exec(ctx, query, args...)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return &NotFoundError{What: what}
	}
	return nil
}

// missingNode turns a foreign-key violation into *NotFoundError.
func missingNode(err error, field, node string) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23503" { // foreign_key_violation
		return &NotFoundError{What: fmt.Sprintf("%s %q", field, node)}
	}
	return err
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
