package programs

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/nats-io/nkeys"
)

// AdminFile is the node's administrative credential in its data
// directory: the node's own in-process clients and the meshbox CLI use it.
const AdminFile = "admin.nk"

// Dir is the directory of the programs' store in a node's data directory.
func Dir(dataDir string) string { return filepath.Join(dataDir, "programs") }

// seedFile is the content of a credential file: comment lines saying what
// it is, then the seed on a line of its own (the form NATS clients read).
func seedFile(seed []byte, what, inbox string) []byte {
	s := "# meshbox credential: " + what + ". Keep it secret (mode 0600).\n" +
		"# Use it with any NATS client as an nkey seed file, e.g. nats --nkey FILE"
	if inbox != "" {
		s += " --inbox-prefix " + inbox
	}
	return []byte(s + "\n" + string(seed) + "\n")
}

// Key is a loaded nkey credential. It prints only its public half.
type Key struct {
	kp  nkeys.KeyPair
	pub string
}

// Public is the public nkey (U...).
func (k *Key) Public() string { return k.pub }

// Sign signs a server's nonce (nats.Nkey's callback).
func (k *Key) Sign(nonce []byte) ([]byte, error) { return k.kp.Sign(nonce) }

// String returns the public key only.
func (k *Key) String() string { return k.pub }

// LogValue logs the public key only.
func (k *Key) LogValue() slog.Value { return slog.StringValue(k.pub) }

// LoadKey reads a credential file (an nkey seed file).
func LoadKey(path string) (*Key, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("credential: %w", err)
	}
	kp, err := nkeys.ParseDecoratedUserNKey(data)
	if err != nil {
		return nil, fmt.Errorf("credential %s: %w", path, err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("credential %s: %w", path, err)
	}
	return &Key{kp: kp, pub: pub}, nil
}

// EnsureAdmin loads the administrative credential in dataDir, making it
// (mode 0600) when it is missing.
func EnsureAdmin(dataDir string) (*Key, error) {
	path := filepath.Join(dataDir, AdminFile)
	k, err := LoadKey(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return k, err
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, fmt.Errorf("admin credential: %w", err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, fmt.Errorf("admin credential: %w", err)
	}
	if err := writeFile(path, seedFile(seed, "the node's administrator (its CLI)", ""), nil); err != nil {
		return nil, fmt.Errorf("admin credential: %w", err)
	}
	return LoadKey(path)
}
