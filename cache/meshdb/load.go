package meshdb

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/internal/backoff"
)

// Load reads node's bindings in one REPEATABLE READ, read-only transaction:
// the mesh revision, every node record and mesh setting, and only this
// node's assignments, overrides and grants (consumer = node) and its newest
// broker credential, opened if sealed (a *CredentialSealedError when it
// does not open). It implements cache.Source. A database whose schema
// is newer than this binary knows is not read: the error is a
// *SchemaError (wrapping cache.ErrSourceNewer).
func (db *DB) Load(ctx context.Context, node string) (cache.Snapshot, error) {
	if err := cache.ValidateNodeName(node); err != nil {
		return cache.Snapshot{}, fmt.Errorf("load bindings: %w", err)
	}
	tx, err := db.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return cache.Snapshot{}, db.wrap("load bindings", err)
	}
	defer rollback(tx)
	if err := db.checkSchema(ctx, tx); err != nil {
		return cache.Snapshot{}, fmt.Errorf("load bindings: %w", err)
	}

	b := cache.Bindings{Node: node, Settings: map[string]string{}}
	var rev int64
	if err := tx.QueryRow(ctx, "SELECT revision FROM mesh_revision").Scan(&rev); err != nil {
		return cache.Snapshot{}, db.wrap("load bindings", err)
	}
	if err := collect(ctx, tx, &b.Nodes, `SELECT name, public_name, identity, public_key FROM nodes ORDER BY name`, nil,
		func(r pgx.Rows, n *cache.NodeRecord) error {
			var pub []byte
			err := r.Scan(&n.Name, &n.PublicName, &n.Identity, &pub)
			if len(pub) > 0 {
				n.PublicKey = base64.StdEncoding.EncodeToString(pub)
			}
			return err
		}); err != nil {
		return cache.Snapshot{}, db.wrap("load bindings: nodes", err)
	}
	var settings []kv
	if err := collect(ctx, tx, &settings, `SELECT key, value FROM settings`, nil,
		func(r pgx.Rows, s *kv) error { return r.Scan(&s.k, &s.v) }); err != nil {
		return cache.Snapshot{}, db.wrap("load bindings: settings", err)
	}
	for _, s := range settings {
		b.Settings[s.k] = s.v
	}
	args := []any{node}
	if err := collect(ctx, tx, &b.Assignments, `SELECT module, selection, autostart FROM assignments WHERE node = $1 ORDER BY module`, args,
		func(r pgx.Rows, a *cache.Assignment) error { return r.Scan(&a.Module, &a.Selection, &a.Autostart) }); err != nil {
		return cache.Snapshot{}, db.wrap("load bindings: assignments", err)
	}
	if err := collect(ctx, tx, &b.Overrides, `SELECT module, key, value FROM overrides WHERE node = $1 ORDER BY module, key`, args,
		func(r pgx.Rows, o *cache.Override) error { return r.Scan(&o.Module, &o.Key, &o.Value) }); err != nil {
		return cache.Snapshot{}, db.wrap("load bindings: overrides", err)
	}
	if err := collect(ctx, tx, &b.Grants, `SELECT consumer, resource, provider, credential, sealed_credential FROM grants WHERE consumer = $1 ORDER BY resource, provider`, args,
		func(r pgx.Rows, g *cache.Grant) error {
			var cred string
			var sealed []byte
			err := r.Scan(&g.Consumer, &g.Resource, &g.Provider, &cred, &sealed)
			g.Credential = cache.Credential(cred)
			if len(sealed) > 0 {
				g.SealedCredential = base64.StdEncoding.EncodeToString(sealed)
			}
			return err
		}); err != nil {
		return cache.Snapshot{}, db.wrap("load bindings: grants", err)
	}
	// The node's newest broker credential and the generations of the older
	// ones still valid (row-level security lets a node role see only its
	// own rows).
	// Sealed rows (migration 007) are opened, the newest only.
	sealedCols := `'', '', NULL::bytea, NULL::bytea`
	if v, err := schemaVersion(ctx, tx); err != nil {
		return cache.Snapshot{}, db.wrap("load bindings", err)
	} else if v >= sealedSchema {
		sealedCols = `coalesce(sealed_with, ''), coalesce(sealed_for, ''), sealed_broker_password, sealed_db_password`
	}
	type credRow struct {
		c   cache.BrokerCredential
		row credentialRow
	}
	var creds []credRow
	if err := collect(ctx, tx, &creds, `SELECT generation, broker_user, broker_password, created_at, switched_at,
		coalesce(db_role, ''), coalesce(db_password, ''), `+sealedCols+` FROM node_credentials WHERE node = $1 ORDER BY generation DESC`, args,
		func(r pgx.Rows, cr *credRow) error {
			c := &cr.c
			var pw, dbpw string
			var sw *time.Time
			err := r.Scan(&c.Generation, &c.User, &pw, &c.CreatedAt, &sw, &c.DBRole, &dbpw,
				&cr.row.with, &cr.row.sealedFor, &cr.row.sealedBroker, &cr.row.sealedDB)
			c.Password, c.DBPassword = cache.Credential(pw), cache.Credential(dbpw)
			if sw != nil {
				c.SwitchedAt = *sw
			}
			return err
		}); err != nil {
		return cache.Snapshot{}, db.wrap("load bindings: broker credential", err)
	}
	if len(creds) > 0 {
		newest := creds[0].c
		if err := db.openCredential(node, &newest, creds[0].row); err != nil {
			return cache.Snapshot{}, fmt.Errorf("load bindings: %w", err)
		}
		for i := len(creds) - 1; i > 0; i-- {
			newest.Older = append(newest.Older, creds[i].c.Generation)
		}
		b.Broker = &newest
	}
	if err := loadKeys(ctx, tx, node, &b); err != nil {
		return cache.Snapshot{}, db.wrap("load bindings", err)
	}
	if err := loadGenerations(ctx, tx, &b); err != nil {
		return cache.Snapshot{}, db.wrap("load bindings: credential generations", err)
	}
	if err := loadSigningKeys(ctx, tx, &b); err != nil {
		return cache.Snapshot{}, db.wrap("load bindings: signing keys", err)
	}
	if err := loadStages(ctx, tx, &b); err != nil {
		return cache.Snapshot{}, db.wrap("load bindings: stages", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return cache.Snapshot{}, db.wrap("load bindings", err)
	}
	return cache.NewSnapshot(rev, db.opts.Now(), db.addr, b), nil
}

