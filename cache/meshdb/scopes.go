package meshdb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/internal/names"
	"github.com/meshbox/meshbox/internal/seal"
)

// This file holds the mesh's scopes (migration 005): smaller trust
// boundaries inside a mesh, each with content keys of its own, the nodes
// that hold them, and the capabilities, stages and topics whose traffic is
// sealed with them. As for the mesh's keys, the database holds ids and
// sealed copies only: the first member to see a scope's key makes it, and
// members seal it for the other members (the definer functions refuse any
// other node).

// AddScope creates scope name held by nodes (at least one, each a node of
// the mesh) and its first content key. An existing scope gives
// *ExistsError.
func (db *DB) AddScope(ctx context.Context, name string, nodes []string) (Change, error) {
	if err := names.Scope(name); err != nil {
		return Change{}, fmt.Errorf("add scope: %w", err)
	}
	if len(nodes) == 0 {
		return Change{}, fmt.Errorf("add scope %s: name the nodes that hold it", name)
	}
	for _, n := range nodes {
		if err := names.Node(n); err != nil {
			return Change{}, fmt.Errorf("add scope %s: %w", name, err)
		}
	}
	return db.change(ctx, "add scope", func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO scopes (name) VALUES ($1) ON CONFLICT (name) DO NOTHING`, name)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return &ExistsError{What: fmt.Sprintf("scope %q", name)}
		}
		for _, n := range nodes {
			if _, err := tx.Exec(ctx, `INSERT INTO scope_members (scope, node) VALUES ($1, $2) ON CONFLICT DO NOTHING`, name, n); err != nil {
				if isForeignKey(err) {
					return &NotFoundError{What: fmt.Sprintf("node %q", n)}
				}
				return err
			}
		}
		_, err = tx.Exec(ctx, `INSERT INTO content_keys (id, scope) VALUES ($1, $2)`, seal.NewContentKey().ID, name)
		return err
	})
}

// BindScope binds names of kind (seal.BindCap, BindStage, BindTopic) to
// scope. A name bound to another scope already gives *ExistsError: unbind
// it there first (a name moved silently would change who reads it).
func (db *DB) BindScope(ctx context.Context, scope, kind string, list []string) (Change, error) {
	if err := names.Scope(scope); err != nil {
		return Change{}, fmt.Errorf("bind scope: %w", err)
	}
	var check func(string) error
	switch kind {
	case seal.BindCap:
		check = names.Capability
	case seal.BindStage:
		check = names.Stage
	case seal.BindTopic:
		check = names.Topic
	default:
		return Change{}, fmt.Errorf("bind scope %s: kind %q: want cap, stage or topic", scope, kind)
	}
	for _, n := range list {
		if err := check(n); err != nil {
			return Change{}, fmt.Errorf("bind scope %s: %w", scope, err)
		}
	}
	return db.change(ctx, "bind scope", func(tx pgx.Tx) error {
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM scopes WHERE name = $1)`, scope).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			return &NotFoundError{What: fmt.Sprintf("scope %q", scope)}
		}
		for _, n := range list {
			var have string
			err := tx.QueryRow(ctx, `INSERT INTO scope_bindings (scope, kind, name) VALUES ($1, $2, $3)
				ON CONFLICT (kind, name) DO UPDATE SET scope = scope_bindings.scope RETURNING scope`, scope, kind, n).Scan(&have)
			if err != nil {
				return err
			}
			if have != scope {
				return &ExistsError{What: fmt.Sprintf("%s %q bound to scope %q", kind, n, have)}
			}
		}
		return nil
	})
}

// UnbindScope removes the bindings of names of kind from scope.
func (db *DB) UnbindScope(ctx context.Context, scope, kind string, list []string) (Change, error) {
	return db.change(ctx, "unbind scope", func(tx pgx.Tx) error {
		for _, n := range list {
			if _, err := tx.Exec(ctx, `DELETE FROM scope_bindings WHERE scope = $1 AND kind = $2 AND name = $3`, scope, kind, n); err != nil {
				return err
			}
		}
		return nil
	})
}

