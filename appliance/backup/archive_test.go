package backup

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/outbox"
	"github.com/meshbox/meshbox/internal/seal"
)

// dataDir makes a small data directory: a key, a program's credential in
// a subdirectory, a file of several chunks and an empty one.
func dataDir(t testing.TB) (string, map[string][]byte) {
	t.Helper()
	dir := t.TempDir()
	big := bytes.Repeat([]byte("0123456789abcdef"), (ChunkSize*2+1234)/16)
	files := map[string][]byte{
		"node.key":           []byte("node key text\n"),
		"programs/alpha.nk":  []byte("SUAprogramseed"),
		"rows.db":            big,
		"mqtt-sessions.json": {},
	}
	for name, data := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir, files
}

// write writes an archive of src's files with key and returns its path.
func write(t testing.TB, src string, files map[string][]byte, mesh string, key Key) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "node.backup")
	w, err := Create(out, Manifest{Node: "alpha", Mesh: mesh, TakenAt: time.Now().Add(-time.Hour)}, key)
	if err != nil {
		t.Fatal(err)
	}
	for name := range files {
		if err := w.AddFile(name, filepath.Join(src, filepath.FromSlash(name))); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	return out
}

func passKey(t testing.TB, p string) Key {
	t.Helper()
	k, err := PassphraseKey([]byte(p))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func newKit(t testing.TB, mesh string) *seal.Kit {
	t.Helper()
	k, err := seal.NewKit(mesh)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// restore opens, unseals and restores file into dir.
func restore(file, dir string, key Key) (Restored, error) {
	a, err := Open(file)
	if err != nil {
		return Restored{}, err
	}
	if err := a.Unseal(key); err != nil {
		return Restored{}, err
	}
	return a.Restore(dir, "", time.Now())
}

func TestRoundTrip(t *testing.T) {
	kit := newKit(t, "mesh-1")
	for _, tc := range []struct {
		name string
		key  Key
	}{
		{"passphrase", passKey(t, "correct horse battery")},
		{"kit", KitKey(kit)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, files := dataDir(t)
			file := write(t, src, files, "mesh-1", tc.key)
			fi, err := os.Stat(file)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("archive mode: got %#o, want 0600", fi.Mode().Perm())
			}
			raw, _ := os.ReadFile(file)
			if bytes.Contains(raw, files["node.key"]) || bytes.Contains(raw, files["programs/alpha.nk"]) {
				t.Error("a secret is in the archive in the clear")
			}
			dst := filepath.Join(t.TempDir(), "restored")
			r, err := restore(file, dst, tc.key)
			if err != nil {
				t.Fatal(err)
			}
			for name, want := range files {
				got, err := os.ReadFile(filepath.Join(dst, filepath.FromSlash(name)))
				if err != nil || !bytes.Equal(got, want) {
					t.Errorf("%s: got %d bytes (err %v), want %d bytes as written", name, len(got), err, len(want))
				}
			}
			if r.Node != "alpha" || r.Mesh != "mesh-1" || r.Age() < time.Hour {
				t.Errorf("restored: got node %q mesh %q age %s, want alpha, mesh-1, at least 1h", r.Node, r.Mesh, r.Age())
			}
			back, ok, err := ReadRestored(dst)
			if err != nil || !ok || back.Archive != r.Archive {
				t.Errorf("ReadRestored: got %+v %v %v, want %+v", back, ok, err, r)
			}
			if fi, _ := os.Stat(dst); fi.Mode().Perm() != 0o700 {
				t.Errorf("data directory mode: got %#o, want 0700", fi.Mode().Perm())
			}
		})
	}
}

// TestBrokenChecksum: a byte changed anywhere in a file's sealed entry is
// found without the key, and nothing is restored.
func TestBrokenChecksum(t *testing.T) {
	src, files := dataDir(t)
	key := passKey(t, "correct horse battery")
	file := write(t, src, files, "", key)
	raw, _ := os.ReadFile(file)
	// The first file's sealed bytes start after its 512-byte tar header
	// (and PAX records: the header of a PAX entry is 1024 bytes or more).
	i := 2048
	raw[i] ^= 0xff
	if err := os.WriteFile(file, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "restored")
	_, err := restore(file, dst, key)
	if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "another copy") {
		t.Fatalf("got %v, want ErrDamaged saying what to do", err)
	}
	if _, serr := os.Stat(dst); !os.IsNotExist(serr) {
		t.Errorf("restore wrote %s: %v", dst, serr)
	}
	// Control: the same archive unbroken restores.
	raw[i] ^= 0xff
	_ = os.WriteFile(file, raw, 0o600)
	if _, err := restore(file, dst, key); err != nil {
		t.Fatalf("control: %v", err)
	}
}

func TestWrongPassphrase(t *testing.T) {
	src, files := dataDir(t)
	file := write(t, src, files, "", passKey(t, "correct horse battery"))
	dst := filepath.Join(t.TempDir(), "restored")
	_, err := restore(file, dst, passKey(t, "incorrect horse battery"))
	if !errors.Is(err, ErrWrongKey) || !strings.Contains(err.Error(), "passphrase the backup was taken with") {
		t.Fatalf("got %v, want ErrWrongKey", err)
	}
	if _, serr := os.Stat(dst); !os.IsNotExist(serr) {
		t.Errorf("restore wrote %s", dst)
	}
	if _, err := restore(file, dst, KitKey(newKit(t, "m"))); !errors.Is(err, ErrWrongKey) || !strings.Contains(err.Error(), "--passphrase-file") {
		t.Errorf("a kit for a passphrase archive: got %v, want ErrWrongKey naming --passphrase-file", err)
	}
	if _, err := PassphraseKey([]byte("short")); !errors.Is(err, ErrPassphrase) {
		t.Errorf("short passphrase: got %v, want ErrPassphrase", err)
	}
}

