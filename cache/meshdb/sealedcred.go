package meshdb

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/internal/seal"
)

// This file holds the sealed forms of a node's credential rows (migration
// 007): the admin seals what the node needs and keeps no plain text, the
// node opens its newest row when it loads its bindings.
//
//   - A generation handed out with a join token (node add, rejoin) has its
//     broker password sealed under the password of the token's database
//     login (seal.SealWithSecret); the login's role gets only a SCRAM
//     verifier (scram.go). The node opens it with the password of its
//     database URL.
//   - A generation made by rotate has both its broker password and its
//     database role's password sealed to the node's public key
//     (seal.SealTo, seal.CredentialInfo); the node opens them with its
//     private key (Options.NodeKey).
//
// Rows written before the migration keep their plain text, which a node
// reads as before, until a rotation revokes them.

// sealedSchema is the first schema version with sealed credential rows.
const sealedSchema = 7

// How a row is sealed (node_credentials.sealed_with).
const (
	sealedWithLogin   = "login"
	sealedWithNodeKey = "node_key"
)

// credentialRow is what a credential row stores of a generation's secrets.
type credentialRow struct {
	with         string // sealedWithLogin, sealedWithNodeKey, or "" for plain text
	sealedFor    string // fingerprint of the public key (sealedWithNodeKey)
	sealedBroker []byte
	sealedDB     []byte
}

// sealWithLogin seals the broker password of generation gen of node under
// the password of the generation's database login.
func sealWithLogin(node string, gen int, brokerPassword, loginPassword string) (credentialRow, error) {
	sb, err := seal.SealWithSecret([]byte(loginPassword), seal.CredentialInfo(node, gen, seal.PurposeBroker), []byte(brokerPassword))
	if err != nil {
		return credentialRow{}, err
	}
	return credentialRow{with: sealedWithLogin, sealedBroker: sb}, nil
}

// sealToNode seals the broker and database passwords of generation gen
// of node to its public key pub.
func sealToNode(node string, gen int, pub []byte, brokerPassword, dbPassword string) (credentialRow, error) {
	sb, err := seal.SealTo(pub, seal.CredentialInfo(node, gen, seal.PurposeBroker), []byte(brokerPassword))
	if err != nil {
		return credentialRow{}, err
	}
	sd, err := seal.SealTo(pub, seal.CredentialInfo(node, gen, seal.PurposeDatabase), []byte(dbPassword))
	if err != nil {
		return credentialRow{}, err
	}
	return credentialRow{with: sealedWithNodeKey, sealedFor: seal.Fingerprint(pub), sealedBroker: sb, sealedDB: sd}, nil
}

// insertCredential records generation gen of node's credential inside tx:
// its broker user, its database role (none: "") and its sealed secrets.
// The database must be migrated to sealed rows.
func insertCredential(ctx context.Context, tx pgx.Tx, node string, gen int, user, dbRole string, row credentialRow) error {
	v, err := schemaVersion(ctx, tx)
	if err != nil {
		return err
	}
	if v < sealedSchema {
		return fmt.Errorf("the mesh database has schema version %d; this meshbox keeps credentials sealed from version %d on: run meshbox init again to migrate it", v, sealedSchema)
	}
	var role *string
	if dbRole != "" {
		role = &dbRole
	}
	var sealedFor *string
	if row.sealedFor != "" {
		sealedFor = &row.sealedFor
	}
	_, err = tx.Exec(ctx, `INSERT INTO node_credentials (node, generation, broker_user, broker_password, db_role,
		sealed_with, sealed_for, sealed_broker_password, sealed_db_password) VALUES ($1, $2, $3, '', $4, $5, $6, $7, $8)`,
		node, gen, user, role, row.with, sealedFor, row.sealedBroker, row.sealedDB)
	return err
}

// nodePublicKey returns node's public key inside tx, or *NotFoundError
// for no such node, or ErrNoPublicKey when it has not published one.
func nodePublicKey(ctx context.Context, tx pgx.Tx, node string) ([]byte, error) {
	var pub []byte
	err := tx.QueryRow(ctx, `SELECT public_key FROM nodes WHERE name = $1`, node).Scan(&pub)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, &NotFoundError{What: fmt.Sprintf("node %q", node)}
	}
	if err != nil {
		return nil, err
	}
	if len(pub) == 0 {
		return nil, fmt.Errorf("node %q: %w: it publishes its key when it first runs; its new credential can be sealed to it only after", node, ErrNoPublicKey)
	}
	return pub, nil
}

// openCredential puts the secrets of row into c, generation c.Generation of
// node's credential: c keeps its plain text for a row from before sealing,
// a row sealed with the login is opened with the password of the DB's
// URL, a row sealed to a node key with Options.NodeKey. A row that does
// not open gives *CredentialSealedError.
func (db *DB) openCredential(node string, c *cache.BrokerCredential, row credentialRow) error {
	switch row.with {
	case "":
		return nil
	case sealedWithLogin:
		pw := db.connCfg.Password
		b, err := seal.OpenWithSecret([]byte(pw), seal.CredentialInfo(node, c.Generation, seal.PurposeBroker), row.sealedBroker)
		if err != nil {
			return &CredentialSealedError{Node: node, Generation: c.Generation}
		}
		c.Password = cache.Credential(b)
		if c.DBRole != "" {
			// A rejoin's generation: its role is the one of the URL.
			c.DBPassword = cache.Credential(pw)
		}
		return nil
	case sealedWithNodeKey:
		k := db.opts.NodeKey
		fail := &CredentialSealedError{Node: node, Generation: c.Generation, SealedFor: row.sealedFor}
		if k == nil {
			return fail
		}
		fail.NodeKey = k.Fingerprint()
		if k.Fingerprint() != row.sealedFor {
			return fail
		}
		b, err := k.Open(seal.CredentialInfo(node, c.Generation, seal.PurposeBroker), row.sealedBroker)
		if err != nil {
			return fail
		}
		c.Password = cache.Credential(b)
		if len(row.sealedDB) > 0 {
			d, err := k.Open(seal.CredentialInfo(node, c.Generation, seal.PurposeDatabase), row.sealedDB)
			if err != nil {
				return fail
			}
			c.DBPassword = cache.Credential(d)
		}
		return nil
	}
	return fmt.Errorf("credential generation %d: sealed with %q, which this meshbox does not know", c.Generation, row.with)
}