// RotateScopeKey adds a new content key to scope and sets its older keys
// to retire after retention (0: DefaultKeyRetention), as RotateKey does
// for the mesh's keys.
func (db *DB) RotateScopeKey(ctx context.Context, scope string, retention time.Duration) (string, Change, error) {
	if err := names.Scope(scope); err != nil {
		return "", Change{}, fmt.Errorf("rotate scope key: %w", err)
	}
	return db.rotate(ctx, "rotate scope key", scope, retention)
}

// rotate adds a content key of scope ("": the mesh's) and retires the
// scope's older keys after retention; keys retired before now are deleted
// with their sealed copies.
func (db *DB) rotate(ctx context.Context, op, scope string, retention time.Duration) (string, Change, error) {
	if retention <= 0 {
		retention = DefaultKeyRetention
	}
	var id string
	ch, err := db.change(ctx, op, func(tx pgx.Tx) error {
		var err error
		id, err = rotateIn(ctx, tx, scope, retention)
		return err
	})
	if err != nil {
		return "", Change{}, err
	}
	return id, ch, nil
}

// rotateIn adds a content key of scope ("": the mesh's) inside tx and
// retires the scope's older keys after retention (more than 0); keys
// retired before now are deleted with their sealed copies. It returns the
// new key's id.
func rotateIn(ctx context.Context, tx pgx.Tx, scope string, retention time.Duration) (string, error) {
	var sc any // NULL for the mesh's keys
	if scope != "" {
		sc = scope
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM scopes WHERE name = $1)`, sc).Scan(&exists); err != nil {
			return "", err
		}
		if !exists {
			return "", &NotFoundError{What: fmt.Sprintf("scope %q", scope)}
		}
	}
	if _, err := tx.Exec(ctx, `DELETE FROM content_keys WHERE retire_at <= now()`); err != nil {
		return "", err
	}
	if _, err := tx.Exec(ctx, `UPDATE content_keys SET retire_at = now() + $1::interval
		WHERE retire_at IS NULL AND scope IS NOT DISTINCT FROM $2::text`,
		fmt.Sprintf("%d milliseconds", retention.Milliseconds()), sc); err != nil {
		return "", err
	}
	id := seal.NewContentKey().ID
	_, err := tx.Exec(ctx, `INSERT INTO content_keys (id, scope) VALUES ($1, $2::text)`, id, sc)
	return id, err
}

// Scopes lists the mesh's scopes with their members and bindings.
func (db *DB) Scopes(ctx context.Context) ([]cache.Scope, error) {
	var out []cache.Scope
	if err := loadScopes(ctx, db.pool, &out); err != nil {
		return nil, db.wrap("scopes", err)
	}
	return out, nil
}

// loadScopes reads every scope with its members and bindings.
func loadScopes(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, out *[]cache.Scope) error {
	var scopes []string
	if err := collect(ctx, q, &scopes, `SELECT name FROM scopes ORDER BY name`, nil,
		func(r pgx.Rows, s *string) error { return r.Scan(s) }); err != nil {
		return err
	}
	type member struct{ scope, node string }
	var members []member
	if err := collect(ctx, q, &members, `SELECT scope, node FROM scope_members ORDER BY scope, node`, nil,
		func(r pgx.Rows, m *member) error { return r.Scan(&m.scope, &m.node) }); err != nil {
		return err
	}
	type binding struct{ scope, kind, name string }
	var binds []binding
	if err := collect(ctx, q, &binds, `SELECT scope, kind, name FROM scope_bindings ORDER BY scope, kind, name`, nil,
		func(r pgx.Rows, b *binding) error { return r.Scan(&b.scope, &b.kind, &b.name) }); err != nil {
		return err
	}
	for _, name := range scopes {
		sc := cache.Scope{Name: name, Members: []string{}, Bindings: []cache.ScopeBinding{}}
		for _, m := range members {
			if m.scope == name {
				sc.Members = append(sc.Members, m.node)
			}
		}
		for _, b := range binds {
			if b.scope == name {
				sc.Bindings = append(sc.Bindings, cache.ScopeBinding{Kind: b.kind, Name: b.name})
			}
		}
		slices.Sort(sc.Members)
		*out = append(*out, sc)
	}
	return nil
}

// isForeignKey reports whether err is a foreign key violation.
func isForeignKey(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23503"
}
