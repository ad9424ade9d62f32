package backup

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"path"
	"strings"
	"time"
)

// Format is the archive format this meshbox writes and reads; an archive
// of a newer one is refused (ErrNewerFormat).
const Format = 1

// ManifestName is the manifest's entry, the archive's last.
const ManifestName = "manifest.json"

// filesDir is where the files' entries are.
const filesDir = "files/"

// Manifest describes an archive. It is in the clear: it holds no secret.
type Manifest struct {
	Format int    `json:"format"`
	ID     string `json:"id"`             // random, names this archive in every seal
	Mesh   string `json:"mesh,omitempty"` // the mesh's id, when the node knew it
	Node   string `json:"node"`
	// TakenAt is when the node's files were copied.
	TakenAt time.Time `json:"taken_at"`
	// Version is the meshbox that wrote the archive.
	Version string `json:"meshbox_version,omitempty"`
	// Live: the running node copied its files (they were in use).
	Live bool `json:"live"`
	// Blobs: the node's blob store is in the archive.
	Blobs bool        `json:"blobs"`
	Key   SealedKey   `json:"key"`
	Files []FileEntry `json:"files"`
}

// FileEntry is one file of the archive.
type FileEntry struct {
	Path   string `json:"path"` // slash-separated, relative to the data directory
	Mode   uint32 `json:"mode"` // permission bits
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"` // of the file's contents
	// SealedSHA256 is the SHA-256 of the file's sealed entry in the
	// archive, checked without the key.
	SealedSHA256 string `json:"sealed_sha256"`
}

// header is the digest of the fields the data key is bound to.
func (m *Manifest) header() []byte {
	h := sha256.New()
	for _, f := range []string{"meshbox-backup header v1", fmt.Sprint(m.Format), m.ID, m.Mesh, m.Node, m.TakenAt.UTC().Format(time.RFC3339Nano)} {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	return h.Sum(nil)
}

// check validates a manifest read from an archive.
func (m *Manifest) check() error {
	switch {
	case m.Format > Format:
		return fmt.Errorf("%w: format %d, this meshbox reads up to %d: restore it with a newer meshbox", ErrNewerFormat, m.Format, Format)
	case m.Format < 1:
		return fmt.Errorf("%w: the manifest has no format", ErrDamaged)
	case m.ID == "" || m.Node == "" || m.TakenAt.IsZero():
		return fmt.Errorf("%w: the manifest lacks its id, node or time", ErrDamaged)
	}
	seen := map[string]bool{}
	for _, f := range m.Files {
		if err := checkPath(f.Path); err != nil {
			return fmt.Errorf("%w: %v", ErrDamaged, err)
		}
		if seen[f.Path] {
			return fmt.Errorf("%w: file %s listed twice", ErrDamaged, f.Path)
		}
		seen[f.Path] = true
		if f.Size < 0 || len(f.SHA256) != 64 || len(f.SealedSHA256) != 64 {
			return fmt.Errorf("%w: file %s: bad size or checksum", ErrDamaged, f.Path)
		}
		if _, err := hex.DecodeString(f.SHA256); err != nil {
			return fmt.Errorf("%w: file %s: bad checksum", ErrDamaged, f.Path)
		}
	}
	return nil
}

// checkPath refuses a path that could leave the directory it is written
// into.
func checkPath(p string) error {
	if p == "" || path.IsAbs(p) || path.Clean(p) != p || p == "." || strings.HasPrefix(p, "../") || p == ".." ||
		strings.ContainsAny(p, "\\\x00") {
		return fmt.Errorf("file path %q is not a clean relative path", p)
	}
	return nil
}

// Age is how old the backup is at now.
func (m *Manifest) Age(now time.Time) time.Duration { return now.Sub(m.TakenAt) }
