package seal

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// A kit read back from its file or its words is the same key pair, and
// opens what was sealed to its public half; a kit never prints its
// secret.
func TestKitRoundTrip(t *testing.T) {
	k, err := NewKit("home")
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := SealTo(k.Public(), KitKeyInfo("k1", "home"), []byte("content key"))
	if err != nil {
		t.Fatal(err)
	}
	text, _ := k.MarshalText()
	fromFile, err := ParseKit(text)
	if err != nil {
		t.Fatal(err)
	}
	words := strings.ToLower(strings.ReplaceAll(k.Words(), "-", " "))
	fromWords, err := ParseKitWords("home", words)
	if err != nil {
		t.Fatal(err)
	}
	for name, got := range map[string]*Kit{"file": fromFile, "words": fromWords} {
		if !bytes.Equal(got.Public(), k.Public()) || got.Mesh() != "home" {
			t.Fatalf("kit read from its %s: another key pair or mesh (%s)", name, got)
		}
		pt, err := got.Open(KitKeyInfo("k1", "home"), sealed)
		if err != nil || string(pt) != "content key" {
			t.Fatalf("kit read from its %s opens %q, %v", name, pt, err)
		}
	}
	if _, err := k.Open(KitKeyInfo("k2", "home"), sealed); err == nil {
		t.Fatal("a value sealed for key k1 opened as k2's")
	}
	if s := k.String(); strings.Contains(s, k.Words()[:9]) {
		t.Fatalf("String shows the secret: %s", s)
	}
	if n := len(strings.Split(k.Words(), "-")); n != 14 {
		t.Fatalf("the words are %d groups, want 14", n)
	}
}

// A mistyped group, another mesh's name, a damaged file: each an error
// that says what is wrong, never a kit that opens nothing.
func TestKitBadInput(t *testing.T) {
	k, err := NewKit("home")
	if err != nil {
		t.Fatal(err)
	}
	w := k.Words()
	typo := []byte(w)
	if typo[5] == 'A' {
		typo[5] = 'B'
	} else {
		typo[5] = 'A'
	}
	text, _ := k.MarshalText()
	for name, c := range map[string]struct {
		parse func() (*Kit, error)
		says  string
	}{
		"mistyped group": {func() (*Kit, error) { return ParseKitWords("home", string(typo)) }, "checksum"},
		"other mesh":     {func() (*Kit, error) { return ParseKitWords("cabin", w) }, "another mesh"},
		"group missing":  {func() (*Kit, error) { return ParseKitWords("home", w[5:]) }, "has 52 letters"},
		"not base32":     {func() (*Kit, error) { return ParseKitWords("home", "1"+w[1:]) }, "no letter A-Z or digit 2-7"},
		"not a kit file": {func() (*Kit, error) { return ParseKit([]byte("meshbox-node-key-v1 abc\n")) }, "not a meshbox recovery kit"},
		"file cut short": {func() (*Kit, error) { return ParseKit(text[:len(text)-20]) }, "letters and digits"},
		"no mesh name":   {func() (*Kit, error) { return ParseKitWords("", w) }, "mesh's name"},
	} {
		got, err := c.parse()
		if !errors.Is(err, ErrBadKit) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: got %v, %v; want ErrBadKit saying %q", name, got, err, c.says)
		}
	}
	// Control: the words as written parse.
	if _, err := ParseKitWords("home", w); err != nil {
		t.Fatalf("the kit's own words: %v", err)
	}
}

// The same secret makes another key pair in another mesh: a kit's words
// typed for the wrong mesh cannot open its keys even past the checksum.
func TestKitKeyDependsOnMesh(t *testing.T) {
	var s [32]byte
	s[0] = 7
	a, err := kitFrom("home", s)
	if err != nil {
		t.Fatal(err)
	}
	b, err := kitFrom("cabin", s)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(a.Public(), b.Public()) {
		t.Fatal("one secret made the same key pair for two meshes")
	}
}
