package meshdb

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/internal/seal"
)

// This file holds the keys in the mesh database (migration 004): each
// node's public key in its record, the mesh's content keys by id, their
// sealed copies (one per key and node), and rotation. The database never
// holds a key it could use.
//
// Who seals a content key for a node that lacks it: any node that holds the
// key, when its bindings show a node record with a public key and no copy
// sealed to that key (package appliance/keys). No admin command is needed, and
// the admin (who holds the database's owner credential) never sees a key:
// a content key's bytes are made by the first node that claims its id
// (ClaimKey), and exist only on nodes and sealed in the database.
//
// Why a node may take a copy from any holder: the claim records the key's
// commitment (seal.ContentKey.Commitment, migration 009) in its row, which
// does not change while anyone holds the key and which every node reads.
// A node checks each copy it opens against it; a copy that does not open,
// or opens to other bytes, is refused and the node removes it
// (DropSealedKey), so that another holder seals the key again. A
// malicious holder can thus deny a node a key for a while (it can do as
// much by never sealing), never hand it another one. Keys claimed before
// commitments have none: nodes take them as before and list them in their
// status (KeysStatus.Uncommitted) until a rotation replaces them.

// DefaultKeyRetention is how long a rotated-out key still opens messages.
const DefaultKeyRetention = 24 * time.Hour