// TestWrongMesh: the kit of another mesh, and another kit of the same
// mesh, are refused; the archive's kit opens it.
func TestWrongMesh(t *testing.T) {
	src, files := dataDir(t)
	kit := newKit(t, "mesh-1")
	file := write(t, src, files, "mesh-1", KitKey(kit))
	dst := filepath.Join(t.TempDir(), "restored")
	if _, err := restore(file, dst, KitKey(newKit(t, "mesh-2"))); !errors.Is(err, ErrOtherMesh) || !strings.Contains(err.Error(), "mesh-1") {
		t.Errorf("kit of another mesh: got %v, want ErrOtherMesh naming mesh-1", err)
	}
	if _, err := restore(file, dst, KitKey(newKit(t, "mesh-1"))); !errors.Is(err, ErrWrongKey) {
		t.Errorf("another kit of the mesh: got %v, want ErrWrongKey", err)
	}
	if _, err := restore(file, dst, passKey(t, "correct horse battery")); !errors.Is(err, ErrWrongKey) || !strings.Contains(err.Error(), "--kit") {
		t.Errorf("a passphrase for a kit archive: got %v, want ErrWrongKey naming --kit", err)
	}
	if _, serr := os.Stat(dst); !os.IsNotExist(serr) {
		t.Errorf("restore wrote %s", dst)
	}
	if _, err := restore(file, dst, KitKey(kit)); err != nil {
		t.Errorf("control, the archive's kit: %v", err)
	}
}

// TestAlteredManifest: a manifest that names another mesh or node than
// the one sealed opens nothing.
func TestAlteredManifest(t *testing.T) {
	src, files := dataDir(t)
	key := passKey(t, "correct horse battery")
	file := write(t, src, files, "mesh-1", key)
	raw, _ := os.ReadFile(file)
	altered := bytes.Replace(raw, []byte(`"node": "alpha"`), []byte(`"node": "gamma"`), 1)
	if bytes.Equal(altered, raw) {
		t.Fatal("no node in the manifest to alter")
	}
	_ = os.WriteFile(file, altered, 0o600)
	if _, err := restore(file, filepath.Join(t.TempDir(), "r"), key); !errors.Is(err, ErrWrongKey) {
		t.Errorf("got %v, want ErrWrongKey", err)
	}
}

func TestNonEmptyDir(t *testing.T) {
	src, files := dataDir(t)
	key := passKey(t, "correct horse battery")
	file := write(t, src, files, "", key)
	dst := t.TempDir()
	if err := os.WriteFile(filepath.Join(dst, "cache.db"), []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := restore(file, dst, key)
	if !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), "empty directory") {
		t.Fatalf("got %v, want ErrExists saying what to do", err)
	}
	if got, _ := os.ReadFile(filepath.Join(dst, "cache.db")); string(got) != "mine" {
		t.Error("the existing file changed")
	}
	if entries, _ := os.ReadDir(dst); len(entries) != 1 {
		t.Errorf("restore wrote into the directory: %d entries", len(entries))
	}
	// Control: an empty existing directory is restored into.
	empty := t.TempDir()
	if _, err := restore(file, empty, key); err != nil {
		t.Fatalf("control: %v", err)
	}
	if _, err := os.Stat(filepath.Join(empty, "node.key")); err != nil {
		t.Error(err)
	}
}

func TestNoOverwrite(t *testing.T) {
	out := filepath.Join(t.TempDir(), "b")
	_ = os.WriteFile(out, []byte("x"), 0o600)
	if _, err := Create(out, Manifest{Node: "a", TakenAt: time.Now()}, passKey(t, "correct horse battery")); !errors.Is(err, ErrExists) {
		t.Errorf("got %v, want ErrExists", err)
	}
}

// TestOutboxMarked: a restored outbox's records go out marked as possible
// duplicates.
func TestOutboxMarked(t *testing.T) {
	src := t.TempDir()
	ob, err := outbox.Open(filepath.Join(src, OutboxFile), outbox.Options{MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		r := &outbox.Record{Seq: ob.NextSeq() + uint64(i), Kind: outbox.Command, Name: "work", MsgID: "id" + string(rune('a'+i)), Created: time.Now(), Body: []byte("b")}
		data := r.Encode()
		ob.ReserveAlways(int64(len(data)))
		ob.Put(r, data, nil)
	}
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}
	key := passKey(t, "correct horse battery")
	file := write(t, src, map[string][]byte{OutboxFile: nil}, "", key)
	dst := filepath.Join(t.TempDir(), "r")
	r, err := restore(file, dst, key)
	if err != nil {
		t.Fatal(err)
	}
	if r.Marked != 3 {
		t.Errorf("marked: got %d, want 3", r.Marked)
	}
	ob, err = outbox.Open(filepath.Join(dst, OutboxFile), outbox.Options{MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	recs, _ := ob.ReadAfter(0, 10, outbox.KindsOf(outbox.Command))
	if len(recs) != 3 {
		t.Fatalf("got %d records, want 3", len(recs))
	}
	for _, rec := range recs {
		if !rec.Republished {
			t.Errorf("record %s: not marked", rec.MsgID)
		}
	}
	if ob.Published() != recs[2].Seq {
		t.Errorf("published mark: got %d, want %d", ob.Published(), recs[2].Seq)
	}
}
