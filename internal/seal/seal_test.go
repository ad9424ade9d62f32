package seal

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func testRing(t testing.TB, ids ...string) (*Keyring, []ContentKey) {
	t.Helper()
	var keys []ContentKey
	for _, id := range ids {
		k := NewContentKey()
		k.ID = id
		keys = append(keys, k)
	}
	r, err := NewKeyring(keys, ids[0])
	if err != nil {
		t.Fatal(err)
	}
	return r, keys
}

func TestSealOpenRoundTrip(t *testing.T) {
	r, _ := testRing(t, "k1")
	ad := AssociatedData(nil, "test", "command", "cmd.resize", "id-1", "nodeA")
	for _, n := range []int{0, 1, 100, 64 << 10} {
		pt := bytes.Repeat([]byte{'x'}, n)
		buf := make([]byte, n, n+Overhead)
		copy(buf, pt)
		sl, err := r.Sealer()
		if err != nil {
			t.Fatal(err)
		}
		id := sl.ID()
		sealed := sl.Seal(buf[:0], ad, buf)
		if id != "k1" {
			t.Fatalf("got key id %q, want k1", id)
		}
		if len(sealed) != n+Overhead {
			t.Fatalf("got %d sealed bytes, want %d", len(sealed), n+Overhead)
		}
		if n > 8 && bytes.Contains(sealed, pt[:8]) {
			t.Fatal("sealed message holds the plaintext")
		}
		kept := bytes.Clone(sealed)
		got, err := r.Open(nil, id, ad, sealed)
		if err != nil {
			t.Fatalf("open %d bytes: %v", n, err)
		}
		if !bytes.Equal(sealed, kept) {
			t.Fatal("Open with a nil dst changed the sealed message")
		}
		got, err = r.Open(sealed[:0], id, ad, sealed)
		if err != nil {
			t.Fatalf("open %d bytes: %v", n, err)
		}
		if !bytes.Equal(got, pt) {
			t.Fatalf("opened %d bytes, want the %d sealed", len(got), n)
		}
	}
}

func TestOpenRefuses(t *testing.T) {
	r, keys := testRing(t, "k1", "k2")
	ad := AssociatedData(nil, "test", "command", "cmd.resize", "id-1", "nodeA")
	seal := func() []byte {
		sl, err := r.Sealer()
		if err != nil {
			t.Fatal(err)
		}
		return sl.Seal(nil, ad, []byte("front door code 1234"))
	}
	other, err := NewKeyring([]ContentKey{keys[1]}, "k2")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		open func() error
		want error
	}{
		{"flipped ciphertext byte", func() error { s := seal(); s[len(s)/2] ^= 1; _, err := r.Open(nil, "k1", ad, s); return err }, ErrTampered},
		{"flipped nonce byte", func() error { s := seal(); s[0] ^= 1; _, err := r.Open(nil, "k1", ad, s); return err }, ErrTampered},
		{"other stage", func() error {
			_, err := r.Open(nil, "k1", AssociatedData(nil, "test", "command", "cmd.delete", "id-1", "nodeA"), seal())
			return err
		}, ErrTampered},
		{"other origin", func() error {
			_, err := r.Open(nil, "k1", AssociatedData(nil, "test", "command", "cmd.resize", "id-1", "nodeB"), seal())
			return err
		}, ErrTampered},
		{"other key of the ring", func() error { _, err := r.Open(nil, "k2", ad, seal()); return err }, ErrTampered},
		{"key not held", func() error { _, err := other.Open(nil, "k1", ad, seal()); return err }, ErrUnknownKey},
		{"short", func() error { _, err := r.Open(nil, "k1", ad, make([]byte, Overhead-1)); return err }, ErrTampered},
		{"empty ring", func() error { _, err := (&Keyring{}).Open(nil, "k1", ad, seal()); return err }, ErrUnknownKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.open(); !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
		})
	}
	if _, err := (&Keyring{}).Sealer(); !errors.Is(err, ErrNoKey) {
		t.Fatalf("seal with an empty ring: got %v, want ErrNoKey", err)
	}
}

func TestAssociatedDataIsUnambiguous(t *testing.T) {
	a := AssociatedData(nil, "l", "ab", "c")
	b := AssociatedData(nil, "l", "a", "bc")
	if bytes.Equal(a, b) {
		t.Fatal(`("ab","c") and ("a","bc") encode the same`)
	}
}

func TestKeyringSetValidates(t *testing.T) {
	k := NewContentKey()
	if err := ValidateKeyID(k.ID); err != nil {
		t.Fatalf("a new key's id %q is invalid: %v", k.ID, err)
	}
	if _, err := NewKeyring([]ContentKey{k}, "nope"); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("current key not held: got %v, want ErrUnknownKey", err)
	}
	for _, id := range []string{"", "-a", "A", "a b", strings.Repeat("a", 33)} {
		if ValidateKeyID(id) == nil {
			t.Errorf("key id %q accepted", id)
		}
	}
	if _, err := ContentKeyFrom("k1", make([]byte, 16)); !errors.Is(err, ErrBadKey) {
		t.Fatalf("16-byte key: got %v, want ErrBadKey", err)
	}
}

