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
	// A kit's file cut short, one with a mistyped word, an empty one and
	// none at all: each refused before the database is reached.
	kit, err := seal.NewKit("mesh-test")
	if err != nil {
		t.Fatal(err)
	}
	text, _ := kit.MarshalText()
	dir := t.TempDir()
	truncated := filepath.Join(dir, "truncated.kit")
	typo := filepath.Join(dir, "typo.kit")
	empty := filepath.Join(dir, "empty.kit")
	words := []byte(kit.Words())
	words[0] = map[bool]byte{true: 'B', false: 'A'}[words[0] == 'A']
	for path, b := range map[string][]byte{
		truncated: text[:len(text)-10],
		typo:      []byte("meshbox-recovery-kit-v1\nmesh: mesh-test\nsecret: " + string(words) + "\n"),
		empty:     nil,
	} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
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
		{[]string{"mesh", "node", "add", "gamma", "--kit", truncated}, "the secret has 48 letters and digits, a kit's has 56"},
		{[]string{"mesh", "node", "add", "gamma", "--kit", typo}, "its checksum does not match: a group is mistyped"},
		{[]string{"mesh", "node", "add", "gamma", "--kit", empty}, "not a meshbox recovery kit file"},
		{[]string{"mesh", "node", "add", "gamma", "--kit", filepath.Join(dir, "none.kit")}, "no such file or directory"},
		{[]string{"mesh", "node", "add", "gamma", "--lost-keys", "k2"}, "--lost-keys goes with --kit"},
		{[]string{"mesh", "node", "add", "gamma", "--record-only", "--scopes", "vault"}, "not with --record-only"},
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

// TestJoinKeepsAnotherNodeKey: a join token that carries a node key (node
// add --kit) is joined into a data directory with no key, or the same
// one; one that holds another node's key is refused, and the key stays.
func TestJoinKeepsAnotherNodeKey(t *testing.T) {
	mine, err := seal.GenerateNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	other, err := seal.GenerateNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	text, _ := mine.MarshalText()
	otherText, _ := other.MarshalText()
	dir := t.TempDir()
	if file, err := checkJoinNodeKey(dir, string(text)); err != nil || file != filepath.Join(dir, kitNodeKeyFile) {
		t.Fatalf("an empty data directory: %q %v", file, err)
	}
	if err := os.WriteFile(filepath.Join(dir, kitNodeKeyFile), text, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := checkJoinNodeKey(dir, string(text)); err != nil {
		t.Errorf("the same key again: %v", err)
	}
	if _, err := checkJoinNodeKey(dir, string(otherText)); err == nil || !strings.Contains(err.Error(), "holds another node key") ||
		!strings.Contains(err.Error(), "nothing was changed") {
		t.Errorf("another node's key: %v, want a refusal", err)
	}
	if _, err := checkJoinNodeKey(t.TempDir(), "not a key"); err == nil {
		t.Error("a token's damaged node key: accepted")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, kitNodeKeyFile)); string(b) != string(text) {
		t.Error("the data directory's key changed")
	}
}

// TestKitFileFromWords: a kit's file typed again from the words written
// down (docs/recovery.md), in lower case and with spaces, is the kit.
func TestKitFileFromWords(t *testing.T) {
	kit, err := seal.NewKit("mesh-test")
	if err != nil {
		t.Fatal(err)
	}
	typed := strings.ToLower(strings.ReplaceAll(kit.Words(), "-", " "))
	path := filepath.Join(t.TempDir(), "typed.kit")
	if err := os.WriteFile(path, []byte("meshbox-recovery-kit-v1\nmesh: mesh-test\nsecret: "+typed+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	back, err := readKit(path)
	if err != nil || back.Fingerprint() != kit.Fingerprint() {
		t.Fatalf("kit typed from its words: %v %v, want %s", back, err, kit)
	}
}