// generationsSchema is the first schema version that lets every node read
// every node's credential generations (migration 006).
const generationsSchema = 6

// loadGenerations fills in every node record's credential generations,
// inside Load's transaction. A database not yet migrated to them leaves
// the records without: the bridge then accepts any generation, as before.
func loadGenerations(ctx context.Context, tx pgx.Tx, b *cache.Bindings) error {
	v, err := schemaVersion(ctx, tx)
	if err != nil || v < generationsSchema {
		return err
	}
	type gen struct {
		node string
		gen  int
	}
	var gens []gen
	if err := collect(ctx, tx, &gens, `SELECT node, generation FROM meshbox_node_generations()`, nil,
		func(r pgx.Rows, g *gen) error { return r.Scan(&g.node, &g.gen) }); err != nil {
		return err
	}
	at := make(map[string]int, len(b.Nodes))
	for i, n := range b.Nodes {
		at[n.Name] = i
	}
	for _, g := range gens {
		if i, ok := at[g.node]; ok {
			b.Nodes[i].Generations = append(b.Nodes[i].Generations, g.gen)
		}
	}
	return nil
}

// stagesSchema is the first schema version with the nodes' stage
// allow-lists (migration 002).
const stagesSchema = 2

// loadStages fills in the node's stage allow-list, inside Load's
// transaction; a node without a record, or a database without
// allow-lists, leaves it nil.
func loadStages(ctx context.Context, tx pgx.Tx, b *cache.Bindings) error {
	v, err := schemaVersion(ctx, tx)
	if err != nil || v < stagesSchema {
		return err
	}
	var stages []string
	err = tx.QueryRow(ctx, `SELECT stages FROM nodes WHERE name = $1`, b.Node).Scan(&stages)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return err
	}
	if stages == nil {
		stages = []string{}
	}
	b.Stages = stages
	return nil
}

type kv struct{ k, v string }

// collect runs query and appends one T per row, filled by scan.
func collect[T any](ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, out *[]T, query string, args []any, scan func(pgx.Rows, *T) error) error {
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var v T
		if err := scan(rows, &v); err != nil {
			return err
		}
		*out = append(*out, v)
	}
	return rows.Err()
}

func rollback(tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = tx.Rollback(ctx) // after Commit this is a no-op
}

// Watch follows binding changes on a dedicated connection until ctx is
// done, then returns nil. It calls changed once LISTEN is in place after
// every (re)connect — notifications sent while disconnected are lost, so
// the caller re-reads then — and on every notification; it calls lost each
// time the connection fails or an attempt to connect fails, then retries
// with a doubling, jittered pause (Options.RetryInterval up to
// MaxRetryInterval, internal/backoff).
// Without notifications for PingInterval it pings, so a dead link is found.
// It implements cache.Source.
func (db *DB) Watch(ctx context.Context, changed func(), lost func(error)) error {
	// Jittered: after a database outage the nodes of a mesh must not
	// reconnect in lockstep.
	pause := backoff.Policy{Min: db.opts.RetryInterval, Max: db.opts.MaxRetryInterval}
	failures := 0
	for {
		connected, err := db.listen(ctx, changed)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, errRelisten) {
			continue // at once, with the new login; not a loss
		}
		if connected {
			failures = 0
		}
		lost(err)
		failures++
		t := time.NewTimer(pause.Delay(failures))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// listen connects, LISTENs and waits for notifications until the
// connection fails or ctx is done; connected says whether LISTEN was set up.
func (db *DB) listen(ctx context.Context, changed func()) (connected bool, err error) {
	cc := db.connCfg.Copy()
	db.applyLogin(cc)
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return false, db.wrap("listen", err)
	}
	db.loginWorked(cc.User)
	// A switch of login ends this connection: Watch connects again with
	// the new one.
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { // exits when listen returns or the login switched
		select {
		case <-db.relisten:
			stop()
		case <-lctx.Done():
		}
	}()
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		return false, db.wrap("listen", err)
	}
	changed()
	for {
		wctx, cancel := context.WithTimeout(lctx, db.opts.PingInterval)
		_, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			changed()
		case ctx.Err() != nil:
			return true, ctx.Err()
		case lctx.Err() != nil:
			return true, errRelisten
		case errors.Is(err, context.DeadlineExceeded) && !conn.IsClosed():
			pctx, cancel := context.WithTimeout(ctx, db.opts.ConnectTimeout)
			err := conn.Ping(pctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				return true, db.wrap("listen: ping", err)
			}
		default:
			return true, db.wrap("listen", err)
		}
	}
}
