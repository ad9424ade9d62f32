package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"
)

// This file seals the secrets of a node's own credential (its broker
// password, its database role's password) for the mesh database's rows,
// so that a dump of the database holds none of them:
//
//   - a generation made while the node has a public key (a rotation) is
//     sealed to that key (SealTo, CredentialInfo);
//   - a generation handed out with a join token (the first one, a rejoin)
//     is sealed under its database login's password, which only the token
//     and the node hold (the database keeps a SCRAM verifier of it):
//     SealWithSecret, HKDF-SHA256 and AES-256-GCM.

// Purposes of a credential's secrets, in CredentialInfo.
const (
	PurposeBroker   = "broker"   // the broker user's password
	PurposeDatabase = "database" // the database login role's password
)

// CredentialInfo is the HPKE info (and, for SealWithSecret, the HKDF info
// and associated data) of secret purpose of generation gen of node's own
// credential, sealed for node: a sealed value moved to another node,
// generation or purpose does not open.
func CredentialInfo(node string, gen int, purpose string) string {
	return "meshbox node credential v1\x00" + node + "\x00" + strconv.Itoa(gen) + "\x00" + purpose
}

// secretSaltSize is the random salt of SealWithSecret, before the nonce.
const secretSaltSize = 16

// minSecret is the shortest secret SealWithSecret takes: it must be a
// random secret (a generated password), never a word a person chose.
const minSecret = 16

// SealWithSecret seals plaintext under a key derived from secret, a high
// entropy secret both sides hold (HKDF-SHA256 with a random salt and
// info; AES-256-GCM with a random nonce and info as associated data). The
// result is salt, nonce and ciphertext.
func SealWithSecret(secret []byte, info string, plaintext []byte) ([]byte, error) {
	if len(secret) < minSecret {
		return nil, fmt.Errorf("seal with secret: %w: secret shorter than %d bytes", ErrBadKey, minSecret)
	}
	salt := make([]byte, secretSaltSize)
	_, _ = rand.Read(salt) // never fails (crypto/rand panics instead)
	gcm, err := secretAEAD(secret, salt, info)
	if err != nil {
		return nil, fmt.Errorf("seal with secret: %w", err)
	}
	nonce := make([]byte, gcm.NonceSize())
	_, _ = rand.Read(nonce)
	out := append(salt, nonce...)
	return gcm.Seal(out, nonce, plaintext, []byte(info)), nil
}

// OpenWithSecret opens a value made by SealWithSecret with the same secret
// and info, or returns ErrSealedOpen.
func OpenWithSecret(secret []byte, info string, sealed []byte) ([]byte, error) {
	if len(sealed) < secretSaltSize+12 {
		return nil, ErrSealedOpen
	}
	gcm, err := secretAEAD(secret, sealed[:secretSaltSize], info)
	if err != nil {
		return nil, ErrSealedOpen
	}
	rest := sealed[secretSaltSize:]
	n := gcm.NonceSize()
	if len(rest) < n {
		return nil, ErrSealedOpen
	}
	pt, err := gcm.Open(nil, rest[:n], rest[n:], []byte(info))
	if err != nil {
		return nil, ErrSealedOpen
	}
	return pt, nil
}

// secretAEAD derives the AES-256-GCM of SealWithSecret.
func secretAEAD(secret, salt []byte, info string) (cipher.AEAD, error) {
	if len(secret) == 0 {
		return nil, errors.New("no secret")
	}
	key, err := hkdf.Key(sha256.New, secret, salt, info, 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}
