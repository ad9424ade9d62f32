package meshdb

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/meshbox/meshbox/cache"
)

// InitOptions describes the mesh that Init stands up.
type InitOptions struct {
	Node       string    // the first node's mesh name
	PublicName string    // its optional public name
	BrokerURL  string    // amqp:// or amqps:// URL of the central broker
	Force      bool      // overwrite a different existing mesh's first node and broker.url
	Progress   io.Writer // receives one line per step (nil = discard)
}

// InitResult says what Init did.
type InitResult struct {
	SchemaFrom, SchemaTo int32 // schema versions before and after
	Created              bool  // a new mesh was recorded
	Changed              bool  // any binding changed
	Revision             int64 // mesh revision afterwards
}

// Init stands up a mesh: it applies the migrations, records the first
// node and writes the broker.url setting, printing each step. Run again
// with the same node and broker it changes nothing. A database that holds
// a mesh with another first node or broker.url is left alone
// (*MeshExistsError) unless Force. Input is validated before connecting.
func (db *DB) Init(ctx context.Context, o InitOptions) (InitResult, error) {
	var res InitResult
	if err := firstErr(cache.ValidateNodeName(o.Node), cache.ValidatePublicName(o.PublicName),
		cache.ValidateBrokerURL(o.BrokerURL)); err != nil {
		return res, fmt.Errorf("init: %w", err)
	}
	out := o.Progress
	if out == nil {
		out = io.Discard
	}
	step := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }

	step("connecting to %s", db.addr)
	if err := db.Ping(ctx); err != nil {
		return res, fmt.Errorf("init: %w", err)
	}
	step("applying migrations")
	from, to, err := db.Migrate(ctx, func(v int32, name string) { step("  migration %d: %s", v, name) })
	if err != nil {
		return res, fmt.Errorf("init: %w", err)
	}
	res.SchemaFrom, res.SchemaTo = from, to
	if from == to {
		step("  schema up to date (version %d)", to)
	} else {
		step("  schema version %d -> %d", from, to)
	}

	var lines []string
	change, err := db.change(ctx, "init", func(tx pgx.Tx) error {
		// One init at a time; readers are not blocked.
		if _, err := tx.Exec(ctx, `LOCK TABLE mesh_info IN SHARE ROW EXCLUSIVE MODE`); err != nil {
			return err
		}
		var firstNode, broker string
		err := tx.QueryRow(ctx, `SELECT first_node FROM mesh_info`).Scan(&firstNode)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		err = tx.QueryRow(ctx, `SELECT value FROM settings WHERE key = $1`, SettingBrokerURL).Scan(&broker)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		var differs []string
		if firstNode != "" && firstNode != o.Node {
			differs = append(differs, "first node")
		}
		if broker != "" && broker != o.BrokerURL {
			differs = append(differs, SettingBrokerURL)
		}
		if len(differs) > 0 && !o.Force {
			what := differs[0]
			if len(differs) == 2 {
				what = differs[0] + " and " + differs[1]
			}
			return &MeshExistsError{FirstNode: firstNode, BrokerURL: cache.RedactURL(broker), Differs: what}
		}
		if len(differs) > 0 {
			lines = append(lines, "--force: replacing the existing mesh's "+strings.Join(differs, " and "))
		}

		switch {
		case firstNode == "":
			res.Created = true
			if _, err := tx.Exec(ctx, `INSERT INTO mesh_info (first_node) VALUES ($1)`, o.Node); err != nil {
				return err
			}
			lines = append(lines, fmt.Sprintf("recording mesh with first node %q", o.Node))
		case firstNode != o.Node:
			if _, err := tx.Exec(ctx, `UPDATE mesh_info SET first_node = $1`, o.Node); err != nil {
				return err
			}
			lines = append(lines, fmt.Sprintf("first node %q -> %q", firstNode, o.Node))
		}

		var public string
		err = tx.QueryRow(ctx, `SELECT public_name FROM nodes WHERE name = $1`, o.Node).Scan(&public)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			if _, err := tx.Exec(ctx, `INSERT INTO nodes (name, public_name) VALUES ($1, $2)`, o.Node, o.PublicName); err != nil {
				return err
			}
			lines = append(lines, fmt.Sprintf("adding node %q", o.Node))
		case err != nil:
			return err
		case o.PublicName != "" && public != o.PublicName:
			if _, err := tx.Exec(ctx, `UPDATE nodes SET public_name = $2 WHERE name = $1`, o.Node, o.PublicName); err != nil {
				return err
			}
			lines = append(lines, fmt.Sprintf("node %q public name %q -> %q", o.Node, public, o.PublicName))
		default:
			lines = append(lines, fmt.Sprintf("node %q already recorded", o.Node))
		}

		if broker != o.BrokerURL {
			if _, err := tx.Exec(ctx, `INSERT INTO settings (key, value) VALUES ($1, $2)
				ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value`, SettingBrokerURL, o.BrokerURL); err != nil {
				return err
			}
			lines = append(lines, fmt.Sprintf("setting %s = %s", SettingBrokerURL, cache.RedactURL(o.BrokerURL)))
		} else {
			lines = append(lines, fmt.Sprintf("%s already %s", SettingBrokerURL, cache.RedactURL(o.BrokerURL)))
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	for _, l := range lines {
		step("%s", l)
	}
	res.Changed, res.Revision = change.Changed, change.Revision
	if change.Changed {
		step("mesh ready at revision %d", change.Revision)
	} else {
		step("mesh already initialised; nothing changed (revision %d)", change.Revision)
	}
	return res, nil
}
