package boltfile

import (
	"encoding/binary"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestCopyWhileWriting: a copy taken while another goroutine commits is a
// valid file holding a prefix of the commits (every key up to some n,
// none after), and is never written over an existing file.
func TestCopyWhileWriting(t *testing.T) {
	dir := t.TempDir()
	db, err := Open(filepath.Join(dir, "src.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // commits one key at a time until stop
		defer wg.Done()
		for i := uint64(0); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			_ = db.Update(func(tx *bolt.Tx) error {
				b, err := tx.CreateBucketIfNotExists([]byte("k"))
				if err != nil {
					return err
				}
				return b.Put(binary.BigEndian.AppendUint64(nil, i), make([]byte, 512))
			})
		}
	}()
	dst := filepath.Join(dir, "copy.db")
	for {
		var n int
		_ = db.View(func(tx *bolt.Tx) error {
			if b := tx.Bucket([]byte("k")); b != nil {
				n = b.Stats().KeyN
			}
			return nil
		})
		if n >= 200 {
			break
		}
	}
	err = Copy(db, dst)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(dst); fi.Mode().Perm() != 0o600 {
		t.Errorf("copy mode: got %#o, want 0600", fi.Mode().Perm())
	}
	cp, err := Open(dst, Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("the copy does not open as a checked file: %v", err)
	}
	defer cp.Close()
	_ = cp.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("k"))
		n := uint64(b.Stats().KeyN)
		if n < 200 {
			t.Errorf("copy holds %d keys, want at least the 200 committed before it", n)
		}
		for i := range n {
			if b.Get(binary.BigEndian.AppendUint64(nil, i)) == nil {
				t.Errorf("copy of %d keys lacks key %d: not one commit's state", n, i)
				break
			}
		}
		return nil
	})
	if err := Copy(db, dst); !errors.Is(err, fs.ErrExist) {
		t.Errorf("copy over an existing file: got %v, want fs.ErrExist", err)
	}
}
