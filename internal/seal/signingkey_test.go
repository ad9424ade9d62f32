package seal

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSigningKeySignVerify(t *testing.T) {
	a, err := GenerateSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	b, err := GenerateSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte("meshbox discovery: a bye")
	sig := a.Sign(msg)
	tests := []struct {
		name string
		key  []byte
		msg  []byte
		sig  []byte
		want bool
	}{
		{"its own key", a.Public(), msg, sig, true},
		{"another key", b.Public(), msg, sig, false},
		{"changed message", a.Public(), []byte("meshbox discovery: a hello"), sig, false},
		{"changed signature", a.Public(), msg, append([]byte{sig[0] ^ 1}, sig[1:]...), false},
		{"short key", a.Public()[:31], msg, sig, false},
		{"no signature", a.Public(), msg, nil, false},
	}
	for _, tt := range tests {
		if got := Verify(tt.key, tt.msg, tt.sig); got != tt.want {
			t.Errorf("%s: Verify got %v, want %v", tt.name, got, tt.want)
		}
	}
	if err := ValidateSigningKey(a.Public()); err != nil {
		t.Errorf("ValidateSigningKey of a real key: %v", err)
	}
	if err := ValidateSigningKey(make([]byte, 12)); !errors.Is(err, ErrBadKey) {
		t.Errorf("ValidateSigningKey of 12 bytes: got %v, want ErrBadKey", err)
	}
}

func TestLoadOrCreateSigningKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data", "signing.key")
	k1, created, err := LoadOrCreateSigningKey(path)
	if err != nil || !created {
		t.Fatalf("first load: created %v, err %v; want a new key", created, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode: got %v, want 0600", fi.Mode().Perm())
	}
	k2, created, err := LoadOrCreateSigningKey(path)
	if err != nil || created {
		t.Fatalf("second load: created %v, err %v; want the same key", created, err)
	}
	if !k1.Public().Equal(k2.Public()) {
		t.Error("second load: got another key, want the stored one")
	}
	if !Verify(k2.Public(), []byte("x"), k1.Sign([]byte("x"))) {
		t.Error("the stored key does not verify the first key's signature")
	}
	for _, shown := range []string{k1.String(), k1.LogValue().String(), mustJSON(t, k1)} {
		text, _ := k1.MarshalText()
		seed := strings.TrimSpace(strings.TrimPrefix(string(text), signingKeyHeader))
		if strings.Contains(shown, seed) || !strings.Contains(shown, k1.Fingerprint()) {
			t.Errorf("shown as %q: want the fingerprint %s and never the seed", shown, k1.Fingerprint())
		}
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadOrCreateSigningKey(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("world-readable key file: got %v, want a refusal naming chmod 600", err)
	}
	if _, err := ParseSigningKey([]byte("junk")); !errors.Is(err, ErrBadKey) {
		t.Errorf("ParseSigningKey(junk): got %v, want ErrBadKey", err)
	}
	if _, err := ParseSigningKey([]byte(signingKeyHeader + "AAAA")); !errors.Is(err, ErrBadKey) {
		t.Errorf("ParseSigningKey of a short seed: got %v, want ErrBadKey", err)
	}
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
