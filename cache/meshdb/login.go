package meshdb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// This file is the node's side of rotating its database credential: a
// node role per generation (migration 003), switched make before break.

// login is a database user and password that replace the URL's. untried:
// set by UseLogin, until a connection with it succeeds.
type login struct {
	user, password string
	untried        bool
}

// errRelisten ends Watch's connection after a switch of login.
var errRelisten = errors.New("database login switched")

// applyLogin puts the switched login, if any, into c.
func (db *DB) applyLogin(c *pgx.ConnConfig) {
	if l := db.login.Load(); l != nil {
		c.User, c.Password = l.user, l.password
	}
}

// User returns the database user new connections log in as.
func (db *DB) User() string {
	if l := db.login.Load(); l != nil {
		return l.user
	}
	return db.connCfg.User
}

// SwitchLogin makes the DB log in as user with password from now on, make
// before break: it first opens a connection with them (an error leaves
// everything as it was), then new connections use them, the pool's
// connections made with the old login are closed (those in use when they
// are released), and Watch's connection is made again. After it returns
// nothing of the DB uses the old login any more.
func (db *DB) SwitchLogin(ctx context.Context, user, password string) error {
	if user == "" {
		return errors.New("switch database login: no user")
	}
	cc := db.connCfg.Copy()
	cc.User, cc.Password = user, password
	cctx, cancel := context.WithTimeout(ctx, db.opts.ConnectTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cc)
	if err != nil {
		return db.wrap(fmt.Sprintf("switch database login to %s", user), err)
	}
	closeCtx, cancelClose := context.WithTimeout(context.Background(), time.Second)
	_ = conn.Close(closeCtx)
	cancelClose()
	db.login.Store(&login{user: user, password: password})
	db.pool.Reset()
	select {
	case db.relisten <- struct{}{}:
	default:
	}
	return nil
}

// UseLogin makes new connections log in as user with password, without
// trying them first: for a start, before the DB is used (the database may
// be away). If the database refuses that login before any connection with
// it succeeded, the DB goes back to the URL's login and says so in the
// log: the login came from the node's cache and may be a dropped role (the
// node was removed from the mesh and joined again with a new URL).
func (db *DB) UseLogin(user, password string) {
	db.login.Store(&login{user: user, password: password, untried: true})
}

// LoginRefused returns the database's refusal of the DB's login (a
// wrong password, or no such role), wrapping ErrLoginRefused, while it
// lasts: nil before any refusal, and again once a connection logged in.
func (db *DB) LoginRefused() error {
	if e := db.refused.Load(); e != nil {
		return *e
	}
	return nil
}

// loginWorked records that a connection logged in as user: a login set by
// UseLogin is no longer taken back when refused later, and a refusal is
// over.
func (db *DB) loginWorked(user string) {
	db.refused.Store(nil)
	if l := db.login.Load(); l != nil && l.untried && l.user == user {
		db.login.CompareAndSwap(l, &login{user: l.user, password: l.password})
	}
}

// loginRefused goes back to the URL's login when err is the database
// refusing the untried login set by UseLogin (wrong password, or no such
// role): new connections then use the URL's.
func (db *DB) loginRefused(err error) {
	l := db.login.Load()
	if l == nil || !l.untried || !isLoginRefused(err, l.user) {
		return
	}
	if db.login.CompareAndSwap(l, nil) {
		db.log.Warn("the database refused the login this node had cached (a role dropped since?); logging in as its configured user",
			"refused", l.user, "user", db.connCfg.User)
		db.pool.Reset()
	}
}

// isLoginRefused reports whether err is the server refusing to let user
// log in: invalid_password (28P01) or invalid_authorization_specification
// (28000, a role that does not exist or may not log in).
func isLoginRefused(err error, user string) bool {
	var ce *pgconn.ConnectError
	var pgErr *pgconn.PgError
	return errors.As(err, &ce) && ce.Config != nil && ce.Config.User == user &&
		errors.As(err, &pgErr) && (pgErr.Code == "28P01" || pgErr.Code == "28000")
}
