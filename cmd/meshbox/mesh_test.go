package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// cli runs meshbox in-process with env and stdin, returning its output.
type cli struct {
	env   map[string]string
	stdin string
}

func (c cli) run(tb testing.TB, args ...string) (stdout, stderr string, err error) {
	tb.Helper()
	var out, errb bytes.Buffer
	m := &Main{
		Stdin: strings.NewReader(c.stdin), Stdout: &out, Stderr: &errb,
		Getenv: func(k string) string { return c.env[k] },
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = m.Run(ctx, args)
	return out.String(), errb.String(), err
}

func (c cli) ok(tb testing.TB, args ...string) string {
	tb.Helper()
	out, errOut, err := c.run(tb, args...)
	if err != nil {
		tb.Fatalf("meshbox %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

func (c cli) fails(tb testing.TB, wantInErr string, args ...string) {
	tb.Helper()
	out, _, err := c.run(tb, args...)
	if err == nil || !strings.Contains(err.Error(), wantInErr) {
		tb.Fatalf("meshbox %s: got error %v (stdout %q), want one containing %q", strings.Join(args, " "), err, out, wantInErr)
	}
}

func TestInitMeshAndCacheCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	pg := meshtest.NewPostgres(t)
	url := pg.Database(t)
	c := cli{env: map[string]string{"MESHBOX_DB": url}}

	// init: steps shown, safe twice, refuses another mesh.
	out := c.ok(t, "init", "--node", "n1", "--broker", "amqp://127.0.0.1:5672/")
	for _, want := range []string{"applying migrations", `adding node "n1"`, "amqp://127.0.0.1:5672/", "mesh ready at revision 1"} {
		if !strings.Contains(out, want) {
			t.Fatalf("init output lacks %q:\n%s", want, out)
		}
	}
	c.fails(t, "holds a password", "init", "--node", "n1", "--broker", "amqp://guest:pw@127.0.0.1:5672/")
	if out := c.ok(t, "init", "--node", "n1", "--broker", "amqp://127.0.0.1:5672/"); !strings.Contains(out, "nothing changed") {
		t.Fatalf("second init:\n%s", out)
	}
	c.fails(t, "use --force", "init", "--node", "n1", "--broker", "amqp://other:5672/")
	_, _, err := c.run(t, "init", "--node", "n1")
	var ue *usageError
	if !errors.As(err, &ue) {
		t.Fatalf("init without --broker: got %v, want a usage error", err)
	}

	// mesh admin commands.
	c.ok(t, "mesh", "node", "add", "n2", "--record-only", "--public-name", "n2.example.org")
	c.ok(t, "mesh", "assign", "n1", "photos", "--selection", "main", "--autostart")
	c.ok(t, "mesh", "override", "set", "n1", "photos", "threads", "4")
	c.ok(t, "mesh", "setting", "set", "forge.url", "https://forge.example.org")
	// A credential is sealed to its consumer's public key: none, no grant.
	c.stdin = "TOPSECRET\n"
	c.fails(t, "no public key yet", "mesh", "grant", "n1", "bucket", "n2", "--credential-file", "-")
	nk, err := seal.GenerateNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	kdb, err := meshdb.Open(context.Background(), url, meshdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := kdb.PublishNodeKey(context.Background(), "n1", nk.Public()); err != nil { // as n1 does at its first start
		t.Fatal(err)
	}
	kdb.Close()
	c.stdin = "TOPSECRET\n"
	c.ok(t, "mesh", "grant", "n1", "bucket", "n2", "--credential-file", "-")
	c.ok(t, "mesh", "grant", "n2", "other-bucket", "n1")
	c.stdin = ""
	// Completion offers the nodes of the mesh database the command uses.
	if got := strings.Fields(c.ok(t, "__complete", "mesh", "node", "remove")); !contains(got, "n1") || !contains(got, "n2") || !contains(got, "--force") {
		t.Errorf("__complete mesh node remove: %v, want n1, n2 and the flags", got)
	}
	if out := c.ok(t, "mesh", "revision"); strings.TrimSpace(out) != "8" {
		t.Fatalf("revision: got %q, want 8", out)
	}
	if out := c.ok(t, "mesh", "setting", "set", "forge.url", "https://forge.example.org"); !strings.Contains(out, "nothing changed") {
		t.Fatalf("same setting again: %s", out)
	}
	c.fails(t, "invalid node name", "mesh", "node", "add", "bad name", "--record-only")
	c.fails(t, "--broker-admin is required", "mesh", "node", "add", "n3")
	c.fails(t, "holds a password", "mesh", "setting", "set", "broker.url", "amqp://guest:pw@127.0.0.1:5672/")
	c.fails(t, "not found", "mesh", "unassign", "n1", "nothing")
	c.fails(t, "still has", "mesh", "node", "remove", "n1")
	c.fails(t, "required setting", "mesh", "setting", "unset", "broker.url")
	if out := c.ok(t, "mesh", "revision"); strings.TrimSpace(out) != "8" {
		t.Fatalf("revision after refused commands: got %q, want 8", out)
	}
	if out := c.ok(t, "mesh", "setting", "get", "forge.url"); strings.TrimSpace(out) != "https://forge.example.org" {
		t.Fatalf("setting get: %q", out)
	}
	if out := c.ok(t, "mesh", "setting", "list"); !strings.Contains(out, "amqp://127.0.0.1:5672/") {
		t.Fatalf("setting list should show the broker:\n%s", out)
	}
	out = c.ok(t, "mesh", "grants")
	if !strings.Contains(out, "bucket") || !strings.Contains(out, "sealed") || strings.Contains(out, "TOPSECRET") {
		t.Fatalf("grants list:\n%s", out)
	}
	var nodes []cache.NodeRecord
	if err := json.Unmarshal([]byte(c.ok(t, "mesh", "node", "list", "--json")), &nodes); err != nil || len(nodes) != 2 || nodes[1].PublicName != "n2.example.org" {
		t.Fatalf("node list --json: %v %v", nodes, err)
	}

	// A cache file written from this database, inspected with the CLI.
	data := t.TempDir()
	db, err := meshdb.Open(context.Background(), url, meshdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	store, err := cache.Open(filepath.Join(data, "cache.db"), cache.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"6", "8"} {
		c.ok(t, "mesh", "override", "set", "n1", "photos", "threads", v)
		snap, err := db.Load(context.Background(), "n1")
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Put(snap); err != nil {
			t.Fatal(err)
		}
	}
	store.Close()
	c.env["MESHBOX_DATA"] = data
	out = c.ok(t, "cache", "show")
	for _, want := range []string{"node:       n1", "revision:   10", "photos", "threads", "bucket", "forge.url"} {
		if !strings.Contains(out, want) {
			t.Fatalf("cache show lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "TOPSECRET") || strings.Contains(out, "other-bucket") {
		t.Fatalf("cache show leaks a credential or another node's grant:\n%s", out)
	}
	if out := c.ok(t, "cache", "show", "--json"); strings.Contains(out, "TOPSECRET") {
		t.Fatalf("cache show --json leaks the credential:\n%s", out)
	}
	if out := c.ok(t, "cache", "history"); !strings.Contains(out, "REVISION") || strings.Count(out, "\n") != 3 {
		t.Fatalf("cache history, want a header and 2 versions:\n%s", out)
	}
	if out := c.ok(t, "cache", "diff", "9", "10"); !strings.Contains(out, `override photos/threads changed: "6" -> "8"`) {
		t.Fatalf("cache diff:\n%s", out)
	}
	if out := c.ok(t, "cache", "verify"); !strings.Contains(out, "ok, 2 snapshots, newest revision 10") {
		t.Fatalf("cache verify:\n%s", out)
	}
	raw, err := os.ReadFile(filepath.Join(data, "cache.db"))
	if err != nil {
		t.Fatal(err)
	}
	clear(raw[4096*2:])
	if err := os.WriteFile(filepath.Join(data, "cache.db"), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	c.fails(t, "is damaged", "cache", "verify")
	if _, err := os.Stat(filepath.Join(data, "cache.db")); err != nil {
		t.Fatalf("cache verify must not move the file: %v", err)
	}
}
