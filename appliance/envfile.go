package appliance

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// SystemEnvFile is the environment file of the installed service (the
// EnvironmentFile of meshbox.service).
const SystemEnvFile = "/etc/meshbox/meshbox.env"

// DefaultEnvFile is where `meshbox join` writes the node's configuration
// and where `meshbox run` looks for it: SystemEnvFile for root, else
// $XDG_CONFIG_HOME/meshbox/meshbox.env (~/.config/meshbox/meshbox.env).
func DefaultEnvFile() string {
	if os.Geteuid() == 0 {
		return SystemEnvFile
	}
	if d, err := os.UserConfigDir(); err == nil {
		return filepath.Join(d, "meshbox", "meshbox.env")
	}
	return ""
}

// ExistingDefaultEnvFile returns DefaultEnvFile if that file exists, else
// "" (no file is not an error: a standalone node has none).
func ExistingDefaultEnvFile() string {
	p := DefaultEnvFile()
	if p == "" {
		return ""
	}
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// NodeEnvFiles are the env files, in order, where a command looks for the
// configuration of the node on this machine when none is named:
// DefaultEnvFile, then, for a user other than root, SystemEnvFile (the
// installed service's, which such a user may be unable to read).
func NodeEnvFiles() []string {
	p := DefaultEnvFile()
	if p == SystemEnvFile {
		return []string{p}
	}
	return []string{p, SystemEnvFile}
}

// ErrEnvFileExists is returned by WriteEnvFile for a file that exists and
// sets a variable.
var ErrEnvFileExists = errors.New("configuration file already exists")

// refuseExisting returns an ErrEnvFileExists error when path exists and
// sets at least one variable. A file of comments only (the example the
// Debian package installs) holds nothing to lose and may be replaced.
func refuseExisting(path string) error {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("env file: %w", err)
	}
	if vars, err := ReadEnvFile(path); err == nil && len(vars) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s (use --force to replace it)", ErrEnvFileExists, path)
}

// WriteEnvFile writes vars as KEY=VALUE lines (sorted, after a comment
// header) to path with mode 0600, atomically (a temporary file renamed
// over it). It refuses to replace an existing file that sets a variable
// unless replace. The directory is made (0755) if missing.
func WriteEnvFile(path, header string, vars map[string]string, replace bool) error {
	if !replace {
		if err := refuseExisting(path); err != nil {
			return err
		}
	}
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimSpace(header), "\n") {
		b.WriteString("# " + l + "\n")
	}
	keys := make([]string, 0, len(vars))
	for k := range vars {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if strings.ContainsAny(vars[k], "\n\r") {
			return fmt.Errorf("env file: value of %s holds a line break", k)
		}
		b.WriteString(k + "=" + vars[k] + "\n")
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("env file: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".meshbox.env-*")
	if err != nil {
		return fmt.Errorf("env file: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing to remove
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("env file: %w", err)
	}
	if _, err := tmp.WriteString(b.String()); err != nil {
		tmp.Close()
		return fmt.Errorf("env file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("env file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("env file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("env file: %w", err)
	}
	return nil
}

// CheckEnvFileWritable fails when WriteEnvFile(path, ..., replace) would
// fail for the file's existence or its directory, without writing it.
func CheckEnvFileWritable(path string, replace bool) error {
	if !replace {
		if err := refuseExisting(path); err != nil {
			return err
		}
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("env file: %w", err)
	}
	f, err := os.CreateTemp(dir, ".meshbox.env-check-*")
	if err != nil {
		return fmt.Errorf("env file: %w", err)
	}
	f.Close()
	return os.Remove(f.Name())
}