// PublishNodeKey sets node's public key in its record (a node role may set
// only its own: row-level security). Setting the key it has is no change.
func (db *DB) PublishNodeKey(ctx context.Context, node string, pub []byte) error {
	if err := seal.ValidatePublicKey(pub); err != nil {
		return fmt.Errorf("publish node key: %w", err)
	}
	enc := base64.StdEncoding.EncodeToString(pub)
	tag, err := db.pool.Exec(ctx, `UPDATE nodes SET public_key = $2 WHERE name = $1 AND public_key IS DISTINCT FROM $2`,
		node, pub)
	if err != nil {
		return db.wrap("publish node key", err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var have []byte
	err = db.pool.QueryRow(ctx, `SELECT public_key FROM nodes WHERE name = $1`, node).Scan(&have)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("publish node key: %w", &NotFoundError{What: fmt.Sprintf("node %q", node)})
	case err != nil:
		return db.wrap("publish node key", err)
	case base64.StdEncoding.EncodeToString(have) != enc:
		return fmt.Errorf("publish node key: node %q's record was not changed: this database role may not set it", node)
	}
	return nil
}

// PublishSigningKey sets node's signing (Ed25519 public) key in its record:
// a node role may set only its own (meshbox_publish_signing_key), and
// setting the key it has is no change. A database older than signing keys
// (migration 8) is left as it is: the node's peers then take its discovery
// messages unsigned, as before.
func (db *DB) PublishSigningKey(ctx context.Context, node string, pub []byte) error {
	if err := seal.ValidateSigningKey(pub); err != nil {
		return fmt.Errorf("publish signing key: %w", err)
	}
	if v, err := schemaVersion(ctx, db.pool); err != nil {
		return db.wrap("publish signing key", err)
	} else if v < signingKeysSchema {
		return nil
	}
	var ok bool
	if err := db.pool.QueryRow(ctx, `SELECT meshbox_publish_signing_key($1, $2)`, node, pub).Scan(&ok); err != nil {
		return db.wrap("publish signing key", err)
	}
	if !ok {
		return fmt.Errorf("publish signing key: node %q's record was not changed: it has none, or this database role may not set it", node)
	}
	return nil
}

// signingKeysSchema is the first schema version with the nodes' signing
// keys (migration 008).
const signingKeysSchema = 8

// loadSigningKeys fills in every node record's signing key, inside Load's
// transaction. A database older than them leaves the records without.
func loadSigningKeys(ctx context.Context, tx pgx.Tx, b *cache.Bindings) error {
	v, err := schemaVersion(ctx, tx)
	if err != nil || v < signingKeysSchema {
		return err
	}
	type key struct {
		node string
		pub  []byte
	}
	var keys []key
	if err := collect(ctx, tx, &keys, `SELECT name, signing_key FROM nodes WHERE signing_key IS NOT NULL`, nil,
		func(r pgx.Rows, k *key) error { return r.Scan(&k.node, &k.pub) }); err != nil {
		return err
	}
	at := make(map[string]int, len(b.Nodes))
	for i, n := range b.Nodes {
		at[n.Name] = i
	}
	for _, k := range keys {
		if i, ok := at[k.node]; ok {
			b.Nodes[i].SigningKey = base64.StdEncoding.EncodeToString(k.pub)
		}
	}
	return nil
}

// ClaimKey stores the first sealed copy of content key id, sealed to node's
// own public key (fingerprint fpr), and the key's commitment
// (seal.ContentKey.Commitment): node made the key's bytes. node must be
// the node of this database role (or the role owns the mesh's tables). It
// reports false when another node holds the key already. A database older
// than commitments (migration 9) stores the copy without.
func (db *DB) ClaimKey(ctx context.Context, id, node, fpr string, sealed, commitment []byte) (bool, error) {
	v, err := schemaVersion(ctx, db.pool)
	if err != nil {
		return false, db.wrap("claim content key", err)
	}
	q, args := `SELECT meshbox_claim_key($1, $2, $3, $4, $5)`, []any{id, node, fpr, sealed, commitment}
	if v < commitmentsSchema {
		q, args = `SELECT meshbox_claim_key($1, $2, $3, $4)`, args[:4]
	}
	var ok bool
	if err := db.pool.QueryRow(ctx, q, args...).Scan(&ok); err != nil {
		return false, db.wrap("claim content key", err)
	}
	return ok, nil
}

// commitmentsSchema is the first schema version with the content keys'
// commitments (migration 009).
const commitmentsSchema = 9

// DropSealedKey removes node's own copy of content key id, if its sealed
// bytes are still sealed (another copy stored since stays): the node
// refused it, and a holder seals the key for it again. node must be the
// node of this database role (or the role owns the mesh's tables). It
// reports whether it removed the copy; a database older than commitments
// removes nothing.
func (db *DB) DropSealedKey(ctx context.Context, id, node string, sealed []byte) (bool, error) {
	if v, err := schemaVersion(ctx, db.pool); err != nil {
		return false, db.wrap("drop sealed content key", err)
	} else if v < commitmentsSchema {
		return false, nil
	}
	sum := sha256.Sum256(sealed)
	var ok bool
	if err := db.pool.QueryRow(ctx, `SELECT meshbox_drop_sealed_key($1, $2, $3)`, id, node, sum[:]).Scan(&ok); err != nil {
		return false, db.wrap("drop sealed content key", err)
	}
	return ok, nil
}

// PutSealedKey stores a copy of content key id sealed for node target (to
// its public key of fingerprint fpr) by node by, which must hold the key
// (and be this database role's node, or the role owns the mesh's tables).
// It reports whether it wrote (false: a copy sealed to that key is there
// already, by holds no copy, or target's key is another now).
func (db *DB) PutSealedKey(ctx context.Context, id, by, target, fpr string, sealed []byte) (bool, error) {
	var ok bool
	if err := db.pool.QueryRow(ctx, `SELECT meshbox_put_sealed_key($1, $2, $3, $4, $5)`, id, by, target, fpr, sealed).Scan(&ok); err != nil {
		return false, db.wrap("store sealed content key", err)
	}
	return ok, nil
}

// MarkKeyOpened records that node opens messages with content key id now,
// with its copy sealed to its public key of fingerprint fpr. It reports
// whether that changed anything.
func (db *DB) MarkKeyOpened(ctx context.Context, id, node, fpr string) (bool, error) {
	var ok bool
	if err := db.pool.QueryRow(ctx, `SELECT meshbox_key_opened($1, $2, $3)`, id, node, fpr).Scan(&ok); err != nil {
		return false, db.wrap("mark content key opened", err)
	}
	return ok, nil
}

// RotateKey adds a new content key id and sets every older key that is not
// retiring yet to retire after retention (0: DefaultKeyRetention). Nodes
// seal with the new key once every node with a public key holds it, and
// forget the old ones when they retire. Keys retired before now are
// deleted with their sealed copies. Scopes' keys are rotated on their own
// (RotateScopeKey).
func (db *DB) RotateKey(ctx context.Context, retention time.Duration) (string, Change, error) {
	return db.rotate(ctx, "rotate content key", "", retention)
}

// ContentKeys lists the mesh's content keys with their holders.
func (db *DB) ContentKeys(ctx context.Context) ([]cache.ContentKey, []cache.KeyHolder, error) {
	var keys []cache.ContentKey
	if err := collect(ctx, db.pool, &keys, `SELECT id, COALESCE(scope, ''), created_at, retire_at FROM content_keys ORDER BY created_at, id`, nil,
		func(r pgx.Rows, k *cache.ContentKey) error { return r.Scan(&k.ID, &k.Scope, &k.CreatedAt, &k.RetireAt) }); err != nil {
		return nil, nil, db.wrap("content keys", err)
	}
	if err := markCompromised(ctx, db.pool, keys); err != nil {
		return nil, nil, db.wrap("content keys", err)
	}
	var holders []cache.KeyHolder
	if err := collect(ctx, db.pool, &holders, `SELECT key_id, node, sealed_for, opened FROM meshbox_key_holders()`, nil,
		func(r pgx.Rows, h *cache.KeyHolder) error { return r.Scan(&h.KeyID, &h.Node, &h.SealedFor, &h.Opened) }); err != nil {
		return nil, nil, db.wrap("content keys", err)
	}
	return keys, holders, nil
}

// loadKeys reads the key part of node's bindings into b, inside Load's
// transaction.
func loadKeys(ctx context.Context, tx pgx.Tx, node string, b *cache.Bindings) error {
	if err := collect(ctx, tx, &b.ContentKeys, `SELECT id, COALESCE(scope, ''), created_at, retire_at FROM content_keys ORDER BY id`, nil,
		func(r pgx.Rows, k *cache.ContentKey) error { return r.Scan(&k.ID, &k.Scope, &k.CreatedAt, &k.RetireAt) }); err != nil {
		return fmt.Errorf("content keys: %w", err)
	}
	if err := loadScopes(ctx, tx, &b.Scopes); err != nil {
		return fmt.Errorf("scopes: %w", err)
	}
	if err := collect(ctx, tx, &b.SealedKeys, `SELECT key_id, sealed_for, sealed FROM sealed_keys WHERE node = $1 ORDER BY key_id`, []any{node},
		func(r pgx.Rows, k *cache.SealedKey) error { return r.Scan(&k.ID, &k.SealedFor, &k.Sealed) }); err != nil {
		return fmt.Errorf("sealed keys: %w", err)
	}
	if err := collect(ctx, tx, &b.KeyHolders, `SELECT key_id, node, sealed_for, opened FROM meshbox_key_holders()`, nil,
		func(r pgx.Rows, h *cache.KeyHolder) error { return r.Scan(&h.KeyID, &h.Node, &h.SealedFor, &h.Opened) }); err != nil {
		return fmt.Errorf("key holders: %w", err)
	}
	if err := loadCommitments(ctx, tx, node, b); err != nil {
		return fmt.Errorf("key commitments: %w", err)
	}
	if err := loadCompromised(ctx, tx, b); err != nil {
		return fmt.Errorf("compromised keys: %w", err)
	}
	return nil
}

// loadCommitments fills in the content keys' commitments and who sealed
// node's copies, inside Load's transaction. A database older than
// commitments leaves them empty.
func loadCommitments(ctx context.Context, tx pgx.Tx, node string, b *cache.Bindings) error {
	v, err := schemaVersion(ctx, tx)
	if err != nil || v < commitmentsSchema {
		return err
	}
	type row struct {
		id, by string
		sum    []byte
	}
	var keys, copies []row
	if err := collect(ctx, tx, &keys, `SELECT id, commitment FROM content_keys WHERE commitment IS NOT NULL`, nil,
		func(r pgx.Rows, k *row) error { return r.Scan(&k.id, &k.sum) }); err != nil {
		return err
	}
	if err := collect(ctx, tx, &copies, `SELECT key_id, sealed_by FROM sealed_keys WHERE node = $1`, []any{node},
		func(r pgx.Rows, k *row) error { return r.Scan(&k.id, &k.by) }); err != nil {
		return err
	}
	commitments, by := map[string][]byte{}, map[string]string{}
	for _, k := range keys {
		commitments[k.id] = k.sum
	}
	for _, k := range copies {
		by[k.id] = k.by
	}
	for i, k := range b.ContentKeys {
		b.ContentKeys[i].Commitment = commitments[k.ID]
	}
	for i, k := range b.SealedKeys {
		b.SealedKeys[i].SealedBy = by[k.ID]
	}
	return nil
}
