package doctor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/meshbox/meshbox/cache"
)

// checkDatabase connects to the mesh database with short timeouts and
// reads its clock.
func (d *Doctor) checkDatabase(ctx context.Context) Check {
	const name = "database"
	if d.cfg.DB == "" {
		return ok(name, "none configured: the node runs standalone")
	}
	safe := d.cfg.DB.String()
	pc, err := pgx.ParseConfig(string(d.cfg.DB))
	if err != nil {
		return fail(name, "fix --db (MESHBOX_DB)", "%s is not a usable database URL", safe)
	}
	pc.ConnectTimeout = d.timeout
	// As the node does: the role of the newest credential generation in
	// its cache, once a rotation gave it one.
	if d.snap != nil && d.snap.Bindings.Node == d.cfg.Node {
		if c := d.snap.Bindings.Broker; c != nil && c.DBRole != "" {
			pc.User, pc.Password = c.DBRole, c.DBPassword.Reveal()
			safe += " (as role " + c.DBRole + ", from the cached bindings)"
		}
	}
	ctx, cancel := context.WithTimeout(ctx, d.timeout+time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, pc)
	if err != nil {
		d.dbErr = err
		if d.snap == nil && d.status != nil && d.status.Bindings.DB == cache.DBConnected {
			// The node logs in as its bindings say, which doctor could
			// not read: the node's word is the one that counts.
			return warn(name, "doctor logs in with the configured URL; the node with the login of the bindings it holds. "+dbHint(err),
				"the running node is connected to the mesh database; doctor cannot connect to %s: %s", safe, dbError(err))
		}
		return fail(name, dbHint(err), "cannot connect to %s: %s", safe, dbError(err))
	}
	defer conn.Close(context.Background())
	var dbNow time.Time
	var version string
	t0 := time.Now()
	err = conn.QueryRow(ctx, "SELECT now(), current_setting('server_version')").Scan(&dbNow, &version)
	t1 := time.Now()
	if err != nil {
		d.dbErr = err
		return fail(name, dbHint(err), "%s answers but a query failed: %s", safe, dbError(err))
	}
	d.dbRTT = t1.Sub(t0)
	skew := dbNow.Sub(t0.Add(d.dbRTT / 2))
	d.dbSkew = &skew
	return ok(name, "%s reachable (PostgreSQL %s, %s round trip)", safe, version, d.dbRTT.Round(time.Millisecond))
}

// dbError is a pgx error without the connection details it repeats.
func dbError(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Message + " (SQLSTATE " + pe.Code + ")"
	}
	var ce *pgconn.ConnectError
	msg := err.Error()
	if errors.As(err, &ce) && ce.Unwrap() != nil {
		msg = ce.Unwrap().Error()
	}
	// pgx joins the errors of each attempt (TLS, then plain) by lines.
	first, _, _ := strings.Cut(msg, "\n")
	return first
}

func dbHint(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "28P01", "28000":
			return "the database refused the user or password in --db (MESHBOX_DB)"
		case "3D000":
			return "the database named in --db does not exist; meshbox init creates a mesh database"
		}
	}
	if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
		return "no answer in time: is the host reachable from here (firewall, VPN)?"
	}
	return "is PostgreSQL running and listening on that host and port, and is it reachable from here?"
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// checkClock compares our clock with the mesh database's. AMQP does not
// carry the broker's time, so the broker is not measured.
func (d *Doctor) checkClock(context.Context) Check {
	const name = "clock"
	if d.dbSkew == nil {
		if d.cfg.DB == "" {
			return ok(name, "not measured: no database configured (the broker does not tell its time over AMQP)")
		}
		return warn(name, "see the database check", "not measured: the database did not answer")
	}
	skew := *d.dbSkew
	abs := skew
	if abs < 0 {
		abs = -abs
	}
	// What we cannot resolve is half the round trip.
	abs -= d.dbRTT / 2
	dir := "ahead of"
	if skew > 0 {
		dir = "behind"
	}
	msg := fmt.Sprintf("this machine is %s %s the database's clock (round trip %s)", skew.Abs().Round(time.Millisecond), dir, d.dbRTT.Round(time.Millisecond))
	switch {
	case abs > skewFail:
		return fail(name, "run a time sync service (systemd-timesyncd, chrony) on this machine and on the database host", "%s", msg)
	case abs > skewWarn:
		return warn(name, "run a time sync service (systemd-timesyncd, chrony); ages and deadlines depend on clocks", "%s", msg)
	}
	return ok(name, "%s", msg)
}