func TestNodeKeySealTo(t *testing.T) {
	a, err := GenerateNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	b, err := GenerateNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := ValidatePublicKey(a.Public()); err != nil {
		t.Fatal(err)
	}
	ck := NewContentKey()
	sealed, err := SealTo(a.Public(), ContentKeyInfo(ck.ID, "a"), ck.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, ck.Bytes()) {
		t.Fatal("sealed copy holds the key")
	}
	got, err := a.Open(ContentKeyInfo(ck.ID, "a"), sealed)
	if err != nil || !bytes.Equal(got, ck.Bytes()) {
		t.Fatalf("open: got %x, %v; want the key", got, err)
	}
	if _, err := b.Open(ContentKeyInfo(ck.ID, "a"), sealed); !errors.Is(err, ErrSealedOpen) {
		t.Fatalf("other node's key: got %v, want ErrSealedOpen", err)
	}
	if _, err := a.Open(ContentKeyInfo("k-other", "a"), sealed); !errors.Is(err, ErrSealedOpen) {
		t.Fatalf("other key id: got %v, want ErrSealedOpen", err)
	}
	if _, err := a.Open(ContentKeyInfo(ck.ID, "b"), sealed); !errors.Is(err, ErrSealedOpen) {
		t.Fatalf("other node name: got %v, want ErrSealedOpen", err)
	}
	if err := ValidatePublicKey([]byte("short")); !errors.Is(err, ErrBadKey) {
		t.Fatalf("bad public key: got %v, want ErrBadKey", err)
	}
}

func TestLoadOrCreateNodeKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.key")
	k1, created, err := LoadOrCreateNodeKey(path)
	if err != nil || !created {
		t.Fatalf("first call: created %v, err %v; want a new key", created, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, want 0600", fi.Mode().Perm())
	}
	k2, created, err := LoadOrCreateNodeKey(path)
	if err != nil || created {
		t.Fatalf("second call: created %v, err %v; want the same key", created, err)
	}
	if !bytes.Equal(k1.Public(), k2.Public()) {
		t.Fatal("reloaded key differs")
	}
	if strings.Contains(k1.String(), "meshbox-node-key") {
		t.Fatal("String shows the private half")
	}
	js, _ := k1.MarshalJSON()
	text, _ := k1.MarshalText()
	if bytes.Contains(js, text[len(nodeKeyHeader):len(nodeKeyHeader)+10]) {
		t.Fatal("JSON shows the private half")
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadOrCreateNodeKey(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("world-readable key: got %v, want a refusal", err)
	}
	if err := os.WriteFile(filepath.Join(t.TempDir(), "x"), []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ParseNodeKey([]byte("junk")); !errors.Is(err, ErrBadKey) {
		t.Fatalf("junk key: got %v, want ErrBadKey", err)
	}
}

func FuzzOpen(f *testing.F) {
	r, _ := testRing(f, "k1")
	ad := AssociatedData(nil, "fuzz", "event", "evt.x", "id", "n")
	sl, _ := r.Sealer()
	s := sl.Seal(nil, ad, []byte("hello"))
	f.Add("k1", s)
	f.Add("k2", s)
	f.Add("k1", []byte{})
	f.Fuzz(func(t *testing.T, id string, sealed []byte) {
		cp := bytes.Clone(sealed)
		pt, err := r.Open(cp[:0], id, ad, cp)
		if err == nil && !(id == "k1" && bytes.Equal(sealed, s) && string(pt) == "hello") {
			t.Fatalf("opened a message that was never sealed: id %q, %x", id, sealed)
		}
	})
}

func BenchmarkSealOpen(b *testing.B) {
	r, _ := testRing(b, "k1")
	ad := AssociatedData(nil, "bench", "command", "cmd.resize", "0123456789abcdef0123456789abcdef", "node-a")
	for _, n := range []int{64, 1 << 10, 16 << 10, 256 << 10} {
		b.Run(sizeName(n), func(b *testing.B) {
			buf := make([]byte, n, n+Overhead)
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				sl, err := r.Sealer()
				if err != nil {
					b.Fatal(err)
				}
				sealed := sl.Seal(buf[:0], ad, buf[:n])
				if _, err := r.Open(sealed[:0], sl.ID(), ad, sealed); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkSealTo(b *testing.B) {
	k, err := GenerateNodeKey()
	if err != nil {
		b.Fatal(err)
	}
	ck := NewContentKey()
	info := ContentKeyInfo(ck.ID, "a")
	for b.Loop() {
		s, err := SealTo(k.Public(), info, ck.Bytes())
		if err != nil {
			b.Fatal(err)
		}
		if _, err := k.Open(info, s); err != nil {
			b.Fatal(err)
		}
	}
}

func sizeName(n int) string {
	if n >= 1<<10 {
		return strconv.Itoa(n>>10) + "KiB"
	}
	return strconv.Itoa(n) + "B"
}
