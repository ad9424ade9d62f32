package seal

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// loadOrCreateKeyFile reads the private key file at path with parse, or,
// when the file does not exist, writes the stored form that generate
// returns there (mode 0600, created exclusively) and parses that; created
// says which. A key file that others may read is refused: its private half
// may have leaked. what names the key in errors ("node key").
func loadOrCreateKeyFile(path, what string, parse func([]byte) error, generate func() ([]byte, error)) (created bool, err error) {
	text, err := os.ReadFile(path)
	switch {
	case err == nil:
		fi, err := os.Stat(path)
		if err != nil {
			return false, fmt.Errorf("%s %s: %w", what, path, err)
		}
		if fi.Mode().Perm()&0o077 != 0 {
			return false, fmt.Errorf("%s %s: mode %v lets others read it; chmod 600 it (or make a new key)", what, path, fi.Mode().Perm())
		}
		if err := parse(text); err != nil {
			return false, fmt.Errorf("%s %s: %w", what, path, err)
		}
		return false, nil
	case !errors.Is(err, fs.ErrNotExist):
		return false, fmt.Errorf("%s %s: %w", what, path, err)
	}
	if text, err = generate(); err != nil {
		return false, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return false, fmt.Errorf("%s %s: %w", what, path, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		// Another process made it first: use that one.
		_, err := loadOrCreateKeyFile(path, what, parse, generate)
		return false, err
	}
	if err != nil {
		return false, fmt.Errorf("%s %s: %w", what, path, err)
	}
	_, werr := f.Write(text)
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		_ = os.Remove(path)
		return false, fmt.Errorf("%s %s: %w", what, path, err)
	}
	if err := parse(text); err != nil {
		return false, fmt.Errorf("%s %s: %w", what, path, err)
	}
	return true, nil
}
