package programs

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/nats-io/nkeys"
)

// File names in a Store's directory.
const (
	defExt  = ".json"
	seedExt = ".nk"
	mqttExt = ".mqtt"
)

// Store keeps program definitions and their seeds in one directory.
type Store struct {
	dir string
	mu  sync.Mutex // serializes Put and Remove in this process
	// owner is the data directory's owner when this process is root and
	// the directory is another user's (the node's): what root writes here
	// is given to that user, so that the node can read it.
	owner *fileOwner
}

// Open returns the store in dir, making the directory (mode 0700) if it
// is missing. Run as root in a data directory another user owns (sudo
// meshbox program add, with the node running as its own user), the files
// it writes take that user as their owner.
func Open(dir string) (*Store, error) {
	owner := ownerOf(filepath.Dir(dir))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("programs: %w", err)
	}
	if owner != nil {
		if err := os.Chown(dir, owner.uid, owner.gid); err != nil {
			return nil, fmt.Errorf("programs: give %s to the data directory's owner (uid %d): %w", dir, owner.uid, err)
		}
	}
	return &Store{dir: dir, owner: owner}, nil
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// CredsPath is where the seed of program name is written.
func (s *Store) CredsPath(name string) string { return filepath.Join(s.dir, name+seedExt) }

func (s *Store) defPath(name string) string { return filepath.Join(s.dir, name+defExt) }

// Put creates program p or replaces its lists, and returns the path of
// its credential file. A new program gets a new key pair; an existing one
// keeps its key (clients need no new file when their lists change). The
// node applies the change when it reloads (see the appliance).
func (s *Store) Put(p Program) (credsPath string, err error) {
	p.Key = ""
	if err := p.Validate(); err != nil {
		return "", err
	}
	p.normalize()
	s.mu.Lock()
	defer s.mu.Unlock()
	old, err := s.Get(p.Name)
	switch {
	case err == nil && old.Key != "" && fileExists(s.CredsPath(p.Name)):
		p.Key = old.Key
	case err == nil || errors.Is(err, ErrNotFound) || errors.Is(err, ErrInvalid):
		// New, or a definition that cannot be read: a new key pair.
		kp, err := nkeys.CreateUser()
		if err != nil {
			return "", fmt.Errorf("program %s: new key: %w", p.Name, err)
		}
		seed, err := kp.Seed()
		if err != nil {
			return "", fmt.Errorf("program %s: new key: %w", p.Name, err)
		}
		if p.Key, err = kp.PublicKey(); err != nil {
			return "", fmt.Errorf("program %s: new key: %w", p.Name, err)
		}
		if err := s.writeFile(s.CredsPath(p.Name), seedFile(seed, "program "+p.Name, p.InboxPrefix())); err != nil {
			return "", fmt.Errorf("program %s: %w", p.Name, err)
		}
	default:
		return "", err
	}
	if err := s.mqttPassword(&p, old); err != nil {
		return "", err
	}
	data, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return "", fmt.Errorf("program %s: %w", p.Name, err)
	}
	if err := s.writeFile(s.defPath(p.Name), append(data, '\n')); err != nil {
		return "", fmt.Errorf("program %s: %w", p.Name, err)
	}
	return s.CredsPath(p.Name), nil
}

// Get reads program name. A file that cannot be read or breaks the rules
// is an error that names it (and wraps ErrInvalid when it is the file's
// content); a missing one wraps ErrNotFound.
func (s *Store) Get(name string) (Program, error) {
	if err := CheckName(name); err != nil {
		return Program{}, err
	}
	return readDef(s.defPath(name), name)
}

// List reads every program, sorted by name. A definition that cannot be
// read is reported in errs (naming its file) and left out; the others are
// returned all the same.
func (s *Store) List() (progs []Program, errs []error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, []error{fmt.Errorf("programs: %w", err)}
	}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), defExt)
		if !ok || e.IsDir() {
			continue
		}
		p, err := readDef(filepath.Join(s.dir, e.Name()), name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		progs = append(progs, p)
	}
	slices.SortFunc(progs, func(a, b Program) int { return strings.Compare(a.Name, b.Name) })
	return progs, errs
}

// Remove deletes program name's definition and credential file.
func (s *Store) Remove(name string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	err := os.Remove(s.defPath(name))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("program %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("program %s: %w", name, err)
	}
	for _, path := range []string{s.CredsPath(name), s.MQTTPath(name)} {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("program %s: %w", name, err)
		}
	}
	return nil
}

// MQTTPath is where the MQTT password of program name is written.
func (s *Store) MQTTPath(name string) string { return filepath.Join(s.dir, name+mqttExt) }

// MQTTLogin reads program name's MQTT user name and password from its
// file (MQTTPath).
func (s *Store) MQTTLogin(name string) (user, password string, err error) {
	data, err := os.ReadFile(s.MQTTPath(name))
	if err != nil {
		return "", "", err
	}
	if user, password, err = ReadMQTT(data); err != nil {
		return "", "", fmt.Errorf("%s: %w", s.MQTTPath(name), err)
	}
	return user, password, nil
}

// mqttPassword gives p its MQTT password when it signs in over MQTT: the
// one it had (old, with its file), or a new one written to MQTTPath. A
// program that no longer does loses both.
func (s *Store) mqttPassword(p *Program, old Program) error {
	p.MQTTPassword = ""
	if !p.MQTT {
		if err := os.Remove(s.MQTTPath(p.Name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("program %s: %w", p.Name, err)
		}
		return nil
	}
	if old.MQTT && old.MQTTPassword != "" && fileExists(s.MQTTPath(p.Name)) {
		p.MQTTPassword = old.MQTTPassword
		return nil
	}
	password, hash, err := newMQTTPassword()
	if err != nil {
		return fmt.Errorf("program %s: %w", p.Name, err)
	}
	if err := s.writeFile(s.MQTTPath(p.Name), mqttFile(p.Name, password)); err != nil {
		return fmt.Errorf("program %s: %w", p.Name, err)
	}
	p.MQTTPassword = hash
	return nil
}

// readDef reads and checks one definition file; name is the name its file
// gives it.
func readDef(path, name string) (Program, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Program{}, fmt.Errorf("program %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return Program{}, fmt.Errorf("program file %s: %w", path, err)
	}
	var p Program
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return Program{}, fmt.Errorf("program file %s: %w: %w", path, ErrInvalid, err)
	}
	if p.Name != name {
		return Program{}, fmt.Errorf("program file %s: %w: it names program %q", path, ErrInvalid, p.Name)
	}
	if p.Key == "" {
		return Program{}, fmt.Errorf("program file %s: %w: no key", path, ErrInvalid)
	}
	if err := p.Validate(); err != nil {
		return Program{}, fmt.Errorf("program file %s: %w", path, err)
	}
	return p, nil
}

// writeFile writes data to path atomically, mode 0600.
func (s *Store) writeFile(path string, data []byte) error { return writeFile(path, data, s.owner) }

// writeFile writes data to path atomically, mode 0600, given to owner when
// it is not nil.
func writeFile(path string, data []byte, owner *fileOwner) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing to remove
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if owner != nil {
		if err := tmp.Chown(owner.uid, owner.gid); err != nil {
			tmp.Close()
			return err
		}
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
