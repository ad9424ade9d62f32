package meshdb

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/tern/v2/migrate"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/internal/seal"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// versionTable is where tern records the schema version.
const versionTable = "public.meshbox_schema_version"

// notifyChannel is the LISTEN/NOTIFY channel of binding changes.
const notifyChannel = "meshbox_bindings"

// Defaults for Options.
const (
	DefaultConnectTimeout   = 3 * time.Second
	DefaultStatementTimeout = 10 * time.Second
	DefaultMaxConns         = 4
	DefaultRetryInterval    = 500 * time.Millisecond
	DefaultMaxRetryInterval = 5 * time.Second
	DefaultPingInterval     = 10 * time.Second
)

// Options bounds the database's connections.
type Options struct {
	// ConnectTimeout bounds each connection attempt (default 3s).
	ConnectTimeout time.Duration
	// StatementTimeout bounds each statement and lock wait on the server
	// (default 10s).
	StatementTimeout time.Duration
	// MaxConns caps the connection pool (default 4).
	MaxConns int32
	// RetryInterval and MaxRetryInterval pace Watch's reconnects
	// (defaults 500ms and 5s, doubling).
	RetryInterval    time.Duration
	MaxRetryInterval time.Duration
	// PingInterval is how long Watch waits for a notification before it
	// checks that its connection is alive (default 10s).
	PingInterval time.Duration
	// Logger receives Watch's connection changes (default: discard).
	Logger *slog.Logger
	// Now is the clock stamped on loaded snapshots (default time.Now).
	Now func() time.Time
	// NodeKey is the node's key pair, with which Load opens the node's
	// credential rows sealed to it (sealedcred.go); nil on the admin's
	// side, where Load is not used.
	NodeKey *seal.NodeKey
}

// DB is a mesh database. It implements cache.Source.
type DB struct {
	opts    Options
	pool    *pgxpool.Pool
	connCfg *pgx.ConnConfig // for Watch's dedicated connection
	addr    string          // redacted address for snapshots and messages
	log     *slog.Logger
	// login replaces the URL's user and password for new connections once
	// SwitchLogin succeeded (login.go); relisten (cap 1) makes Watch
	// reconnect with it.
	login    atomic.Pointer[login]
	relisten chan struct{}
	// refused is the database's last refusal of the login, until a
	// connection logs in again (LoginRefused).
	refused atomic.Pointer[error]
}

var _ cache.RevisionSource = (*DB)(nil)

// Open prepares a connection pool for the database at rawURL
// (postgres://...). It does not connect: a database that is down is found
// by the first operation, within ConnectTimeout.
func Open(ctx context.Context, rawURL string, opts Options) (*DB, error) {
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = DefaultConnectTimeout
	}
	if opts.StatementTimeout <= 0 {
		opts.StatementTimeout = DefaultStatementTimeout
	}
	if opts.MaxConns <= 0 {
		opts.MaxConns = DefaultMaxConns
	}
	if opts.RetryInterval <= 0 {
		opts.RetryInterval = DefaultRetryInterval
	}
	if opts.MaxRetryInterval < opts.RetryInterval {
		opts.MaxRetryInterval = max(DefaultMaxRetryInterval, opts.RetryInterval)
	}
	if opts.PingInterval <= 0 {
		opts.PingInterval = DefaultPingInterval
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	addr, err := Address(rawURL)
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		return nil, fmt.Errorf("database URL %s: %w", addr, errors.Unwrap(err))
	}
	cfg.MaxConns = opts.MaxConns
	cfg.MinConns = 0
	cc := cfg.ConnConfig
	cc.ConnectTimeout = opts.ConnectTimeout
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	ms := strconv.FormatInt(opts.StatementTimeout.Milliseconds(), 10)
	cc.RuntimeParams["statement_timeout"] = ms
	cc.RuntimeParams["lock_timeout"] = ms
	cc.RuntimeParams["idle_in_transaction_session_timeout"] = strconv.FormatInt(6*opts.StatementTimeout.Milliseconds(), 10)
	if _, ok := cc.RuntimeParams["application_name"]; !ok {
		cc.RuntimeParams["application_name"] = "meshbox"
	}
	db := &DB{
		opts:     opts,
		connCfg:  cc.Copy(),
		addr:     addr,
		log:      opts.Logger.With("component", "meshdb"),
		relisten: make(chan struct{}, 1),
	}
	cfg.BeforeConnect = func(_ context.Context, c *pgx.ConnConfig) error {
		db.applyLogin(c)
		return nil
	}
	cfg.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
		db.loginWorked(c.Config().User)
		return nil
	}
	db.pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open database %s: %w", addr, err)
	}
	return db, nil
}

// Address returns rawURL without its password (postgres://user@host:port/db),
// or an error naming what is wrong with it.
func Address(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", errors.New("database URL: not a URL")
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return "", fmt.Errorf("database URL: scheme must be postgres or postgresql, not %q", u.Scheme)
	}
	if u.Host == "" {
		return "", errors.New("database URL: has no host")
	}
	r := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}
	if u.User != nil {
		r.User = url.User(u.User.Username())
	}
	return r.String(), nil
}

