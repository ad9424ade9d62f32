package seal

import (
	"crypto/hpke"
	"encoding/base64"
	"fmt"
	"log/slog"
	"strings"
)

// The HPKE suite every node key uses: hybrid ML-KEM-768 + X25519,
// HKDF-SHA256, AES-256-GCM.
var (
	kem  = hpke.MLKEM768X25519()
	kdf  = hpke.HKDFSHA256()
	aead = hpke.AES256GCM()
)

// nodeKeyHeader starts a node key file; the seed follows in base64.
const nodeKeyHeader = "meshbox-node-key-v1 "

// NodeKey is a node's HPKE key pair. It never prints its private half:
// String, LogValue and JSON show only a fingerprint of the public half.
type NodeKey struct {
	priv hpke.PrivateKey
	pub  []byte
}

// GenerateNodeKey makes a new node key pair.
func GenerateNodeKey() (*NodeKey, error) {
	priv, err := kem.GenerateKey()
	if err != nil {
		return nil, fmt.Errorf("generate node key: %w", err)
	}
	return &NodeKey{priv: priv, pub: priv.PublicKey().Bytes()}, nil
}

// ParseNodeKey reads a node key from its stored form (MarshalText).
func ParseNodeKey(text []byte) (*NodeKey, error) {
	s := strings.TrimSpace(string(text))
	if !strings.HasPrefix(s, nodeKeyHeader) {
		return nil, fmt.Errorf("%w: not a meshbox node key", ErrBadKey)
	}
	seed, err := base64.RawURLEncoding.DecodeString(s[len(nodeKeyHeader):])
	if err != nil {
		return nil, fmt.Errorf("%w: node key: %v", ErrBadKey, err)
	}
	priv, err := kem.NewPrivateKey(seed)
	if err != nil {
		return nil, fmt.Errorf("%w: node key: %v", ErrBadKey, err)
	}
	return &NodeKey{priv: priv, pub: priv.PublicKey().Bytes()}, nil
}

// MarshalText returns the key's stored form, private half included: write
// it only to a file of mode 0600.
func (k *NodeKey) MarshalText() ([]byte, error) {
	seed, err := k.priv.Bytes()
	if err != nil {
		return nil, fmt.Errorf("node key: %w", err)
	}
	return []byte(nodeKeyHeader + base64.RawURLEncoding.EncodeToString(seed) + "\n"), nil
}

// Public returns the public half, for the node's record.
func (k *NodeKey) Public() []byte { return k.pub }

// Fingerprint returns a short hex digest of the public half.
func (k *NodeKey) Fingerprint() string { return Fingerprint(k.pub) }

// String returns the fingerprint of the public half.
func (k *NodeKey) String() string { return "node key " + k.Fingerprint() }

// LogValue implements slog.LogValuer: the fingerprint only.
func (k *NodeKey) LogValue() slog.Value { return slog.StringValue(k.String()) }

// MarshalJSON shows the fingerprint only, so a node key in a status or a
// log never leaks its private half.
func (k *NodeKey) MarshalJSON() ([]byte, error) { return []byte(`"` + k.String() + `"`), nil }

// LoadOrCreateNodeKey reads the node key at path, or makes one there
// (mode 0600, created exclusively) when the file does not exist; created
// says which. A key file that others may read is refused: its private half
// may have leaked.
func LoadOrCreateNodeKey(path string) (k *NodeKey, created bool, err error) {
	created, err = loadOrCreateKeyFile(path, "node key",
		func(text []byte) (err error) { k, err = ParseNodeKey(text); return err },
		func() ([]byte, error) {
			nk, err := GenerateNodeKey()
			if err != nil {
				return nil, err
			}
			return nk.MarshalText()
		})
	if err != nil {
		return nil, false, err
	}
	return k, created, nil
}

// ValidatePublicKey checks a node's published public key.
func ValidatePublicKey(pub []byte) error {
	if _, err := kem.NewPublicKey(pub); err != nil {
		return fmt.Errorf("%w: node public key: %v", ErrBadKey, err)
	}
	return nil
}

// SealTo seals plaintext to the node whose public key is pub, for the
// purpose named by info (ContentKeyInfo, GrantInfo): only that node's
// private key opens it, and only for the same info.
func SealTo(pub []byte, info string, plaintext []byte) ([]byte, error) {
	pk, err := kem.NewPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("%w: node public key: %v", ErrBadKey, err)
	}
	out, err := hpke.Seal(pk, kdf, aead, []byte(info), plaintext)
	if err != nil {
		return nil, fmt.Errorf("seal to node: %w", err)
	}
	return out, nil
}

// Open opens a value sealed to this node for info.
func (k *NodeKey) Open(info string, sealed []byte) ([]byte, error) {
	pt, err := hpke.Open(k.priv, kdf, aead, []byte(info), sealed)
	if err != nil {
		return nil, ErrSealedOpen
	}
	return pt, nil
}

// ContentKeyInfo is the HPKE info of content key id sealed for node.
func ContentKeyInfo(id, node string) string { return "meshbox content key v1\x00" + id + "\x00" + node }

// GrantInfo is the HPKE info of the credential of a grant of resource from
// provider, sealed for consumer.
func GrantInfo(consumer, resource, provider string) string {
	return "meshbox grant credential v1\x00" + consumer + "\x00" + resource + "\x00" + provider
}
