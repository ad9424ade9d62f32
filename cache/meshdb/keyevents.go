package meshdb

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/meshbox/meshbox/cache"
)

// This file holds the history of the mesh's keys and the response to a
// compromised node (migration 011). The history is written by triggers on
// the key tables, so every way a key changes records the same events
// (KeyEvent); RemoveCompromised removes a node and rotates every key it
// held in one transaction, marking those keys compromised: no node seals
// with them any more, and members open with them until they retire.

// keyEventsSchema is the first schema version with key events and
// compromised keys (migration 011).
const keyEventsSchema = 11

// Kinds of key events (KeyEvent.Kind).
const (
	KeyMade      = "made"      // a node made the key's bytes (its first copy)
	KeySealed    = "sealed"    // a holder sealed the key for a node, or for the recovery kit
	KeyRotated   = "rotated"   // a key added beside older ones, which retire
	KeyRetired   = "retired"   // the key's retention ended: nodes forget it
	KeyRecovered = "recovered" // the key sealed for a node with the recovery kit
	KeyRevoked   = "revoked"   // a node's copy withdrawn (removed, left its scope)
)

// KeyEventKinds are the kinds of key events, in the order the docs list
// them.
var KeyEventKinds = []string{KeyMade, KeySealed, KeyRotated, KeyRetired, KeyRecovered, KeyRevoked}

// KeyEvent is one event in the history of the mesh's keys.
type KeyEvent struct {
	At    time.Time `json:"at"`
	Kind  string    `json:"kind"`
	Key   string    `json:"key,omitempty"`   // "": an event of a node, not of one key
	Scope string    `json:"scope,omitempty"` // "": the mesh's key
	// Holder is the node (or KitSealedBy) that holds or held the copy.
	Holder string `json:"holder,omitempty"`
	// By is the node or database role that did it.
	By     string `json:"by"`
	Detail string `json:"detail,omitempty"`
}

// KeyHistory returns the history of the mesh's keys, oldest first: every
// recorded event, and a retired event for each key still listed whose
// retention ended. A database older than the history gives an error that
// says how to upgrade it.
func (db *DB) KeyHistory(ctx context.Context) ([]KeyEvent, error) {
	if v, err := schemaVersion(ctx, db.pool); err != nil {
		return nil, db.wrap("key history", err)
	} else if v < keyEventsSchema {
		return nil, fmt.Errorf("key history: the mesh database (schema %d) records no key events yet: run meshbox init against it once to upgrade it", v)
	}
	var out []KeyEvent
	err := collect(ctx, db.pool, &out, `SELECT at, kind, COALESCE(key_id, ''), COALESCE(scope, ''), COALESCE(holder, ''), by_whom, detail, id FROM key_events
		UNION ALL
		SELECT retire_at, 'retired', id, COALESCE(scope, ''), '', '', 'its retention ended', 0 FROM content_keys WHERE retire_at <= now()
		ORDER BY 1, 8`, nil,
		func(r pgx.Rows, e *KeyEvent) error {
			var id int64
			return r.Scan(&e.At, &e.Kind, &e.Key, &e.Scope, &e.Holder, &e.By, &e.Detail, &id)
		})
	if err != nil {
		return nil, db.wrap("key history", err)
	}
	return out, nil
}

// KeyMembers returns the nodes that may hold content key id (every node,
// or its scope's members) and have a public key: those a holder seals it
// for, and that must open with it before the nodes seal with it.
func (db *DB) KeyMembers(ctx context.Context, id string) ([]string, error) {
	var out []string
	if err := collect(ctx, db.pool, &out, `SELECT name FROM nodes WHERE public_key IS NOT NULL AND meshbox_key_member($1, name) ORDER BY name`,
		[]any{id}, func(r pgx.Rows, s *string) error { return r.Scan(s) }); err != nil {
		return nil, db.wrap("key members", err)
	}
	return out, nil
}

// Compromise is what RemoveCompromised did.
type Compromise struct {
	Change Change
	// Scopes are the scopes the node was in, whose keys were rotated.
	Scopes []string
	// Compromised are the keys the node held or could hold, now marked:
	// no node seals with them, members open with them until they retire.
	Compromised []string
	// NewKeys are the keys that replace them, by scope ("": the mesh's).
	NewKeys map[string]string
	// RetireAt is when the compromised keys that were not retiring yet
	// retire.
	RetireAt time.Time
	// Sessions is what became of the database sessions of the node's
	// dropped roles (Roles, Lingering, EndErr).
	Sessions Revoked
}

