package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshbox/meshbox/internal/seal"
)

// TestKitFlags checks the kit's flags before any database is reached.
func TestKitFlags(t *testing.T) {
	existing := filepath.Join(t.TempDir(), "mesh.kit")
	if err := os.WriteFile(existing, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := cli{env: map[string]string{"MESHBOX_DB": "postgres://nobody@127.0.0.1:1/none"}}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"mesh", "kit"}, "give --out FILE, or --words"},
		{[]string{"mesh", "kit", "--out", "x", "--words"}, "not both"},
		{[]string{"mesh", "kit", "--words", "--node", "alpha"}, "both --node and --data"},
		{[]string{"mesh", "node", "add", "gamma", "--record-only", "--kit", existing}, "not with --record-only"},
		{[]string{"mesh", "node", "add", "gamma", "--kit", existing}, "not a meshbox recovery kit file"},
		{[]string{"init", "--node", "a", "--broker", "amqp://b/v", "--kit", existing}, "a kit is never written over a file"},
	} {
		c.fails(t, tc.want, tc.args...)
	}
	if b, _ := os.ReadFile(existing); string(b) != "keep me" {
		t.Errorf("the existing file changed: %q", b)
	}
}

// TestWriteKitFile writes a kit once, mode 0600, and never over a file.
func TestWriteKitFile(t *testing.T) {
	kit, err := seal.NewKit("mesh-test")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "mesh.kit")
	if err := writeKitFile(path, kit); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("kit file: %v %v, want mode 0600", fi, err)
	}
	back, err := readKit(path)
	if err != nil || back.Fingerprint() != kit.Fingerprint() {
		t.Fatalf("read back: %v %v", back, err)
	}
	if err := writeKitFile(path, kit); err == nil || !strings.Contains(err.Error(), "never written over a file") {
		t.Errorf("second write: %v, want a refusal", err)
	}
}
