package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
)

// ContentKeySize is the size of a content key: AES-256.
const ContentKeySize = 32

// Overhead is what sealing adds to a message: the nonce and the tag.
const Overhead = 12 + 16

// maxKeyID bounds a key id.
const maxKeyID = 32

// ContentKey is one of a mesh's (or a scope's) content keys. It prints and
// logs as its id only.
type ContentKey struct {
	ID string
	// Scope is the scope the key belongs to ("": the mesh's own key).
	Scope string
	key   [ContentKeySize]byte
}

// NewContentKey makes a content key with a fresh random id ("k" and 12 hex
// digits).
func NewContentKey() ContentKey {
	var k ContentKey
	_, _ = rand.Read(k.key[:]) // crypto/rand.Read never fails
	var id [6]byte
	_, _ = rand.Read(id[:])
	k.ID = "k" + hex.EncodeToString(id[:])
	return k
}

// ContentKeyFrom builds a content key from its id and its 32 bytes (as
// opened from a sealed copy).
func ContentKeyFrom(id string, b []byte) (ContentKey, error) {
	if err := ValidateKeyID(id); err != nil {
		return ContentKey{}, err
	}
	if len(b) != ContentKeySize {
		return ContentKey{}, fmt.Errorf("%w: content key %s has %d bytes, want %d", ErrBadKey, id, len(b), ContentKeySize)
	}
	k := ContentKey{ID: id}
	copy(k.key[:], b)
	return k, nil
}

// Bytes returns the key's secret bytes, to be sealed to a node (SealTo).
func (k ContentKey) Bytes() []byte { return slices.Clone(k.key[:]) }

// String returns the key's id only.
func (k ContentKey) String() string { return "content key " + k.ID }

// LogValue implements slog.LogValuer: the id only.
func (k ContentKey) LogValue() slog.Value { return slog.StringValue(k.ID) }

// ValidateKeyID checks a key id: 1 to 32 of [a-z0-9-], starting with a
// letter or digit.
func ValidateKeyID(id string) error {
	if id == "" || len(id) > maxKeyID || id[0] == '-' {
		return fmt.Errorf("%w: key id %q: want 1 to %d of [a-z0-9-]", ErrBadKey, id, maxKeyID)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return fmt.Errorf("%w: key id %q: want 1 to %d of [a-z0-9-]", ErrBadKey, id, maxKeyID)
		}
	}
	return nil
}

// Fingerprint returns the first 16 hex digits of the SHA-256 of b.
func Fingerprint(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// Keyring holds the content keys a node has and the id it seals with. Its
// methods are safe for concurrent use; Set replaces the whole set at once.
// The zero value holds no key.
type Keyring struct {
	state atomic.Pointer[ringState]

	mu      sync.Mutex
	changed chan struct{} // closed by the next SetScoped (nil: none asked for)
}

// Changed returns a channel closed when the keys are next replaced: a
// reader waiting for a key wakes when it arrives. Take it before looking
// at the keys, so that a change between the two is not missed.
func (r *Keyring) Changed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.changed == nil {
		r.changed = make(chan struct{})
	}
	return r.changed
}

// ringState is one immutable set of keys.
type ringState struct {
	current *ringKey            // the mesh's key to seal with
	byID    map[string]*ringKey // every key held, of every scope
	scopes  *ScopeState         // scope keys to seal with, bindings, membership
}

type ringKey struct {
	id    string
	scope string
	aead  cipher.AEAD
}

// NewKeyring returns a keyring holding keys, sealing with current (see
// Set).
func NewKeyring(keys []ContentKey, current string) (*Keyring, error) {
	r := &Keyring{}
	if err := r.Set(keys, current); err != nil {
		return nil, err
	}
	return r, nil
}

// Set replaces the keys; current is the id to seal with ("" : none, the
// keyring then only opens). current must be one of keys, of no scope.
// The keyring then knows no scope (see SetScoped).
func (r *Keyring) Set(keys []ContentKey, current string) error {
	return r.SetScoped(keys, current, Scopes{})
}

