package meshdb_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/meshbox/meshbox/internal/names"
	"github.com/meshbox/meshbox/internal/names/namestest"
)

// TestSchemaAgreesWithNames checks the schema's CHECK constraints, the
// database's own copy of the name rules, against package names: a name is
// stored exactly when package names accepts it, so nothing the Go side
// refuses can be written behind its back and nothing it accepts is refused.
func TestSchemaAgreesWithNames(t *testing.T) {
	ctx := context.Background()
	_, url := initMesh(t) // mesh with node n1
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })

	columns := []struct {
		column string
		kind   names.Kind
		insert string
	}{
		{"nodes.name", names.KindNode, `INSERT INTO nodes (name) VALUES ($1) ON CONFLICT DO NOTHING`},
		{"settings.key", names.KindSettingKey, `INSERT INTO settings (key, value) VALUES ($1, 'v') ON CONFLICT DO NOTHING`},
		{"assignments.module", names.KindModule, `INSERT INTO assignments (node, module) VALUES ('n1', $1) ON CONFLICT DO NOTHING`},
		{"overrides.module", names.KindModule, `INSERT INTO overrides (node, module, key, value) VALUES ('n1', $1, 'k', 'v') ON CONFLICT DO NOTHING`},
		{"overrides.key", names.KindOverrideKey, `INSERT INTO overrides (node, module, key, value) VALUES ('n1', 'm', $1, 'v') ON CONFLICT DO NOTHING`},
	}
	for _, s := range namestest.Inputs() {
		for _, c := range columns {
			want := names.Check(c.kind, s)
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			_, got := tx.Exec(ctx, c.insert, s)
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if (got == nil) != (want == nil) {
				t.Errorf("%s %.40q: database says %v, package names says %v", c.column, s, got, want)
			}
		}
	}
}
