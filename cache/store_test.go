package cache

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// testBindings returns bindings for node "n1" whose content varies with i.
func testBindings(i int) Bindings {
	return Bindings{
		Node:     "n1",
		Nodes:    []NodeRecord{{Name: "n1", PublicName: "n1.example.org"}, {Name: "n2"}},
		Settings: map[string]string{"broker.url": "amqp://u:secret@broker:5672/", "forge.url": fmt.Sprintf("https://forge/%d", i)},
		Assignments: []Assignment{
			{Module: "photos", Selection: "main", Autostart: true},
		},
		Overrides: []Override{{Module: "photos", Key: "threads", Value: "4"}},
		Grants:    []Grant{{Consumer: "n1", Resource: "s3", Provider: "n2", Credential: "hunter2"}},
	}
}

// openStore opens a store in a temp dir and closes it in Cleanup.
func openStore(tb testing.TB, opts StoreOptions) *Store {
	tb.Helper()
	s, err := Open(filepath.Join(tb.TempDir(), "cache.db"), opts)
	if err != nil {
		tb.Fatalf("open store: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

func TestStorePutLatestHistoryKeep(t *testing.T) {
	s := openStore(t, StoreOptions{Keep: 3})
	if _, err := s.Latest(); !errors.Is(err, ErrNoSnapshot) {
		t.Fatalf("latest on empty store: got %v, want ErrNoSnapshot", err)
	}
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := 1; i <= 5; i++ {
		if err := s.Put(NewSnapshot(int64(i), t0.Add(time.Duration(i)*time.Minute), "db", testBindings(i))); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	latest, err := s.Latest()
	if err != nil {
		t.Fatal(err)
	}
	if latest.Revision != 5 || latest.Bindings.Grants[0].Credential.Reveal() != "hunter2" {
		t.Fatalf("latest: got revision %d credential ok=%t, want 5 and the stored credential", latest.Revision, latest.Bindings.Grants[0].Credential.Reveal() == "hunter2")
	}
	hist, err := s.History()
	if err != nil {
		t.Fatal(err)
	}
	var revs []int64
	for _, h := range hist {
		revs = append(revs, h.Revision)
	}
	if fmt.Sprint(revs) != "[5 4 3]" {
		t.Fatalf("history revisions: got %v, want [5 4 3]", revs)
	}
	if _, err := s.Get(2); !errors.Is(err, ErrNoSnapshot) {
		t.Fatalf("get dropped revision 2: got %v, want ErrNoSnapshot", err)
	}
	got, err := s.Get(4)
	if err != nil || got.Bindings.Settings["forge.url"] != "https://forge/4" {
		t.Fatalf("get 4: got %v %v, want forge.url https://forge/4", got.Bindings.Settings, err)
	}

	// Same content at a newer revision refreshes the newest entry.
	if err := s.Put(NewSnapshot(9, t0.Add(time.Hour), "db", testBindings(5))); err != nil {
		t.Fatal(err)
	}
	hist, _ = s.History()
	if len(hist) != 3 || hist[0].Revision != 9 || !hist[0].FetchedAt.Equal(t0.Add(time.Hour)) {
		t.Fatalf("after same-content put: got %+v, want 3 entries, newest revision 9 fetched at %v", hist, t0.Add(time.Hour))
	}

	fi, err := os.Stat(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("cache file mode: got %v, want 0600", fi.Mode().Perm())
	}
}

func TestStorePutRejectsWrongHash(t *testing.T) {
	s := openStore(t, StoreOptions{})
	snap := NewSnapshot(1, time.Now(), "db", testBindings(1))
	snap.Hash = strings.Repeat("0", 64)
	if err := s.Put(snap); err == nil {
		t.Fatal("put with a wrong hash: got nil error, want one")
	}
}

func TestStoreLocked(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cache.db")
	s, err := Open(path, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = Open(path, StoreOptions{LockTimeout: 100 * time.Millisecond})
	var locked *LockedError
	if !errors.As(err, &locked) || !errors.Is(err, ErrLocked) {
		t.Fatalf("second open: got %v, want *LockedError", err)
	}
	want := "data directory " + dir + " is in use by another meshbox process"
	if err.Error() != want {
		t.Fatalf("error text: got %q, want %q", err.Error(), want)
	}
}

// writeGoodFile writes a cache with a few snapshots and returns its bytes.
func writeGoodFile(tb testing.TB, path string) []byte {
	tb.Helper()
	s, err := Open(path, StoreOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	for i := 1; i <= 4; i++ {
		b := testBindings(i)
		for j := 0; j < 200; j++ { // big enough to span several pages
			b.Overrides = append(b.Overrides, Override{Module: "m", Key: fmt.Sprintf("k%04d", j), Value: strings.Repeat("v", 40)})
		}
		if err := s.Put(NewSnapshot(int64(i), time.Now(), "db", b)); err != nil {
			tb.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		tb.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	return data
}

func TestStoreQuarantinesDamagedFiles(t *testing.T) {
	const page = 4096
	rng := rand.New(rand.NewPCG(1, 2))
	tests := []struct {
		name   string
		damage func(good []byte) []byte
	}{
		{"empty file", func([]byte) []byte { return nil }},
		{"random bytes", func([]byte) []byte {
			b := make([]byte, 64*1024)
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
			return b
		}},
		{"wrong magic", func(g []byte) []byte {
			b := append([]byte(nil), g...)
			for _, off := range []int{16, page + 16} { // meta.magic in both meta pages
				copy(b[off:], []byte{0xde, 0xad, 0xbe, 0xef})
			}
			return b
		}},
		{"zeroed meta pages", func(g []byte) []byte {
			b := append([]byte(nil), g...)
			clear(b[:2*page])
			return b
		}},
		{"zeroed data pages", func(g []byte) []byte {
			b := append([]byte(nil), g...)
			clear(b[2*page:])
			return b
		}},
		{"random data pages", func(g []byte) []byte {
			b := append([]byte(nil), g...)
			for i := 2 * page; i < len(b); i++ {
				b[i] = byte(rng.Uint32())
			}
			return b
		}},
		{"truncated to half", func(g []byte) []byte { return append([]byte(nil), g[:len(g)/2]...) }},
		{"truncated to three pages", func(g []byte) []byte { return append([]byte(nil), g[:3*page]...) }},
		{"truncated mid meta", func(g []byte) []byte { return append([]byte(nil), g[:100]...) }},
		{"text file", func([]byte) []byte { return []byte("this is not a database\n") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "cache.db")
			good := writeGoodFile(t, path)
			bad := tt.damage(good)
			if err := os.WriteFile(path, bad, 0o600); err != nil {
				t.Fatal(err)
			}

			// Read-only (meshbox cache): damage is reported, the file stays.
			if ro, err := Open(path, StoreOptions{ReadOnly: true}); err == nil {
				ro.Close()
				t.Fatalf("read-only open of a damaged file: got nil error, want ErrCorrupt")
			} else if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("read-only open: got %v, want ErrCorrupt", err)
			}

			now := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
			s, err := Open(path, StoreOptions{Now: func() time.Time { return now }})
			if err != nil {
				t.Fatalf("open damaged file: got %v, want a fresh store", err)
			}
			defer s.Close()
			want := path + ".corrupt-20250304T050607Z"
			if s.Quarantined() != want {
				t.Fatalf("quarantined: got %q, want %q", s.Quarantined(), want)
			}
			if !errors.Is(s.Damage(), ErrCorrupt) {
				t.Fatalf("damage: got %v, want ErrCorrupt", s.Damage())
			}
			moved, err := os.ReadFile(want)
			if err != nil || string(moved) != string(bad) {
				t.Fatalf("quarantined file: err %v, same bytes %t; want the damaged bytes kept", err, string(moved) == string(bad))
			}
			if _, err := s.Latest(); !errors.Is(err, ErrNoSnapshot) {
				t.Fatalf("latest on rebuilt store: got %v, want ErrNoSnapshot", err)
			}
			// Rebuild: the fresh store takes new snapshots and survives a reopen.
			if err := s.Put(NewSnapshot(7, now, "db", testBindings(7))); err != nil {
				t.Fatal(err)
			}
			s.Close()
			s2, err := Open(path, StoreOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer s2.Close()
			if s2.Quarantined() != "" {
				t.Fatalf("reopen of rebuilt store quarantined %q, want nothing", s2.Quarantined())
			}
			if snap, err := s2.Latest(); err != nil || snap.Revision != 7 {
				t.Fatalf("latest after rebuild: got %d, %v; want revision 7", snap.Revision, err)
			}
		})
	}
}

func TestStoreQuarantinesBadRecord(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cache.db")
	writeGoodFile(t, path)
	// A record whose bytes were altered but whose pages are sound.
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSnapshots)
		k, v := b.Cursor().Last()
		tampered := strings.Replace(string(v), `"threads"`, `"thread5"`, 1)
		return b.Put(k, []byte(tampered))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(path, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Quarantined() == "" || !strings.Contains(s.Damage().Error(), "does not match its hash") {
		t.Fatalf("tampered record: quarantined %q damage %v; want quarantine for a hash mismatch", s.Quarantined(), s.Damage())
	}
}

func writeFile(path string, data []byte) error { return os.WriteFile(path, data, 0o600) }

// A cache file of a newer format (a newer meshbox wrote it, then an older
// one started) is refused with an error naming the file and both formats,
// and left where it is: not set aside as damaged, not overwritten.
func TestStoreRefusesNewerFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cache.db")
	writeGoodFile(t, path)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("meta")).Put([]byte("format"), []byte("2")) })
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(path)
	for _, opts := range []StoreOptions{{}, {ReadOnly: true}} {
		_, err := Open(path, opts)
		var nf *NewerFormatError
		if !errors.As(err, &nf) {
			t.Fatalf("open %+v: got %v, want a *NewerFormatError", opts, err)
		}
		for _, want := range []string{path, "format 2", "up to 1"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q lacks %q", err, want)
			}
		}
	}
	if m, _ := filepath.Glob(path + ".corrupt-*"); len(m) > 0 {
		t.Errorf("the newer file was set aside as damaged: %v", m)
	}
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Error("the newer file changed")
	}
}
