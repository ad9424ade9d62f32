package boltfile

import (
	"errors"
	"fmt"
	"os"

	bolt "go.etcd.io/bbolt"
)

// Copy writes a consistent copy of the open file db to dst (created, mode
// 0600, never over an existing file): the pages one read transaction sees,
// so writers carry on while it runs and the copy holds every commit before
// the transaction began and none after. The copy is synced before Copy
// returns; a failed copy is removed. This is how a running node's files
// are backed up (another process cannot open them: the node holds their
// locks).
func Copy(db *bolt.DB, dst string) (err error) {
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("copy %s: %w", db.Path(), err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("copy %s: %w", db.Path(), cerr)
		}
		if err != nil {
			_ = os.Remove(dst)
		}
	}()
	err = Contain(db.Path(), func() error {
		return db.View(func(tx *bolt.Tx) error {
			_, err := tx.WriteTo(f)
			return err
		})
	})
	if err != nil {
		var ce *CorruptError
		if errors.As(err, &ce) {
			return err
		}
		return fmt.Errorf("copy %s: %w", db.Path(), err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("copy %s: %w", db.Path(), err)
	}
	return nil
}
