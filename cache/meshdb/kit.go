package meshdb

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/meshbox/meshbox/internal/seal"
)

// This file holds the recovery kit's part of the mesh database (migration
// 010): the kit's public key, and each content key sealed to it. Nodes
// that hold a key seal it for the kit as they seal it for other nodes
// (package appliance/keys); the admin who holds the kit opens those
// copies to seal the keys for a new node (SealForNewNode) when no node
// that holds them is running. The database never holds the kit's secret.

// kitSchema is the first schema version with the recovery kit.
const kitSchema = 10

// KitSealedBy is what a sealed copy made with the recovery kit names as
// its sealer.
const KitSealedBy = "recovery-kit"

// MeshID is the name of the mesh in its recovery kit: a random id the
// mesh database was given when it was made.
func (db *DB) MeshID(ctx context.Context) (string, error) {
	var id string
	if err := db.pool.QueryRow(ctx, `SELECT mesh_id FROM mesh_info`).Scan(&id); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return "", fmt.Errorf("mesh id: %w (run meshbox init first)", &NotFoundError{What: "the mesh"})
		}
		return "", db.wrap("mesh id", err)
	}
	return id, nil
}

// SetRecoveryKit stores pub as the public key of the mesh's recovery kit.
// A mesh that has another kit gives *ExistsError unless replace is set;
// replacing one deletes the copies sealed to the old kit, and the nodes
// that hold the keys seal them for the new one.
func (db *DB) SetRecoveryKit(ctx context.Context, pub []byte, replace bool) (Change, error) {
	if err := seal.ValidatePublicKey(pub); err != nil {
		return Change{}, fmt.Errorf("set recovery kit: %w", err)
	}
	fpr := seal.Fingerprint(pub)
	return db.change(ctx, "set recovery kit", func(tx pgx.Tx) error {
		var have string
		err := tx.QueryRow(ctx, `SELECT fingerprint FROM recovery_kit FOR UPDATE`).Scan(&have)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return err
		case have == fpr:
			return nil
		case !replace:
			return &ExistsError{What: fmt.Sprintf("a recovery kit (%s)", have)}
		}
		if _, err := tx.Exec(ctx, `DELETE FROM kit_sealed_keys WHERE sealed_for <> $1`, fpr); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO recovery_kit (public_key, fingerprint) VALUES ($1, $2)
			ON CONFLICT (singleton) DO UPDATE SET public_key = EXCLUDED.public_key, fingerprint = EXCLUDED.fingerprint, created_at = now()`,
			pub, fpr)
		return err
	})
}

// RecoveryKit returns the public key of the mesh's recovery kit (nil: it
// has none) and, by key id, the fingerprint of the kit each content key
// is sealed to. node is the caller's node (any, for the tables' owner). A
// database older than the kit has none.
func (db *DB) RecoveryKit(ctx context.Context, node string) (pub []byte, copies map[string]string, err error) {
	if v, err := schemaVersion(ctx, db.pool); err != nil {
		return nil, nil, db.wrap("recovery kit", err)
	} else if v < kitSchema {
		return nil, nil, nil
	}
	if err := db.pool.QueryRow(ctx, `SELECT meshbox_kit_public($1)`, node).Scan(&pub); err != nil {
		return nil, nil, db.wrap("recovery kit", err)
	}
	type row struct{ id, fpr string }
	var rows []row
	if err := collect(ctx, db.pool, &rows, `SELECT key_id, sealed_for FROM meshbox_kit_copies($1)`, []any{node},
		func(r pgx.Rows, k *row) error { return r.Scan(&k.id, &k.fpr) }); err != nil {
		return nil, nil, db.wrap("recovery kit", err)
	}
	copies = make(map[string]string, len(rows))
	for _, r := range rows {
		copies[r.id] = r.fpr
	}
	return pub, copies, nil
}

// PutKitKey stores a copy of content key id sealed to the recovery kit
// (of fingerprint fpr) by node by, which must hold the key (and be this
// database role's node, or the role owns the mesh's tables). It reports
// whether it wrote (false: a copy sealed to that kit is there already, by
// holds no copy, or the kit is another now).
func (db *DB) PutKitKey(ctx context.Context, id, by, fpr string, sealed []byte) (bool, error) {
	var ok bool
	if err := db.pool.QueryRow(ctx, `SELECT meshbox_put_kit_key($1, $2, $3, $4)`, id, by, fpr, sealed).Scan(&ok); err != nil {
		return false, db.wrap("store content key sealed to the recovery kit", err)
	}
	return ok, nil
}

// KitCopy is a content key sealed to the recovery kit, as the admin reads
// it to open it with the kit.
type KitCopy struct {
	ID         string
	Scope      string // "": the mesh's
	SealedFor  string // fingerprint of the kit it is sealed to
	Sealed     []byte
	Commitment []byte
}

// KitKeysFor returns the content keys node may hold that are not retired
// (the mesh's, those of the scopes it is in, and those of scopes, which
// it is about to join), each with its copy sealed to the kit; a key
// without one has no Sealed (nobody sealed it for the kit yet: no node
// held it since the kit was made). It needs the tables' owner.
func (db *DB) KitKeysFor(ctx context.Context, node string, scopes []string) ([]KitCopy, error) {
	var out []KitCopy
	if err := collect(ctx, db.pool, &out, `SELECT k.id, COALESCE(k.scope, ''), COALESCE(s.sealed_for, ''), s.sealed, k.commitment
		FROM content_keys k LEFT JOIN kit_sealed_keys s ON s.key_id = k.id
		WHERE (k.retire_at IS NULL OR k.retire_at > now()) AND (meshbox_key_member(k.id, $1) OR k.scope = ANY($2))
		ORDER BY k.created_at, k.id`, []any{node, scopes},
		func(r pgx.Rows, c *KitCopy) error {
			return r.Scan(&c.ID, &c.Scope, &c.SealedFor, &c.Sealed, &c.Commitment)
		}); err != nil {
		return nil, db.wrap("content keys sealed to the recovery kit", err)
	}
	return out, nil
}

// SealedCopy is a content key sealed for a node.
type SealedCopy struct {
	ID     string
	Sealed []byte
}

// SealForNewNode publishes pub as node's public key and stores copies,
// each sealed to it, as the node's copies sealed with the recovery kit
// (KitSealedBy), in one transaction. The node must have no public key
// yet: a node that published its own is sealed for by its peers. It
// needs the tables' owner.
func (db *DB) SealForNewNode(ctx context.Context, node string, pub []byte, copies []SealedCopy) (Change, error) {
	if err := seal.ValidatePublicKey(pub); err != nil {
		return Change{}, fmt.Errorf("seal keys for node: %w", err)
	}
	fpr := seal.Fingerprint(pub)
	return db.change(ctx, "seal keys for node", func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE nodes SET public_key = $2 WHERE name = $1 AND public_key IS NULL`, node, pub)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("node %q is unknown or has a public key already", node)
		}
		for _, c := range copies {
			if _, err := tx.Exec(ctx, `INSERT INTO sealed_keys (key_id, node, sealed_for, sealed, sealed_by) VALUES ($1, $2, $3, $4, $5)`,
				c.ID, node, fpr, c.Sealed, KitSealedBy); err != nil {
				return err
			}
		}
		return nil
	})
}

// HeldCopy is a node's sealed copy of a content key, with the key's
// commitment.
type HeldCopy struct {
	ID         string
	SealedFor  string
	Sealed     []byte
	Commitment []byte
}

// CopiesOf returns node's sealed copies of the content keys not retired,
// for its administrator to open with the node's key (`meshbox mesh kit
// --data`). It needs the tables' owner, or node's own role.
func (db *DB) CopiesOf(ctx context.Context, node string) ([]HeldCopy, error) {
	var out []HeldCopy
	if err := collect(ctx, db.pool, &out, `SELECT s.key_id, s.sealed_for, s.sealed, k.commitment
		FROM sealed_keys s JOIN content_keys k ON k.id = s.key_id
		WHERE s.node = $1 AND (k.retire_at IS NULL OR k.retire_at > now()) ORDER BY k.created_at, k.id`, []any{node},
		func(r pgx.Rows, c *HeldCopy) error { return r.Scan(&c.ID, &c.SealedFor, &c.Sealed, &c.Commitment) }); err != nil {
		return nil, db.wrap("sealed copies of node", err)
	}
	return out, nil
}
