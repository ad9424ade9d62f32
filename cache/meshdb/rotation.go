package meshdb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// This file holds the database side of rotating a node's broker
// credential (migration 003): the admin adds generation k+1 to the node's
// own credential rows, the node reads it with its bindings, connects with
// it and records that it switched (CredentialSwitched, through a function
// that lets a node role touch only its own row), and only then does the
// admin delete generation k's row and broker user.

// CredentialGeneration is one generation of a node's broker credential as
// the admin sees it: no password.
type CredentialGeneration struct {
	Node       string
	Generation int
	User       string
	CreatedAt  time.Time
	SwitchedAt time.Time // zero: the node has not connected with it yet
}

// Switched reports whether the node recorded that it connects with this
// generation.
func (g CredentialGeneration) Switched() bool { return !g.SwitchedAt.IsZero() }

// CredentialGenerations returns the broker credential generations of node
// (every node's with node ""), by node and then oldest first.
func (db *DB) CredentialGenerations(ctx context.Context, node string) ([]CredentialGeneration, error) {
	var out []CredentialGeneration
	err := collect(ctx, db.pool, &out, `SELECT node, generation, broker_user, created_at, switched_at FROM node_credentials
		WHERE $1 = '' OR node = $1 ORDER BY node, generation`, []any{node},
		func(r pgx.Rows, g *CredentialGeneration) error {
			var sw *time.Time
			err := r.Scan(&g.Node, &g.Generation, &g.User, &g.CreatedAt, &sw)
			if sw != nil {
				g.SwitchedAt = *sw
			}
			return err
		})
	if err != nil {
		return nil, db.wrap("read credential generations", err)
	}
	return out, nil
}

// AddCredentialGeneration records a new generation of node's credential
// in the node's own row, in one transaction: the broker user made on the
// broker (cred) and a new database login role for the node, with a random
// password and the same rights as its others, both passwords sealed to the
// node's public key (sealedcred.go). The node takes both with its
// bindings. The generation must be newer than every one recorded (else
// *ExistsError); an unknown node gives *NotFoundError, a node that has
// not published its public key ErrNoPublicKey. It returns the new role's
// name.
func (db *DB) AddCredentialGeneration(ctx context.Context, node string, cred BrokerCredential) (Change, string, error) {
	if cred.Generation < 1 || cred.User == "" || cred.Password == "" {
		return Change{}, "", errors.New("add credential generation: incomplete credential")
	}
	var role string
	ch, err := db.change(ctx, "add credential generation", func(tx pgx.Tx) error {
		pub, err := nodePublicKey(ctx, tx, node)
		if err != nil {
			return err
		}
		role, _, err = addGeneration(ctx, tx, node, cred, func(rolePassword string) (credentialRow, error) {
			return sealToNode(node, cred.Generation, pub, cred.Password.Reveal(), rolePassword)
		})
		return err
	})
	if err != nil {
		return Change{}, "", err
	}
	return ch, role, nil
}

