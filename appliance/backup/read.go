package backup

import (
	"archive/tar"
	"crypto/cipher"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// maxManifest bounds the manifest an archive may hold.
const maxManifest = 64 << 20

// Archive is an archive opened for restoring: Open checked it without a
// key; Unseal opens its data key; Extract writes its files.
type Archive struct {
	path string
	m    Manifest
	gcm  cipher.AEAD // nil until Unseal
}

// Open reads the archive at path and checks everything that needs no
// key: it is a tar file whose last entry is a manifest this meshbox reads
// (ErrNewerFormat otherwise), and every file the manifest lists is there,
// once, matching the SHA-256 it records for its sealed entry (ErrDamaged
// otherwise).
func Open(file string) (*Archive, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("backup archive: %w", err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	sums := map[string]string{}
	var mdata []byte
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, damaged(file, "it is no complete tar file: %v", err)
		}
		if mdata != nil {
			return nil, damaged(file, "an entry (%s) after the manifest", hdr.Name)
		}
		switch {
		case hdr.Name == ManifestName:
			if hdr.Size > maxManifest {
				return nil, damaged(file, "a manifest of %d bytes", hdr.Size)
			}
			if mdata, err = io.ReadAll(tr); err != nil {
				return nil, damaged(file, "the manifest is cut short: %v", err)
			}
		case strings.HasPrefix(hdr.Name, filesDir) && hdr.Typeflag == tar.TypeReg:
			name := strings.TrimPrefix(hdr.Name, filesDir)
			if _, dup := sums[name]; dup {
				return nil, damaged(file, "file %s twice", name)
			}
			h := sha256.New()
			if _, err := io.Copy(h, tr); err != nil {
				return nil, damaged(file, "file %s is cut short: %v", name, err)
			}
			sums[name] = sum(h)
		default:
			return nil, damaged(file, "an entry %s that is no part of a meshbox backup", hdr.Name)
		}
	}
	if mdata == nil {
		return nil, damaged(file, "no manifest (is it a meshbox backup, and complete?)")
	}
	var m Manifest
	if err := json.Unmarshal(mdata, &m); err != nil {
		return nil, damaged(file, "the manifest is no valid JSON: %v", err)
	}
	if err := m.check(); err != nil {
		return nil, fmt.Errorf("backup archive %s: %w", file, err)
	}
	for _, fe := range m.Files {
		got, ok := sums[fe.Path]
		switch {
		case !ok:
			return nil, damaged(file, "file %s is missing", fe.Path)
		case got != fe.SealedSHA256:
			return nil, damaged(file, "file %s does not match its checksum", fe.Path)
		}
		delete(sums, fe.Path)
	}
	for name := range sums {
		return nil, damaged(file, "file %s is not in the manifest", name)
	}
	return &Archive{path: file, m: m}, nil
}

// damaged is ErrDamaged with what is wrong and what to do.
func damaged(file, format string, args ...any) error {
	return fmt.Errorf("backup archive %s: %w: %s; nothing was restored: use another copy of the backup, or another backup",
		file, ErrDamaged, fmt.Sprintf(format, args...))
}

// Manifest is the archive's manifest.
func (a *Archive) Manifest() Manifest { return a.m }

// Unseal opens the archive's data key with key: ErrWrongKey when it does
// not open (its error says which key it wants), ErrOtherMesh for the kit
// of another mesh.
func (a *Archive) Unseal(key Key) error {
	dk, err := key.open(a.m.Key, a.m.header(), a.m.Mesh)
	if err != nil {
		return fmt.Errorf("backup archive %s: %w", a.path, err)
	}
	gcm, err := newGCM(dk)
	if err != nil {
		return fmt.Errorf("backup archive %s: %w: its data key", a.path, ErrDamaged)
	}
	a.gcm = gcm
	return nil
}

// Extract writes the archive's files into dir (which must exist), with
// their modes (never open to group or others), checking each against its
// SHA-256. It writes only below dir; on an error, what it wrote stays for
// the caller to remove.
func (a *Archive) Extract(dir string) error {
	if a.gcm == nil {
		return errors.New("backup archive: Unseal first")
	}
	byName := map[string]FileEntry{}
	for _, fe := range a.m.Files {
		byName[fe.Path] = fe
	}
	f, err := os.Open(a.path)
	if err != nil {
		return fmt.Errorf("backup archive: %w", err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return damaged(a.path, "%v", err)
		}
		name, ok := strings.CutPrefix(hdr.Name, filesDir)
		if !ok {
			continue // the manifest
		}
		fe, ok := byName[name]
		if !ok {
			return damaged(a.path, "file %s is not in the manifest", name)
		}
		if err := a.extractFile(tr, hdr.Size, fe, dir); err != nil {
			return err
		}
	}
}

// extractFile opens one file's chunks from r into dir.
func (a *Archive) extractFile(r io.Reader, sealedLen int64, fe FileEntry, dir string) error {
	if sealedLen != sealedSize(fe.Size) {
		return damaged(a.path, "file %s: %d sealed bytes for %d bytes", fe.Path, sealedLen, fe.Size)
	}
	dst := filepath.Join(dir, filepath.FromSlash(fe.Path))
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return fmt.Errorf("restore %s: %w", fe.Path, err)
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, os.FileMode(fe.Mode)&0o700|0o600)
	if err != nil {
		return fmt.Errorf("restore %s: %w", fe.Path, err)
	}
	defer out.Close()
	h := sha256.New()
	w := io.MultiWriter(out, h)
	buf := make([]byte, ChunkSize+chunkOverhead)
	var plain []byte
	n := chunks(fe.Size)
	for i := range n {
		want := min(int64(ChunkSize), fe.Size-i*ChunkSize) + chunkOverhead
		if _, err := io.ReadFull(r, buf[:want]); err != nil {
			return damaged(a.path, "file %s is cut short", fe.Path)
		}
		plain, err = openChunk(a.gcm, plain[:0], a.m.ID, fe.Path, i, i == n-1, buf[:want])
		if err != nil {
			return damaged(a.path, "file %s: chunk %d does not open (altered)", fe.Path, i)
		}
		if _, err := w.Write(plain); err != nil {
			return fmt.Errorf("restore %s: %w", fe.Path, err)
		}
	}
	if sum(h) != fe.SHA256 {
		return damaged(a.path, "file %s does not match its checksum", fe.Path)
	}
	if err := out.Sync(); err != nil {
		return fmt.Errorf("restore %s: %w", fe.Path, err)
	}
	return out.Close()
}

// Files are the paths of the archive's files.
func (a *Archive) Files() []string {
	out := make([]string, len(a.m.Files))
	for i, fe := range a.m.Files {
		out[i] = path.Clean(fe.Path)
	}
	return out
}
