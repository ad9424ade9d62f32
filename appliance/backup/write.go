package backup

import (
	"archive/tar"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Writer writes an archive: Create, AddFile for each file, then Commit
// (or Abort). Not safe for concurrent use.
type Writer struct {
	dst  string
	tmp  *os.File
	tw   *tar.Writer
	m    Manifest
	gcm  cipher.AEAD
	done bool
}

// Create starts an archive that Commit writes to dst (never over an
// existing file: ErrExists). m's Node, Mesh, TakenAt, Version, Live and
// Blobs describe the backup; Create sets its format, id and sealed key.
// The archive is written to a temporary file beside dst (mode 0600).
func Create(dst string, m Manifest, key Key) (*Writer, error) {
	if _, err := os.Lstat(dst); err == nil {
		return nil, fmt.Errorf("%s %w: a backup is never written over a file; give another --out (nothing was written)", dst, ErrExists)
	}
	if m.Node == "" || m.TakenAt.IsZero() {
		return nil, errors.New("backup: the manifest needs the node and the time")
	}
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	dataKey := make([]byte, 32)
	_, _ = rand.Read(dataKey)
	m.Format, m.ID, m.Files = Format, hex.EncodeToString(id), nil
	m.TakenAt = m.TakenAt.UTC()
	sk, err := key.seal(dataKey, m.header())
	if err != nil {
		return nil, fmt.Errorf("backup: seal the data key: %w", err)
	}
	m.Key = sk
	gcm, err := newGCM(dataKey)
	if err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".tmp-*")
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return nil, fmt.Errorf("backup: %w", err)
	}
	return &Writer{dst: dst, tmp: tmp, tw: tar.NewWriter(tmp), m: m, gcm: gcm}, nil
}

// Manifest is the archive's manifest as written so far.
func (w *Writer) Manifest() Manifest { return w.m }

// AddFile seals the file at src into the archive as rel (slash-separated,
// relative to the data directory). The file must not change while it is
// read: give a copy of a file in use.
func (w *Writer) AddFile(rel, src string) error {
	if err := checkPath(rel); err != nil {
		return err
	}
	f, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("backup: %s is not a regular file", src)
	}
	size := fi.Size()
	hdr := &tar.Header{Name: filesDir + rel, Mode: 0o600, Size: sealedSize(size), ModTime: w.m.TakenAt, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
	if err := w.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	plainSum, sealedSum := sha256.New(), sha256.New()
	out := io.MultiWriter(w.tw, sealedSum)
	buf := make([]byte, ChunkSize)
	var sealed []byte
	n := chunks(size)
	for i := range n {
		want := min(int64(ChunkSize), size-i*ChunkSize)
		if _, err := io.ReadFull(f, buf[:want]); err != nil {
			return fmt.Errorf("backup: read %s: %w (did it change while it was read?)", src, err)
		}
		plainSum.Write(buf[:want])
		sealed = sealChunk(w.gcm, sealed[:0], w.m.ID, rel, i, i == n-1, buf[:want])
		if _, err := out.Write(sealed); err != nil {
			return fmt.Errorf("backup: %w", err)
		}
	}
	w.m.Files = append(w.m.Files, FileEntry{Path: rel, Mode: uint32(fi.Mode().Perm()), Size: size,
		SHA256: sum(plainSum), SealedSHA256: sum(sealedSum)})
	return nil
}

func sum(h hash.Hash) string { return hex.EncodeToString(h.Sum(nil)) }

// Commit writes the manifest, syncs the archive and renames it to its
// destination.
func (w *Writer) Commit() error {
	if w.done {
		return errors.New("backup: the archive is closed")
	}
	w.done = true
	err := w.commit()
	if err != nil {
		w.tmp.Close()
		os.Remove(w.tmp.Name())
	}
	return err
}

func (w *Writer) commit() error {
	data, err := json.MarshalIndent(w.m, "", "  ")
	if err != nil {
		return err
	}
	if err := w.tw.WriteHeader(&tar.Header{Name: ManifestName, Mode: 0o600, Size: int64(len(data)), ModTime: w.m.TakenAt, Typeflag: tar.TypeReg}); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if _, err := w.tw.Write(data); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if err := w.tw.Close(); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if err := w.tmp.Sync(); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if err := w.tmp.Close(); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	// A link refuses an existing destination where a rename would replace it.
	if err := os.Link(w.tmp.Name(), w.dst); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%s %w: a backup is never written over a file; give another --out (nothing was written)", w.dst, ErrExists)
		}
		// A file system without hard links: rename, after a look.
		if _, serr := os.Lstat(w.dst); serr == nil {
			return fmt.Errorf("%s %w: a backup is never written over a file; give another --out (nothing was written)", w.dst, ErrExists)
		}
		if err := os.Rename(w.tmp.Name(), w.dst); err != nil {
			return fmt.Errorf("backup: %w", err)
		}
	}
	_ = os.Remove(w.tmp.Name())
	syncDir(filepath.Dir(w.dst))
	return nil
}

// Abort removes the unfinished archive. Safe after Commit.
func (w *Writer) Abort() {
	if w.done {
		return
	}
	w.done = true
	w.tmp.Close()
	os.Remove(w.tmp.Name())
}

// syncDir makes a rename or link in dir durable (best effort: some file
// systems cannot sync a directory).
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}
