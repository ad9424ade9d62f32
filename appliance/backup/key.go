package backup

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"golang.org/x/crypto/argon2"

	"github.com/meshbox/meshbox/internal/seal"
)

// Ways an archive's data key is sealed (SealedKey.Method).
const (
	MethodKit        = "kit"        // to the mesh's recovery kit (HPKE)
	MethodPassphrase = "passphrase" // under Argon2id of a passphrase, AES-256-GCM
)

// MinPassphrase is the shortest passphrase a backup is sealed with.
const MinPassphrase = 12

// Argon2id's cost for a passphrase (RFC 9106's second recommendation,
// with 64 MiB; the archive records it), and the most an archive may ask
// of a restore.
var (
	argonTime   uint32 = 3
	argonMemory uint32 = 64 << 10 // KiB
)

const (
	argonThreads = 4
	maxArgonTime = 10
	maxArgonMem  = 1 << 20 // KiB: 1 GiB
)

// SealedKey is an archive's data key, sealed.
type SealedKey struct {
	Method string `json:"method"`
	// Kit is the fingerprint of the kit's public key (MethodKit).
	Kit string `json:"kit,omitempty"`
	// Argon2id's parameters (MethodPassphrase).
	Salt    []byte `json:"salt,omitempty"`
	Time    uint32 `json:"time,omitempty"`
	Memory  uint32 `json:"memory_kib,omitempty"`
	Threads uint8  `json:"threads,omitempty"`
	Sealed  []byte `json:"sealed"`
}

// Key is what seals and opens an archive's data key: the mesh's recovery
// kit, or a passphrase.
type Key struct {
	kit  *seal.Kit
	pass []byte
}

// KitKey seals with the mesh's recovery kit.
func KitKey(k *seal.Kit) Key { return Key{kit: k} }

// PassphraseKey seals with a passphrase of at least MinPassphrase bytes.
func PassphraseKey(p []byte) (Key, error) {
	if len(p) < MinPassphrase {
		return Key{}, fmt.Errorf("%w: %d characters, a backup's passphrase has at least %d", ErrPassphrase, len(p), MinPassphrase)
	}
	return Key{pass: p}, nil
}

// Mesh is the mesh of the kit the key is, "" for a passphrase.
func (k Key) Mesh() string {
	if k.kit != nil {
		return k.kit.Mesh()
	}
	return ""
}

// String says which key, without its secret.
func (k Key) String() string {
	if k.kit != nil {
		return k.kit.String()
	}
	return "a passphrase"
}

// kitInfo is the HPKE info of a data key sealed to a kit.
func kitInfo(header []byte) string {
	return "meshbox-backup data key v1\x00" + hex.EncodeToString(header)
}

// seal seals dataKey for the archive whose header digest is header.
func (k Key) seal(dataKey, header []byte) (SealedKey, error) {
	if k.kit != nil {
		b, err := seal.SealTo(k.kit.Public(), kitInfo(header), dataKey)
		if err != nil {
			return SealedKey{}, err
		}
		return SealedKey{Method: MethodKit, Kit: k.kit.Fingerprint(), Sealed: b}, nil
	}
	sk := SealedKey{Method: MethodPassphrase, Salt: make([]byte, 16), Time: argonTime, Memory: argonMemory, Threads: argonThreads}
	_, _ = rand.Read(sk.Salt)
	gcm, err := passAEAD(k.pass, sk)
	if err != nil {
		return SealedKey{}, err
	}
	nonce := make([]byte, gcm.NonceSize())
	_, _ = rand.Read(nonce)
	sk.Sealed = gcm.Seal(nonce, nonce, dataKey, header)
	return sk, nil
}

// open opens an archive's data key; the errors say what to do.
func (k Key) open(sk SealedKey, header []byte, mesh string) ([]byte, error) {
	switch {
	case sk.Method == MethodKit && k.kit == nil:
		return nil, fmt.Errorf("%w: it is sealed with the mesh's recovery kit (%s): give --kit FILE", ErrWrongKey, sk.Kit)
	case sk.Method == MethodPassphrase && k.kit != nil:
		return nil, fmt.Errorf("%w: it is sealed with a passphrase: give --passphrase-file FILE", ErrWrongKey)
	case sk.Method != MethodKit && sk.Method != MethodPassphrase:
		return nil, fmt.Errorf("%w: its key is sealed by %q, which this meshbox does not know", ErrDamaged, sk.Method)
	}
	if k.kit != nil {
		if mesh != "" && k.kit.Mesh() != mesh {
			return nil, fmt.Errorf("%w: it is a backup of mesh %s, and %s: give that mesh's kit, or restore a backup of this mesh", ErrOtherMesh, mesh, k.kit)
		}
		if k.kit.Fingerprint() != sk.Kit {
			return nil, fmt.Errorf("%w: it is sealed with kit %s, not with %s (a kit made again since?): give the kit the backup was taken with", ErrWrongKey, sk.Kit, k.kit)
		}
		dk, err := k.kit.Open(kitInfo(header), sk.Sealed)
		if err != nil {
			return nil, fmt.Errorf("%w: the kit's fingerprint matches but the key does not open: the manifest was altered; use another copy of the backup", ErrWrongKey)
		}
		return dk, nil
	}
	if sk.Time == 0 || sk.Time > maxArgonTime || sk.Memory == 0 || sk.Memory > maxArgonMem || sk.Threads == 0 || len(sk.Salt) < 16 {
		return nil, fmt.Errorf("%w: the passphrase's parameters are out of bounds", ErrDamaged)
	}
	gcm, err := passAEAD(k.pass, sk)
	if err != nil {
		return nil, err
	}
	n := gcm.NonceSize()
	if len(sk.Sealed) < n {
		return nil, fmt.Errorf("%w: the sealed data key is cut short", ErrDamaged)
	}
	dk, err := gcm.Open(nil, sk.Sealed[:n], sk.Sealed[n:], header)
	if err != nil {
		return nil, fmt.Errorf("%w: wrong passphrase (or the manifest was altered): give the passphrase the backup was taken with", ErrWrongKey)
	}
	return dk, nil
}

// passAEAD is AES-256-GCM under Argon2id of the passphrase.
func passAEAD(pass []byte, sk SealedKey) (cipher.AEAD, error) {
	key := argon2.IDKey(pass, sk.Salt, sk.Time, sk.Memory, sk.Threads, 32)
	return newGCM(key)
}

func newGCM(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}