// SetScoped replaces the keys (of the mesh and of scopes), the mesh's key
// to seal with (current, as Set), and what sc says of scopes: each
// scope's key to seal with, the names bound to scopes and the scopes this
// node is in.
func (r *Keyring) SetScoped(keys []ContentKey, current string, sc Scopes) error {
	st := &ringState{byID: make(map[string]*ringKey, len(keys))}
	for _, k := range keys {
		if err := ValidateKeyID(k.ID); err != nil {
			return err
		}
		block, err := aes.NewCipher(k.key[:])
		if err != nil {
			return fmt.Errorf("content key %s: %w", k.ID, err)
		}
		g, err := cipher.NewGCMWithRandomNonce(block)
		if err != nil {
			return fmt.Errorf("content key %s: %w", k.ID, err)
		}
		st.byID[k.ID] = &ringKey{id: k.ID, scope: k.Scope, aead: g}
	}
	if current != "" {
		st.current = st.byID[current]
		if st.current == nil || st.current.scope != "" {
			return fmt.Errorf("%w: current key %s is not among the mesh's keys", ErrUnknownKey, current)
		}
	}
	ss, err := newScopeState(sc, st.byID)
	if err != nil {
		return err
	}
	st.scopes = ss
	r.state.Store(st)
	r.mu.Lock()
	if r.changed != nil {
		close(r.changed)
		r.changed = nil
	}
	r.mu.Unlock()
	return nil
}

// Current returns the id sealed with now ("" : none).
func (r *Keyring) Current() string {
	if st := r.state.Load(); st != nil && st.current != nil {
		return st.current.id
	}
	return ""
}

// IDs returns the ids held, sorted.
func (r *Keyring) IDs() []string {
	st := r.state.Load()
	if st == nil {
		return nil
	}
	ids := make([]string, 0, len(st.byID))
	for id := range st.byID {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Has reports whether the keyring holds key id.
func (r *Keyring) Has(id string) bool {
	st := r.state.Load()
	return st != nil && st.byID[id] != nil
}

// Sealer returns the key to seal with now, or ErrNoKey. The caller puts
// its id in the associated data before it seals.
func (r *Keyring) Sealer() (*Sealer, error) {
	st := r.state.Load()
	if st == nil || st.current == nil {
		return nil, ErrNoKey
	}
	return (*Sealer)(st.current), nil
}

// Sealer seals with one content key. It stays valid after the keyring
// changes.
type Sealer ringKey

// ID returns the id of the key.
func (s *Sealer) ID() string { return s.id }

// Scope returns the scope of the key ("": the mesh's).
func (s *Sealer) Scope() string { return s.scope }

// Seal seals plaintext with associated data ad, appending nonce ||
// ciphertext || tag to dst, and returns the result. plaintext may start
// dst's capacity: Seal(buf[:0], ad, buf[:n]) seals in place when cap(buf)
// >= n+Overhead. ad must not overlap the result.
func (s *Sealer) Seal(dst, ad, plaintext []byte) []byte {
	return s.aead.Seal(dst, nil, plaintext, ad)
}

// Open opens a message sealed under key id with associated data ad,
// appending the plaintext to dst. dst may be sealed[:0] to open in place
// (sealed is then destroyed); otherwise sealed is left as it is.
func (r *Keyring) Open(dst []byte, id string, ad, sealed []byte) ([]byte, error) {
	st := r.state.Load()
	var k *ringKey
	if st != nil {
		k = st.byID[id]
	}
	if k == nil {
		return nil, ErrUnknownKey
	}
	if len(sealed) < Overhead {
		return nil, ErrTampered
	}
	pt, err := k.aead.Open(dst, nil, sealed, ad)
	if err != nil {
		return nil, ErrTampered
	}
	return pt, nil
}

// AssociatedData appends to dst the canonical encoding of fields: a
// label, then each field as a uvarint length and its bytes, so no two
// different lists encode the same.
func AssociatedData(dst []byte, label string, fields ...string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(label)))
	dst = append(dst, label...)
	for _, f := range fields {
		dst = binary.AppendUvarint(dst, uint64(len(f)))
		dst = append(dst, f...)
	}
	return dst
}
