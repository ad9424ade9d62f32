package seal

import (
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"strings"
)

// A recovery kit is a mesh's secret of last resort: 32 random bytes that
// its administrator keeps off the mesh (a file, or the same secret as
// groups of letters written on paper). An HPKE key pair is derived from
// it; the mesh's keys are sealed to the kit's public half as they are to
// every node's, so that whoever holds the kit can open them when no node
// that holds them is left.
//
// The secret's written form is 52 letters and digits of base32 in groups
// of four, and a last group that is a checksum of the secret and the
// mesh's name: a mistyped group, a kit of another mesh or a damaged file
// is an error that says which, never a key that opens nothing.

// ErrBadKit means a recovery kit (its file or its words) is damaged or
// mistyped.
var ErrBadKit = errors.New("invalid recovery kit")

// kitHeader starts a kit's file.
const kitHeader = "meshbox-recovery-kit-v1"

// kitDerive is the HKDF info of the kit's key pair.
const kitDerive = "meshbox recovery kit key v1"

// kitWords encodes the secret: base32 without padding, in capitals.
var kitWords = base32.StdEncoding.WithPadding(base32.NoPadding)

// Kit is a mesh's recovery kit. Like a node key, it never prints its
// secret: String shows the mesh and the fingerprint of its public half.
type Kit struct {
	mesh   string
	secret [32]byte
	key    *NodeKey
}

// NewKit makes a recovery kit for the mesh named mesh.
func NewKit(mesh string) (*Kit, error) {
	var s [32]byte
	if _, err := rand.Read(s[:]); err != nil {
		return nil, fmt.Errorf("make recovery kit: %w", err)
	}
	return kitFrom(mesh, s)
}

func kitFrom(mesh string, secret [32]byte) (*Kit, error) {
	if mesh == "" || strings.ContainsAny(mesh, "\n\r") {
		return nil, fmt.Errorf("%w: the mesh's name %q", ErrBadKit, mesh)
	}
	seed, err := hkdf.Key(sha256.New, secret[:], []byte(mesh), kitDerive, 32)
	if err != nil {
		return nil, fmt.Errorf("recovery kit: %w", err)
	}
	priv, err := kem.NewPrivateKey(seed)
	if err != nil {
		return nil, fmt.Errorf("recovery kit: %w", err)
	}
	return &Kit{mesh: mesh, secret: secret, key: &NodeKey{priv: priv, pub: priv.PublicKey().Bytes()}}, nil
}

// Mesh is the name of the mesh the kit belongs to.
func (k *Kit) Mesh() string { return k.mesh }

// Public is the kit's public key: what the mesh's keys are sealed to.
func (k *Kit) Public() []byte { return k.key.Public() }

// Fingerprint is a short digest of the public key.
func (k *Kit) Fingerprint() string { return k.key.Fingerprint() }

// String names the kit without its secret.
func (k *Kit) String() string { return "recovery kit of mesh " + k.mesh + " (" + k.Fingerprint() + ")" }

// Open opens a value sealed to the kit's public key for info.
func (k *Kit) Open(info string, sealed []byte) ([]byte, error) { return k.key.Open(info, sealed) }

// Words is the secret to write down: groups of four letters and digits,
// the last a checksum.
func (k *Kit) Words() string {
	enc := kitWords.EncodeToString(k.secret[:]) // 52 characters
	sum := kitChecksum(k.mesh, k.secret)
	var groups []string
	for i := 0; i < len(enc); i += 4 {
		groups = append(groups, enc[i:min(i+4, len(enc))])
	}
	return strings.Join(append(groups, sum), "-")
}

// kitChecksum is four base32 characters of a digest of the mesh's name
// and the secret.
func kitChecksum(mesh string, secret [32]byte) string {
	h := sha256.New()
	h.Write([]byte(kitHeader + "\x00" + mesh + "\x00"))
	h.Write(secret[:])
	return kitWords.EncodeToString(h.Sum(nil))[:4]
}

// MarshalText is the kit's file: write it only with mode 0600.
func (k *Kit) MarshalText() ([]byte, error) {
	return []byte(kitHeader + "\nmesh: " + k.mesh + "\nsecret: " + k.Words() + "\n"), nil
}

// ParseKitWords reads a kit's secret as written down (Words), for the
// mesh named mesh: case, spaces and dashes do not matter.
func ParseKitWords(mesh, words string) (*Kit, error) {
	if mesh == "" || strings.ContainsAny(mesh, "\n\r") {
		return nil, fmt.Errorf("%w: the mesh's name %q", ErrBadKit, mesh)
	}
	s := strings.ToUpper(strings.NewReplacer("-", "", " ", "", "\t", "", "\n", "").Replace(words))
	if len(s) != 56 {
		return nil, fmt.Errorf("%w: the secret has %d letters and digits, a kit's has 56 (14 groups of 4)", ErrBadKit, len(s))
	}
	raw, err := kitWords.DecodeString(s[:52])
	if err != nil || len(raw) != 32 {
		return nil, fmt.Errorf("%w: the secret holds a character that is no letter A-Z or digit 2-7", ErrBadKit)
	}
	var secret [32]byte
	copy(secret[:], raw)
	if kitChecksum(mesh, secret) != s[52:] {
		return nil, fmt.Errorf("%w: its checksum does not match: a group is mistyped, or it is the kit of another mesh than %q", ErrBadKit, mesh)
	}
	return kitFrom(mesh, secret)
}

// ParseKit reads a kit's file (MarshalText).
func ParseKit(text []byte) (*Kit, error) {
	lines := strings.Split(strings.TrimSpace(string(text)), "\n")
	if len(lines) != 3 || strings.TrimSpace(lines[0]) != kitHeader {
		return nil, fmt.Errorf("%w: not a meshbox recovery kit file (it starts with %q and has a mesh and a secret line)", ErrBadKit, kitHeader)
	}
	mesh, ok1 := strings.CutPrefix(strings.TrimSpace(lines[1]), "mesh: ")
	words, ok2 := strings.CutPrefix(strings.TrimSpace(lines[2]), "secret: ")
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("%w: the file lacks its mesh or secret line", ErrBadKit)
	}
	return ParseKitWords(mesh, words)
}

// KitKeyInfo is the HPKE info of content key id sealed to a mesh's kit.
func KitKeyInfo(id, mesh string) string {
	return "meshbox content key for the kit v1\x00" + id + "\x00" + mesh
}
