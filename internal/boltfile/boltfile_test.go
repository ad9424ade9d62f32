package boltfile

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func create(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "f.db")
	db, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("b"))
		if err != nil {
			return err
		}
		for i := range 500 {
			if err := b.Put([]byte{byte(i >> 8), byte(i)}, make([]byte, 100)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestOpenGoodFile(t *testing.T) {
	path := create(t)
	db, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("got %v, want a good file opened", err)
	}
	defer db.Close()
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Fatalf("got mode %v, want 0600", fi.Mode().Perm())
	}
}

func TestOpenLocked(t *testing.T) {
	path := create(t)
	db, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, err = Open(path, Options{LockTimeout: 50 * time.Millisecond})
	var le *LockedError
	if !errors.As(err, &le) {
		t.Fatalf("got %v, want *LockedError", err)
	}
}

func TestOpenDamaged(t *testing.T) {
	for name, damage := range map[string]func(t *testing.T, path string){
		"empty": func(t *testing.T, path string) {
			if err := os.Truncate(path, 0); err != nil {
				t.Fatal(err)
			}
		},
		"truncated": func(t *testing.T, path string) {
			if err := os.Truncate(path, 3*4096); err != nil {
				t.Fatal(err)
			}
		},
		"garbage pages": func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			junk := make([]byte, 4096)
			for i := range junk {
				junk[i] = byte(i*7 + 3)
			}
			for _, off := range []int64{2 * 4096, 4 * 4096, 6 * 4096} {
				if _, err := f.WriteAt(junk, off); err != nil {
					t.Fatal(err)
				}
			}
		},
		"bad meta": func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt(make([]byte, 8192), 0); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			path := create(t)
			damage(t, path)
			db, err := Open(path, Options{})
			if err == nil {
				db.Close()
				t.Fatal("got a damaged file opened, want *CorruptError")
			}
			var ce *CorruptError
			if !errors.As(err, &ce) {
				t.Fatalf("got %v, want *CorruptError", err)
			}
			moved, err := SetAside(path, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(moved); err != nil {
				t.Fatalf("set-aside file: %v", err)
			}
			db, err = Open(path, Options{})
			if err != nil {
				t.Fatalf("got %v, want a fresh file where the damaged one was", err)
			}
			db.Close()
		})
	}
}

func TestVerifyLayout(t *testing.T) {
	path := create(t)
	_, err := Open(path, Options{Verify: func(tx *bolt.Tx) error {
		if tx.Bucket([]byte("missing")) == nil {
			return errors.New("bucket missing is absent")
		}
		return nil
	}})
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.Reason != "layout" {
		t.Fatalf("got %v, want a layout *CorruptError", err)
	}
}

func TestSetAsideNeverOverwrites(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f.db")
	now := time.Now()
	var seen = map[string]bool{}
	for i := range 3 {
		if err := os.WriteFile(path, []byte{byte(i)}, 0o600); err != nil {
			t.Fatal(err)
		}
		moved, err := SetAside(path, now)
		if err != nil {
			t.Fatal(err)
		}
		if seen[moved] {
			t.Fatalf("got %s twice, want a new name each time", moved)
		}
		seen[moved] = true
	}
}