// Addr returns the database's address without its password.
func (db *DB) Addr() string { return db.addr }

// Close closes the pool's connections. It is idempotent.
func (db *DB) Close() error {
	db.pool.Close()
	return nil
}

// Ping checks that the database answers.
func (db *DB) Ping(ctx context.Context) error {
	if err := db.pool.Ping(ctx); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "28P01" || pgErr.Code == "28000") {
			return fmt.Errorf("database %s: %w of user %s: wrong password or no such role (%s)", db.addr, ErrLoginRefused, db.user(), pgErr.Message)
		}
		return fmt.Errorf("reach database %s: %w", db.addr, err)
	}
	return nil
}

// user is the role the pool logs in as.
func (db *DB) user() string { return db.pool.Config().ConnConfig.User }

// Migrate applies the embedded migrations not yet applied, each in its own
// transaction, under tern's advisory lock (concurrent callers wait). It
// returns the schema versions before and after; progress, if not nil, is
// called before each migration with its version and name.
func (db *DB) Migrate(ctx context.Context, progress func(version int32, name string)) (from, to int32, err error) {
	conn, err := db.pool.Acquire(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("migrate: reach database %s: %w", db.addr, err)
	}
	defer conn.Release()
	m, err := migrate.NewMigrator(ctx, conn.Conn(), versionTable)
	if err != nil {
		return 0, 0, fmt.Errorf("migrate: %w", err)
	}
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		return 0, 0, fmt.Errorf("migrate: %w", err)
	}
	if err := m.LoadMigrations(sub); err != nil {
		return 0, 0, fmt.Errorf("migrate: load migrations: %w", err)
	}
	if from, err = m.GetCurrentVersion(ctx); err != nil {
		return 0, 0, fmt.Errorf("migrate: %w", err)
	}
	if progress != nil {
		m.OnStart = func(seq int32, name, direction, _ string) {
			if direction == "up" {
				progress(seq, name)
			}
		}
	}
	if err := m.Migrate(ctx); err != nil {
		return from, 0, fmt.Errorf("migrate: %w", err)
	}
	// Every node reads the schema version (CheckSchema), whatever its role.
	if _, err := conn.Exec(ctx, "GRANT SELECT ON "+versionTable+" TO PUBLIC"); err != nil {
		return from, 0, fmt.Errorf("migrate: let nodes read the schema version: %w", err)
	}
	if to, err = m.GetCurrentVersion(ctx); err != nil {
		return from, 0, fmt.Errorf("migrate: %w", err)
	}
	return from, to, nil
}

// SchemaVersion returns the newest migration version shipped in this binary.
func SchemaVersion() int32 {
	names, err := migrate.FindMigrations(mustSub())
	if err != nil {
		return 0
	}
	return int32(len(names))
}

func mustSub() fs.FS {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		panic(err) // the embedded directory always exists
	}
	return sub
}

// schemaVersion reads the database's schema version in q: 0 when the
// version table is missing or not readable by this role (a database
// migrated before Migrate let every role read it).
func schemaVersion(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (int32, error) {
	var readable bool
	if err := q.QueryRow(ctx, `SELECT coalesce(has_table_privilege(to_regclass($1), 'SELECT'), false)`, versionTable).Scan(&readable); err != nil {
		return 0, err
	}
	if !readable {
		return 0, nil
	}
	var v int32
	err := q.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM "+versionTable).Scan(&v)
	return v, err
}

// checkSchema returns a *SchemaError when the database's schema is newer
// than the migrations this binary ships: its queries may misread it.
func (db *DB) checkSchema(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) error {
	v, err := schemaVersion(ctx, q)
	if err != nil {
		return db.wrap("read schema version", err)
	}
	if known := SchemaVersion(); v > known {
		return &SchemaError{DB: db.addr, Schema: v, Known: known}
	}
	return nil
}

// Revision returns the current mesh revision: one row, where Load reads
// every node record. It implements cache.RevisionSource.
func (db *DB) Revision(ctx context.Context) (int64, error) {
	var rev int64
	err := db.pool.QueryRow(ctx, "SELECT revision FROM mesh_revision").Scan(&rev)
	if err != nil {
		return 0, db.wrap("read revision", err)
	}
	return rev, nil
}

// wrap prefixes err with op and maps PostgreSQL errors to this package's
// sentinels. A refused login from the node's cache is taken back on the
// way (loginRefused).
func (db *DB) wrap(op string, err error) error {
	db.loginRefused(err) // every error of the DB passes here
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "42P01": // undefined_table
			return fmt.Errorf("%s: %w", op, ErrNotInitialized)
		case "28P01", "28000": // invalid_password, invalid_authorization_specification
			refused := fmt.Errorf("database %s: %w of user %s: wrong password or no such role (%s)", db.addr, ErrLoginRefused, db.user(), pgErr.Message)
			db.refused.Store(&refused)
			return fmt.Errorf("%s: %w", op, refused)
		}
	}
	if pgconn.SafeToRetry(err) || isConnectError(err) {
		return fmt.Errorf("%s: database %s unreachable: %w", op, db.addr, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

func isConnectError(err error) bool {
	var ce *pgconn.ConnectError
	return errors.As(err, &ce)
}
