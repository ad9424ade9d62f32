package backup

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/meshbox/meshbox/bridge/outbox"
)

// RestoredFile is the file in a restored data directory that says which
// backup it came from (Restored); the node reads it at start.
const RestoredFile = "restored.json"

// OutboxFile is the outbox's file in a data directory, which Restore
// marks (outbox.MarkRestored).
const OutboxFile = "outbox.db"

// Restored says which backup a data directory was restored from.
type Restored struct {
	Archive    string    `json:"archive"` // the archive's id
	Mesh       string    `json:"mesh,omitempty"`
	Node       string    `json:"node"`
	TakenAt    time.Time `json:"taken_at"`
	RestoredAt time.Time `json:"restored_at"`
	// Marked is how many outbox records were marked as possible
	// duplicates.
	Marked int `json:"outbox_marked"`
	// EnvFile: the archive held the node's env file (EnvFile).
	EnvFile string `json:"env_file,omitempty"`
}

// Age is how old the backup was when it was restored.
func (r Restored) Age() time.Duration { return r.RestoredAt.Sub(r.TakenAt) }

// ReadRestored reads dir's RestoredFile: ok false when there is none.
func ReadRestored(dir string) (r Restored, ok bool, err error) {
	data, err := os.ReadFile(filepath.Join(dir, RestoredFile))
	if errors.Is(err, fs.ErrNotExist) {
		return r, false, nil
	}
	if err != nil {
		return r, false, err
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, false, fmt.Errorf("%s: %w", RestoredFile, err)
	}
	return r, true, nil
}

// CheckTarget refuses a data directory to restore into that holds a
// file (ErrExists): a restore never mixes a backup with what is there.
// A directory that does not exist, or is empty, is fine.
func CheckTarget(dir string) error {
	d, err := os.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("restore into %s: %w", dir, err)
	}
	defer d.Close()
	names, err := d.Readdirnames(1)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("restore into %s: %w", dir, err)
	}
	if len(names) > 0 {
		return fmt.Errorf("restore into %s: the directory %w and holds files (%s): restore into a new or empty directory, or move those files away first (nothing was written)",
			dir, ErrExists, names[0])
	}
	return nil
}

// Restore makes dir (new or empty) the data directory of the archive's
// node: its files are opened and checked in a directory beside dir, the
// outbox is marked (outbox.MarkRestored), RestoredFile written, and then
// the whole is moved into place. On an error nothing is left in dir. The
// archive must be unsealed.
//
// envOut, when not "", is where the node's env file goes, if the archive
// holds one (never over an existing file); it is written last, once the
// data directory is in place.
func (a *Archive) Restore(dir, envOut string, at time.Time) (Restored, error) {
	r := Restored{Archive: a.m.ID, Mesh: a.m.Mesh, Node: a.m.Node, TakenAt: a.m.TakenAt, RestoredAt: at.UTC()}
	if err := CheckTarget(dir); err != nil {
		return r, err
	}
	dir = filepath.Clean(dir)
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "."+filepath.Base(dir)+".restore-*")
	if err != nil {
		return r, fmt.Errorf("restore: %w", err)
	}
	defer os.RemoveAll(tmp) // empty once moved
	if err := a.Extract(tmp); err != nil {
		return r, err
	}
	env, err := takeEnv(tmp, envOut)
	if err != nil {
		return r, err
	}
	if env != nil {
		r.EnvFile = EnvFile
	}
	if _, err := os.Stat(filepath.Join(tmp, OutboxFile)); err == nil {
		if r.Marked, err = outbox.MarkRestored(filepath.Join(tmp, OutboxFile)); err != nil {
			return r, fmt.Errorf("restore: %w", err)
		}
	}
	data, _ := json.MarshalIndent(r, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, RestoredFile), append(data, '\n'), 0o600); err != nil {
		return r, fmt.Errorf("restore: %w", err)
	}
	if err := moveInto(tmp, dir); err != nil {
		return r, err
	}
	if env != nil && envOut != "" {
		if err := writeNew(envOut, env); err != nil {
			return r, fmt.Errorf("restore: the data directory is restored, but not its configuration: %w", err)
		}
	}
	return r, nil
}

// writeNew writes data to a new file at path, mode 0600.
func writeNew(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	return f.Close()
}

// takeEnv takes the node's env file out of the extracted files in tmp
// (nil when the archive holds none), checking that envOut may be
// written.
func takeEnv(tmp, envOut string) ([]byte, error) {
	src := filepath.Join(tmp, filepath.FromSlash(EnvFile))
	data, err := os.ReadFile(src)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	if envOut != "" {
		if _, err := os.Lstat(envOut); err == nil {
			return nil, fmt.Errorf("restore: %s %w: the node's configuration is never written over a file; give another --env-out, or move it away (nothing was written)", envOut, ErrExists)
		}
	}
	if err := os.RemoveAll(filepath.Dir(src)); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	return data, nil
}

// moveInto moves what src holds into dir: dir itself when it does not
// exist; otherwise its entries, owned then by dir's owner when run as
// root (a packaged node's directory belongs to its user).
func moveInto(src, dir string) error {
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.Rename(src, dir); err != nil {
			return fmt.Errorf("restore: %w", err)
		}
		syncDir(filepath.Dir(dir))
		return nil
	}
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if err := CheckTarget(dir); err != nil { // a file came meanwhile
		return err
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	var moved []string
	for _, e := range entries {
		to := filepath.Join(dir, e.Name())
		if err := os.Rename(filepath.Join(src, e.Name()), to); err != nil {
			for _, m := range moved {
				_ = os.RemoveAll(m)
			}
			return fmt.Errorf("restore: %w", err)
		}
		moved = append(moved, to)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && os.Geteuid() == 0 && st.Uid != 0 {
		for _, m := range moved {
			_ = filepath.WalkDir(m, func(p string, _ fs.DirEntry, err error) error {
				if err == nil {
					err = os.Lchown(p, int(st.Uid), int(st.Gid))
				}
				return err
			})
		}
	}
	syncDir(dir)
	return nil
}

// EnvFile is where an archive keeps the node's env file (its
// configuration: MESHBOX_NODE, the database's URL), beside its data
// directory's files; Restore never leaves it in the data directory.
const EnvFile = "config/meshbox.env"

// The files of a data directory that a running node holds open, which it
// copies itself on a backup's request, into SnapshotDir.
const (
	CacheFile     = "cache.db"
	CompletedFile = "completed.db"
	RowsFile      = "rows.db"
	SnapshotDir   = "backup-snapshot"
)
