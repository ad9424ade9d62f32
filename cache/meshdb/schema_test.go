package meshdb_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/testing/testio"
	"github.com/meshbox/meshbox/testing/wait"
)

// setSchemaVersion sets the database's schema version as the admin.
func setSchemaVersion(tb testing.TB, url string, v int32) {
	tb.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "UPDATE public.meshbox_schema_version SET version = $1", v); err != nil {
		tb.Fatal(err)
	}
}

// TestNodeOlderThanSchemaRunsFromCache: the mesh's schema is upgraded past
// what a node's meshbox knows. The node (with its own role) does not read
// the database with queries that may misread it: Load names both versions,
// and the manager keeps the cached bindings, says so in its warning and
// its log, and follows the database again once the schema is one it knows.
func TestNodeOlderThanSchemaRunsFromCache(t *testing.T) {
	ctx := context.Background()
	admin, url := initMesh(t)
	alpha := addNode(t, admin, url, "alpha", 0)
	node := openDB(t, alpha.Token.DB) // the node's own role, as after meshbox join
	if _, err := node.Load(ctx, "alpha"); err != nil {
		t.Fatalf("load at the schema this binary knows: %v", err)
	}

	// The node runs once and caches its bindings.
	path := filepath.Join(t.TempDir(), "cache.db")
	store, err := cache.Open(path, cache.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	logs := &testio.Buffer{}
	newManager := func() *cache.Manager {
		m, err := cache.NewManager(cache.ManagerConfig{
			Node: "alpha", Store: store, Source: node,
			RetryInterval: 50 * time.Millisecond, MaxRetryInterval: 200 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(logs, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Start(ctx); err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := newManager()
	if st := m.Status(); st.Source != cache.SourceDB || st.Warning != "" {
		t.Fatalf("first start: got %+v, want bindings from the database, no warning", st)
	}
	m.Close()

	// The mesh is upgraded: a newer schema.
	known := meshdb.SchemaVersion()
	setSchemaVersion(t, url, known+1)
	_, err = node.Load(ctx, "alpha")
	var se *meshdb.SchemaError
	if !errors.As(err, &se) || !errors.Is(err, cache.ErrSourceNewer) {
		t.Fatalf("load at a newer schema: got %v, want a *SchemaError wrapping cache.ErrSourceNewer", err)
	}
	if se.Schema != known+1 || se.Known != known {
		t.Fatalf("schema error: got %+v, want schema %d, known %d", se, known+1, known)
	}
	want := fmt.Sprintf("schema version %d, newer than this meshbox knows (%d)", known+1, known)
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q lacks %q", err, want)
	}

	m = newManager()
	defer func() { m.Close(); store.Close() }()
	st := m.Status()
	if st.Source != cache.SourceCache || !strings.Contains(st.Warning, want) || st.Revision == 0 {
		t.Fatalf("start at a newer schema: got %+v, want the cached bindings and a warning with %q", st, want)
	}
	if !strings.Contains(logs.String(), "schema is newer than this meshbox") {
		t.Fatalf("log lacks the newer schema:\n%s", logs)
	}

	// Back to a schema it knows (here: the version put back): the node
	// follows the database again and the warning goes.
	setSchemaVersion(t, url, known)
	wait.Eventually(t, 10*time.Second, "schema known again: bindings from the database and no warning", func() error {
		if st := m.Status(); st.Source != cache.SourceDB || st.Warning != "" {
			return fmt.Errorf("got %+v", st)
		}
		return nil
	})
}
