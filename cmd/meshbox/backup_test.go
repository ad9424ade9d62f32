package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/outbox"
	"github.com/meshbox/meshbox/internal/seal"
)

// TestBackupFlags: bad command lines are refused before anything is read
// or written, each with what to do.
func TestBackupFlags(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	_ = os.WriteFile(short, []byte("too short\n"), 0o600)
	kit := writeTestKit(t, dir, "mesh-1")
	c := cli{}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"backup"}, "--out FILE is required"},
		{[]string{"backup", "--out", "x", "extra"}, "takes no arguments"},
		{[]string{"backup", "--out", "x"}, "give --kit FILE (the mesh's recovery kit) or --passphrase-file FILE"},
		{[]string{"backup", "--out", "x", "--kit", kit, "--passphrase-file", short}, "give one"},
		{[]string{"backup", "--out", "x", "--passphrase-file", short}, "at least 12"},
		{[]string{"backup", "--out", "x", "--kit", short}, "not a meshbox recovery kit file"},
		{[]string{"backup", "--bogus"}, "flag provided but not defined"},
		{[]string{"restore"}, "want the archive"},
		{[]string{"restore", filepath.Join(dir, "none"), "--data", filepath.Join(dir, "r")}, "no such file"},
	} {
		c.fails(t, tc.want, tc.args...)
	}
	if _, err := os.Stat("x"); err == nil {
		t.Error("a refused backup wrote its archive")
	}
}

func writeTestKit(t *testing.T, dir, mesh string) string {
	t.Helper()
	k, err := seal.NewKit(mesh)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, mesh+".kit")
	if err := writeKitFile(path, k); err != nil {
		t.Fatal(err)
	}
	return path
}

// stoppedNode makes the data directory of a stopped node: its key and an
// outbox holding a command.
func stoppedNode(t *testing.T) string {
	t.Helper()
	data := t.TempDir()
	if err := os.WriteFile(filepath.Join(data, "node.key"), []byte("secret node key"), 0o600); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.Open(filepath.Join(data, "outbox.db"), outbox.Options{MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	r := &outbox.Record{Seq: ob.NextSeq(), Kind: outbox.Command, Name: "work", MsgID: "id-1", Created: time.Now(), Body: []byte("b")}
	enc := r.Encode()
	ob.ReserveAlways(int64(len(enc)))
	if err := ob.Wait(t.Context(), func(done func(error)) { ob.Put(r, enc, done) }); err != nil {
		t.Fatal(err)
	}
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}
	return data
}

// TestBackupStoppedNode: a node that does not run is backed up from its
// files (opened under their locks) and restored; a node that holds its
// files but does not answer is an error that says so; a backup of
// another node than the configuration names is not restored.
func TestBackupStoppedNode(t *testing.T) {
	dir := t.TempDir()
	kit := writeTestKit(t, dir, "mesh-1")
	data := stoppedNode(t)
	c := cli{env: map[string]string{"MESHBOX_NODE": "alpha"}}
	down := "nats://127.0.0.1:1"
	archive := filepath.Join(dir, "alpha.backup")
	envFile := filepath.Join(dir, "meshbox.env")
	envText := "MESHBOX_NODE=alpha\n"
	if err := os.WriteFile(envFile, []byte(envText), 0o600); err != nil {
		t.Fatal(err)
	}
	out := c.ok(t, "backup", "--data", data, "--env-file", envFile, "--server", down, "--out", archive, "--kit", kit)
	if !strings.Contains(out, "backup of node alpha (mesh mesh-1)") || !strings.Contains(out, "stopped node's files") {
		t.Errorf("backup said: %s", out)
	}
	c.fails(t, "never written over a file", "backup", "--data", data, "--server", down, "--out", archive, "--kit", kit)

	// Another node than the configuration's.
	beta := cli{env: map[string]string{"MESHBOX_NODE": "beta"}}
	restored := filepath.Join(dir, "restored")
	beta.fails(t, "a backup of node alpha, and the configuration names node beta", "restore", archive, "--data", restored, "--kit", kit)
	if _, err := os.Stat(restored); !os.IsNotExist(err) {
		t.Errorf("a refused restore wrote %s", restored)
	}
	// Another mesh's kit.
	c.fails(t, "backup archive of another mesh", "restore", archive, "--data", restored, "--kit", writeTestKit(t, dir, "mesh-2"))

	// The configuration is never written over a file.
	c.fails(t, "never written over a file", "restore", archive, "--data", restored, "--kit", kit, "--env-out", envFile)
	if _, err := os.Stat(restored); !os.IsNotExist(err) {
		t.Errorf("a refused restore wrote %s", restored)
	}
	envOut := filepath.Join(dir, "restored.env")
	out = c.ok(t, "restore", archive, "--data", restored, "--kit", kit, "--env-out", envOut)
	if !strings.Contains(out, "restored node alpha (mesh mesh-1)") || !strings.Contains(out, "outbox: 1 ") || !strings.Contains(out, "configuration written to") {
		t.Errorf("restore said: %s", out)
	}
	if b, _ := os.ReadFile(envOut); string(b) != envText {
		t.Errorf("the configuration restored as %q, want %q", b, envText)
	}
	if _, err := os.Stat(filepath.Join(restored, "config")); !os.IsNotExist(err) {
		t.Errorf("the configuration is left in the data directory: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(restored, "node.key")); string(b) != "secret node key" {
		t.Errorf("node.key restored as %q", b)
	}

	// A node holds its files and does not answer on its API.
	ob, err := outbox.Open(filepath.Join(data, "outbox.db"), outbox.Options{MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	c.fails(t, "but does not answer", "backup", "--data", data, "--server", down, "--out", filepath.Join(dir, "b2"), "--kit", kit)
	if _, err := os.Stat(filepath.Join(dir, "b2")); err == nil {
		t.Error("the refused backup wrote its archive")
	}
}
