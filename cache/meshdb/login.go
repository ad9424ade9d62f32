package meshdb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// This file is the node's side of rotating its database credential: a
// node role per generation (migration 003), switched make before break.

// login is a database user and password that replace the URL's.
type login struct{ user, password string }

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
// trying them first: for a start, before the DB is used.
func (db *DB) UseLogin(user, password string) {
	db.login.Store(&login{user: user, password: password})
}
