package boltfile

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// withFile opens a fresh file, runs fill in a write transaction, and
// returns the path of the closed file.
func withFile(t *testing.T, fill func(tx *bolt.Tx) error) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "f.db")
	db, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(fill); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func setFormat(v string) func(tx *bolt.Tx) error {
	return func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		return meta.Put(keyFormat, []byte(v))
	}
}

func TestOpenRefusesNewerFormat(t *testing.T) {
	path := withFile(t, setFormat("3"))
	_, err := Open(path, Options{Verify: func(tx *bolt.Tx) error { return CheckFormat(tx, path, "outbox", 1, 2) }})
	var nf *NewerFormatError
	if !errors.As(err, &nf) {
		t.Fatalf("got %v, want a *NewerFormatError (not damage: the file must not be set aside)", err)
	}
	var ce *CorruptError
	if errors.As(err, &ce) {
		t.Fatalf("got a *CorruptError %v, want only a *NewerFormatError", err)
	}
	if nf.Format != 3 || nf.Supported != 2 || nf.Path != path {
		t.Fatalf("got %+v, want format 3, supported 2, path %s", nf, path)
	}
	for _, want := range []string{path, "format 3", "up to 2", "newer meshbox"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestFormat(t *testing.T) {
	tests := []struct {
		name string
		fill func(tx *bolt.Tx) error
		want int
		bad  bool
	}{
		{"new file", func(*bolt.Tx) error { return nil }, 0, false},
		{"legacy: buckets, no format", func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("records")); return err }, 1, false},
		{"legacy: meta without format", func(tx *bolt.Tx) error { _, err := tx.CreateBucket(bucketMeta); return err }, 1, false},
		{"recorded", setFormat("7"), 7, false},
		{"not a number", setFormat("seven"), 0, true},
		{"zero", setFormat("0"), 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := withFile(t, tt.fill)
			db, err := Open(path, Options{ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			var got int
			err = db.View(func(tx *bolt.Tx) error {
				var err error
				got, err = Format(tx, path, 1)
				return err
			})
			var ce *CorruptError
			if tt.bad != errors.As(err, &ce) {
				t.Fatalf("got error %v, want damage: %v", err, tt.bad)
			}
			if got != tt.want {
				t.Fatalf("got format %d, want %d", got, tt.want)
			}
		})
	}
}

func TestUpgradeMigratesInOrder(t *testing.T) {
	path := withFile(t, func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("records"))
		if err != nil {
			return err
		}
		return b.Put([]byte("k"), []byte("v1"))
	})
	db, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var steps []int
	step := func(from int, rename string) Migration {
		return Migration{From: from, Step: func(tx *bolt.Tx) error {
			steps = append(steps, from)
			return tx.Bucket([]byte("records")).Put([]byte("k"), []byte(rename))
		}}
	}
	var from int
	err = db.Update(func(tx *bolt.Tx) error {
		from, err = Upgrade(tx, path, "outbox", 1, 3, []Migration{step(2, "v3"), step(1, "v2")})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if from != 1 || len(steps) != 2 || steps[0] != 1 || steps[1] != 2 {
		t.Fatalf("got from %d and steps %v, want from 1 and steps [1 2]", from, steps)
	}
	err = db.View(func(tx *bolt.Tx) error {
		if v := string(tx.Bucket([]byte("records")).Get([]byte("k"))); v != "v3" {
			t.Errorf("record after migration: got %q, want v3", v)
		}
		if f, _ := Format(tx, path, 1); f != 3 {
			t.Errorf("format after migration: got %d, want 3", f)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Again: nothing to do.
	steps = nil
	_ = db.Update(func(tx *bolt.Tx) error {
		from, err = Upgrade(tx, path, "outbox", 1, 3, nil)
		return err
	})
	if err != nil || from != 3 || steps != nil {
		t.Fatalf("second upgrade: got from %d, steps %v, err %v; want 3, none, nil", from, steps, err)
	}
	// A format without its migration is an error, not a silent stamp.
	err = db.Update(func(tx *bolt.Tx) error {
		_, err := Upgrade(tx, path, "outbox", 1, 4, nil)
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "no migration from format 3") {
		t.Fatalf("got %v, want no migration from format 3", err)
	}
	// And a newer binary's file is refused.
	err = db.Update(func(tx *bolt.Tx) error {
		_, err := Upgrade(tx, path, "outbox", 1, 2, nil)
		return err
	})
	var nf *NewerFormatError
	if !errors.As(err, &nf) || nf.Format != 3 || nf.Supported != 2 {
		t.Fatalf("got %v, want a *NewerFormatError 3 > 2", err)
	}
}