// RemoveCompromised removes node name as RemoveNode does (its record,
// database roles and sealed copies; force: its bindings too) and, in the
// same transaction, marks every key it held or could hold compromised
// (the mesh's active keys and those of each scope it was in), rotates the
// mesh's key and each of those scopes' keys, retiring the old keys after
// retention (0: DefaultKeyRetention), and records the events with the
// reason. Nodes then seal only with the new keys, once every remaining
// node holds them (package appliance/keys); the removed node's files open
// none of them: they are made after it lost its record, and sealed only
// for the nodes that have one.
func (db *DB) RemoveCompromised(ctx context.Context, name string, force bool, retention time.Duration) (Compromise, error) {
	if err := cache.ValidateNodeName(name); err != nil {
		return Compromise{}, fmt.Errorf("remove compromised node: %w", err)
	}
	if retention <= 0 {
		retention = DefaultKeyRetention
	}
	if v, err := schemaVersion(ctx, db.pool); err != nil {
		return Compromise{}, db.wrap("remove compromised node", err)
	} else if v < keyEventsSchema {
		return Compromise{}, fmt.Errorf("remove compromised node: the mesh database (schema %d) cannot mark keys compromised yet: run meshbox init against it once to upgrade it", v)
	}
	out := Compromise{NewKeys: map[string]string{}}
	var err error
	out.Change, err = db.change(ctx, "remove compromised node", func(tx pgx.Tx) error {
		if err := collect(ctx, tx, &out.Scopes, `SELECT scope FROM scope_members WHERE node = $1 ORDER BY scope`, []any{name},
			func(r pgx.Rows, s *string) error { return r.Scan(s) }); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT set_config('meshbox.key_event_reason', $1, true)`,
			fmt.Sprintf("node %s removed as compromised", name)); err != nil {
			return err
		}
		if err := collect(ctx, tx, &out.Sessions.Roles, `SELECT role FROM node_roles WHERE node = $1 ORDER BY role`, []any{name},
			func(r pgx.Rows, s *string) error { return r.Scan(s) }); err != nil {
			return err
		}
		if err := removeNode(ctx, tx, name, force); err != nil {
			return err
		}
		if err := collect(ctx, tx, &out.Compromised, `UPDATE content_keys SET compromised = true
			WHERE (retire_at IS NULL OR retire_at > now()) AND (scope IS NULL OR scope = ANY($1))
			RETURNING id`, []any{out.Scopes}, func(r pgx.Rows, s *string) error { return r.Scan(s) }); err != nil {
			return err
		}
		slices.Sort(out.Compromised)
		for _, sc := range append([]string{""}, out.Scopes...) {
			id, err := rotateIn(ctx, tx, sc, retention)
			if err != nil {
				return err
			}
			out.NewKeys[sc] = id
		}
		if err := tx.QueryRow(ctx, `SELECT now() + $1::interval`, fmt.Sprintf("%d milliseconds", retention.Milliseconds())).Scan(&out.RetireAt); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO key_events (kind, holder, by_whom, detail) VALUES ('revoked', $1, session_user, $2)`,
			name, fmt.Sprintf("node %s removed as compromised: its credentials and copies revoked, keys %s marked compromised and rotated", name, strings.Join(out.Compromised, ", ")))
		return err
	})
	if err != nil {
		return Compromise{}, err
	}
	if len(out.Sessions.Roles) > 0 {
		// As DeleteCredentialGeneration: count what the admin may not end.
		out.Sessions.EndErr = db.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE NOT pg_terminate_backend(pid))
			FROM pg_stat_activity WHERE usename = ANY($1)`, out.Sessions.Roles).Scan(&out.Sessions.Lingering)
	}
	return out, nil
}

// loadCompromised marks the content keys a compromised node held, inside
// Load's transaction.
func loadCompromised(ctx context.Context, tx pgx.Tx, b *cache.Bindings) error {
	return markCompromised(ctx, tx, b.ContentKeys)
}

// markCompromised sets Compromised on the keys a compromised node held. A
// database older than compromise response marks none.
func markCompromised(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
	QueryRow(context.Context, string, ...any) pgx.Row
}, keys []cache.ContentKey) error {
	v, err := schemaVersion(ctx, q)
	if err != nil || v < keyEventsSchema {
		return err
	}
	var ids []string
	if err := collect(ctx, q, &ids, `SELECT id FROM content_keys WHERE compromised`, nil,
		func(r pgx.Rows, s *string) error { return r.Scan(s) }); err != nil {
		return err
	}
	for i, k := range keys {
		keys[i].Compromised = slices.Contains(ids, k.ID)
	}
	return nil
}
