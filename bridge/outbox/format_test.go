package outbox

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// editOutbox changes a closed outbox file with bbolt directly.
func editOutbox(t *testing.T, path string, fn func(tx *bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
}

func outboxFormatOf(t *testing.T, path string) string {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var f string
	_ = db.View(func(tx *bolt.Tx) error {
		if m := tx.Bucket(bucketMeta); m != nil {
			f = string(m.Get([]byte("format")))
		}
		return nil
	})
	return f
}

// An outbox written before files recorded their format (records and the
// published mark only) opens with its messages and is stamped format 1.
func TestOutboxOpensFileWithoutFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		recs, err := tx.CreateBucket(bucketRecords)
		if err != nil {
			return err
		}
		for seq := uint64(3); seq <= 5; seq++ {
			if err := recs.Put(seqKey(seq), testRecord(seq, Command, "kept").Encode()); err != nil {
				return err
			}
		}
		meta, err := tx.CreateBucket(bucketMeta)
		if err != nil {
			return err
		}
		return meta.Put(keyPublished, binary.BigEndian.AppendUint64(nil, 2))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	o := openTestOutbox(t, path, 1<<20)
	if d, _ := o.Counts(); d != 3 {
		t.Fatalf("depth: got %d, want the 3 records of the old file", d)
	}
	if got := o.Published(); got != 2 {
		t.Fatalf("published mark: got %d, want 2", got)
	}
	if o.Warning() != "" {
		t.Fatalf("warning: got %q, want none", o.Warning())
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	if f := outboxFormatOf(t, path); f != "1" {
		t.Fatalf("format after open: got %q, want 1", f)
	}
}

// An outbox of a newer format (a newer meshbox wrote it, then an older
// one started) is refused with an error naming the file and both formats;
// the file and its messages stay as they are (not set aside, not read).
func TestOutboxRefusesNewerFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	o := openTestOutbox(t, path, 1<<20)
	putWait(t, o, testRecord(1, Command, "from the future"))
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	editOutbox(t, path, func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put([]byte("format"), []byte("2"))
	})
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	_, err = Open(path, Options{MaxBytes: 1 << 20})
	var nf *NewerFormatError
	if !errors.As(err, &nf) {
		t.Fatalf("got %v, want a *NewerFormatError", err)
	}
	for _, want := range []string{path, "format 2", "up to 1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if m, _ := filepath.Glob(path + ".corrupt-*"); len(m) > 0 {
		t.Errorf("the newer file was set aside as damaged: %v", m)
	}
	after, err := os.ReadFile(path)
	if err != nil || string(after) != string(before) {
		t.Errorf("the newer file changed (err %v)", err)
	}
}