// addGeneration adds generation cred of node's credential inside tx, with
// a new login role, and returns the role and its password. sealed makes
// the row's secrets from the role's password. The node must exist and cred
// be newer than its newest generation.
func addGeneration(ctx context.Context, tx pgx.Tx, node string, cred BrokerCredential,
	sealed func(rolePassword string) (credentialRow, error)) (role, rolePassword string, err error) {
	var exists bool
	var newest *int
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM nodes WHERE name = $1),
		(SELECT max(generation) FROM node_credentials WHERE node = $1)`, node).Scan(&exists, &newest); err != nil {
		return "", "", err
	}
	if !exists {
		return "", "", &NotFoundError{What: fmt.Sprintf("node %q", node)}
	}
	if newest != nil && *newest >= cred.Generation {
		return "", "", &ExistsError{What: fmt.Sprintf("generation %d of node %q's credential (newest is %d)", cred.Generation, node, *newest)}
	}
	role, rolePassword = roleName(node), randomText(32)
	if err := createNodeRole(ctx, tx, node, role, rolePassword); err != nil {
		return "", "", err
	}
	row, err := sealed(rolePassword)
	if err != nil {
		return "", "", err
	}
	return role, rolePassword, insertCredential(ctx, tx, node, cred.Generation, cred.User, role, row)
}

// ReissueJoin gives an existing node a new generation of its credential —
// cred, whose broker user the admin made first, and a new login role —
// and a join token whose database URL is adminURL with that role, in one
// transaction. It is the way back for a node whose machine lost its
// configuration, or that rotate --force locked out: its record,
// assignments, overrides and grants stay. The older generations stay valid
// until the caller revokes them (DeleteCredentialGeneration).
func (db *DB) ReissueJoin(ctx context.Context, adminURL, node string, cred BrokerCredential, ttl time.Duration) (AddedNode, error) {
	if cred.Generation < 1 || cred.User == "" || cred.Password == "" {
		return AddedNode{}, errors.New("reissue join token: incomplete credential")
	}
	if ttl <= 0 {
		ttl = DefaultJoinTTL
	}
	var out AddedNode
	var err error
	out.Change, err = db.change(ctx, "reissue join token", func(tx pgx.Tx) error {
		// Like a first generation's, sealed under the token's login: the
		// machine may have lost its key.
		role, rolePassword, err := addGeneration(ctx, tx, node, cred, func(rolePassword string) (credentialRow, error) {
			return sealWithLogin(node, cred.Generation, cred.Password.Reveal(), rolePassword)
		})
		if err != nil {
			return err
		}
		out.Role = role
		out.Token, err = insertJoinToken(ctx, tx, adminURL, node, role, rolePassword, ttl)
		return err
	})
	if err != nil {
		return AddedNode{}, err
	}
	return out, nil
}

// Revoked is what DeleteCredentialGeneration did on the database side.
type Revoked struct {
	// Roles are the login roles dropped.
	Roles []string
	// Lingering counts the sessions of those roles still running: ending
	// them needs a superuser or a member of pg_signal_backend, and a
	// dropped role's session otherwise goes on until it ends.
	Lingering int
	// EndErr is why the sessions could not be looked up or ended, if so.
	EndErr error
}

// DeleteCredentialGeneration revokes a generation on the database side
// (after its broker user was deleted): its row goes, and so does every
// login role of the node that no remaining generation names (the
// generation's own, or for a generation made by node add, the role of the
// join token) — but only when a remaining generation has a role to log in
// with. It then ends the dropped roles' sessions where the admin may, and
// reports those it could not end. A row that does not exist changes
// nothing.
func (db *DB) DeleteCredentialGeneration(ctx context.Context, node string, gen int) (Change, Revoked, error) {
	var dropped []string
	ch, err := db.change(ctx, "delete credential generation", func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM node_credentials WHERE node = $1 AND generation = $2`, node, gen); err != nil {
			return err
		}
		err := collect(ctx, tx, &dropped, `SELECT r.role FROM node_roles r WHERE r.node = $1
			AND EXISTS (SELECT 1 FROM node_credentials c WHERE c.node = $1 AND c.db_role IS NOT NULL)
			AND r.role NOT IN (SELECT c.db_role FROM node_credentials c WHERE c.node = $1 AND c.db_role IS NOT NULL)
			ORDER BY r.role`, []any{node}, func(r pgx.Rows, s *string) error { return r.Scan(s) })
		if err != nil {
			return err
		}
		for _, r := range dropped {
			if err := dropRole(ctx, tx, r); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return Change{}, Revoked{}, err
	}
	rev := Revoked{Roles: dropped}
	if len(dropped) > 0 {
		// pg_terminate_backend refuses (false, or an error) what the
		// admin may not end: count what is left rather than guess.
		rev.EndErr = db.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE NOT pg_terminate_backend(pid))
			FROM pg_stat_activity WHERE usename = ANY($1)`, dropped).Scan(&rev.Lingering)
	}
	return ch, rev, nil
}

// CredentialSwitched records, as the node role the DB is connected as,
// that the node now connects to the broker with generation gen of its
// credential. It returns *NotFoundError when the node has no such
// generation (or the DB is not connected as a node role).
func (db *DB) CredentialSwitched(ctx context.Context, gen int) error {
	var ok bool
	if err := db.pool.QueryRow(ctx, `SELECT meshbox_credential_switched($1)`, gen).Scan(&ok); err != nil {
		return db.wrap("record credential switch", err)
	}
	if !ok {
		return fmt.Errorf("record credential switch: %w", &NotFoundError{What: fmt.Sprintf("credential generation %d of this node", gen)})
	}
	return nil
}

// SetNodeStages replaces the stage allow-list of a node ("*": all; none:
// no stage); an unknown node gives *NotFoundError.
func (db *DB) SetNodeStages(ctx context.Context, node string, stages []string) (Change, error) {
	stages, err := validStages(stages)
	if err != nil {
		return Change{}, fmt.Errorf("set stages: %w", err)
	}
	return db.change(ctx, "set stages", func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE nodes SET stages = $2 WHERE name = $1`, node, stages)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return &NotFoundError{What: fmt.Sprintf("node %q", node)}
		}
		return nil
	})
}
