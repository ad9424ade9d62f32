package seal

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"log/slog"
	"strings"
)

// signingKeyHeader starts a signing key file; the seed follows in base64.
const signingKeyHeader = "meshbox-signing-key-v1 "

// SigningKey is a node's Ed25519 key pair: what it says to the mesh
// (discovery messages) is signed with it, and its peers verify that with
// the public half in its node record. It never prints its private half:
// String, LogValue and JSON show only a fingerprint of the public half.
type SigningKey struct {
	priv ed25519.PrivateKey
}

// GenerateSigningKey makes a new signing key pair.
func GenerateSigningKey() (*SigningKey, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate signing key: %w", err)
	}
	return &SigningKey{priv: priv}, nil
}

// ParseSigningKey reads a signing key from its stored form (MarshalText).
func ParseSigningKey(text []byte) (*SigningKey, error) {
	s := strings.TrimSpace(string(text))
	if !strings.HasPrefix(s, signingKeyHeader) {
		return nil, fmt.Errorf("%w: not a meshbox signing key", ErrBadKey)
	}
	seed, err := base64.RawURLEncoding.DecodeString(s[len(signingKeyHeader):])
	if err != nil {
		return nil, fmt.Errorf("%w: signing key: %v", ErrBadKey, err)
	}
	if len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("%w: signing key: %d bytes, want %d", ErrBadKey, len(seed), ed25519.SeedSize)
	}
	return &SigningKey{priv: ed25519.NewKeyFromSeed(seed)}, nil
}

// MarshalText returns the key's stored form, private half included: write
// it only to a file of mode 0600.
func (k *SigningKey) MarshalText() ([]byte, error) {
	return []byte(signingKeyHeader + base64.RawURLEncoding.EncodeToString(k.priv.Seed()) + "\n"), nil
}

// Public returns the public half, for the node's record.
func (k *SigningKey) Public() ed25519.PublicKey { return k.priv.Public().(ed25519.PublicKey) }

// Sign signs message (Ed25519, RFC 8032).
func (k *SigningKey) Sign(message []byte) []byte { return ed25519.Sign(k.priv, message) }

// Fingerprint returns a short hex digest of the public half.
func (k *SigningKey) Fingerprint() string { return Fingerprint(k.Public()) }

// String returns the fingerprint of the public half.
func (k *SigningKey) String() string { return "signing key " + k.Fingerprint() }

// LogValue implements slog.LogValuer: the fingerprint only.
func (k *SigningKey) LogValue() slog.Value { return slog.StringValue(k.String()) }

// MarshalJSON shows the fingerprint only.
func (k *SigningKey) MarshalJSON() ([]byte, error) { return []byte(`"` + k.String() + `"`), nil }

// LoadOrCreateSigningKey reads the signing key at path, or makes one there
// (mode 0600, created exclusively) when the file does not exist; created
// says which. A key file that others may read is refused.
func LoadOrCreateSigningKey(path string) (k *SigningKey, created bool, err error) {
	created, err = loadOrCreateKeyFile(path, "signing key",
		func(text []byte) (err error) { k, err = ParseSigningKey(text); return err },
		func() ([]byte, error) {
			sk, err := GenerateSigningKey()
			if err != nil {
				return nil, err
			}
			return sk.MarshalText()
		})
	if err != nil {
		return nil, false, err
	}
	return k, created, nil
}

// ValidateSigningKey checks a node's published signing (public) key.
func ValidateSigningKey(pub []byte) error {
	if len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("%w: signing key: %d bytes, want %d", ErrBadKey, len(pub), ed25519.PublicKeySize)
	}
	return nil
}

// Verify reports whether sig is pub's signature of message. A pub of the
// wrong size verifies nothing.
func Verify(pub ed25519.PublicKey, message, sig []byte) bool {
	return len(pub) == ed25519.PublicKeySize && ed25519.Verify(pub, message, sig)
}
