package modules

import (
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/meshbox/meshbox/cache"
)

// runAs is the user a module runs as.
type runAs struct {
	name string
	home string
	cred *syscall.Credential // nil: the node's own user
	uid  int                 // -1: the node's own (no chown)
	gid  int
}

// lookupUser resolves a manifest's user. "" is the node's own user. Another
// user needs a node running as root (euid 0): a node that cannot switch
// refuses, naming both users.
func lookupUser(name string) (runAs, error) {
	self := runAs{uid: -1, gid: -1}
	if u, err := user.Current(); err == nil {
		self.name, self.home = u.Username, u.HomeDir
	}
	if name == "" || name == self.name {
		return self, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return runAs{}, fmt.Errorf("user %q: %w", name, err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return runAs{}, fmt.Errorf("user %q: uid %q or gid %q is not a number", name, u.Uid, u.Gid)
	}
	if uid == os.Geteuid() {
		return self, nil
	}
	if os.Geteuid() != 0 {
		return runAs{}, fmt.Errorf("module runs as user %q, but the node runs as %q (uid %d) and may not switch users", name, self.name, os.Geteuid())
	}
	var groups []uint32
	if ids, err := u.GroupIds(); err == nil {
		for _, g := range ids {
			if n, err := strconv.ParseUint(g, 10, 32); err == nil {
				groups = append(groups, uint32(n))
			}
		}
	}
	return runAs{
		name: name, home: u.HomeDir, uid: uid, gid: gid,
		cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: groups},
	}, nil
}

// prepareRuntimeDir makes <runDir>/<module> afresh for one run: mode 0700,
// owned by the module's user, with a grants folder holding one 0600 file
// per grant. It returns the directory and the environment naming the
// grant files. The files are written before the module starts and hold
// nothing else; their contents never leave them.
func prepareRuntimeDir(runDir, module string, as runAs, m *Manifest, grants []cache.Grant, open GrantOpener) (dir string, env map[string]string, err error) {
	if err := os.MkdirAll(runDir, 0o711); err != nil {
		return "", nil, fmt.Errorf("runtime directory: %w", err)
	}
	dir = filepath.Join(runDir, module)
	// Afresh: no grant of an earlier run survives its revocation. A node
	// that switches users holds no CAP_DAC_OVERRIDE (see the unit's
	// drop-in): it takes back what the module's user made before it
	// removes it.
	if os.Geteuid() == 0 {
		reclaim(dir)
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", nil, fmt.Errorf("runtime directory: %w", err)
	}
	gdir := filepath.Join(dir, "grants")
	for _, d := range []string{dir, gdir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return "", nil, fmt.Errorf("runtime directory: %w", err)
		}
		if err := os.Chmod(d, 0o700); err != nil { // whatever the umask
			return "", nil, fmt.Errorf("runtime directory: %w", err)
		}
	}
	// Given to the module's user last, once filled: the node needs no
	// right over that user's files to fill them.
	defer func() {
		for _, d := range []string{gdir, dir} {
			if err == nil {
				err = chown(d, as)
			}
		}
		if err != nil {
			dir, env = "", nil
		}
	}()
	env = map[string]string{EnvRuntimeDir: dir, EnvGrantsDir: gdir}
	for _, ref := range m.Grants {
		var paths []string
		for _, g := range grants {
			if g.Resource != ref.Resource {
				continue
			}
			cred := g.Credential
			if g.SealedCredential != "" {
				if open == nil {
					return "", nil, fmt.Errorf("grant %s from %s: sealed, and the node cannot open grants", g.Resource, g.Provider)
				}
				if cred, err = open(g); err != nil {
					return "", nil, fmt.Errorf("grant %s from %s: %w", g.Resource, g.Provider, err)
				}
			}
			p := filepath.Join(gdir, GrantFile(g.Resource, g.Provider))
			if err := writeSecret(p, cred.Reveal(), as); err != nil {
				return "", nil, err
			}
			paths = append(paths, p)
		}
		if len(paths) == 0 {
			continue
		}
		name := ref.Env
		if name == "" {
			name = GrantEnv(ref.Resource)
		}
		env[name] = strings.Join(paths, string(os.PathListSeparator))
	}
	return dir, env, nil
}

// reclaim makes path and everything below it the node's own, top down
// (a directory is taken before it is read), so that RemoveAll needs no
// right over other users' files. Best effort: RemoveAll reports what is
// left.
func reclaim(path string) {
	if err := os.Lchown(path, os.Geteuid(), os.Getegid()); err != nil {
		return
	}
	fi, err := os.Lstat(path)
	if err != nil || !fi.IsDir() {
		return
	}
	_ = os.Chmod(path, 0o700)
	entries, err := os.ReadDir(path)
	if err != nil {
		return
	}
	for _, e := range entries {
		reclaim(filepath.Join(path, e.Name()))
	}
}

// GrantFile is the name of the file that holds the grant of resource from
// provider: both escaped so that neither can leave the grants folder.
func GrantFile(resource, provider string) string {
	return url.QueryEscape(resource) + "@" + url.QueryEscape(provider)
}

// GrantOpener opens a grant's credential sealed to the node's key, in
// memory.
type GrantOpener func(cache.Grant) (cache.Credential, error)

// NATSKeyFile is the name of the module's local NATS credential (an nkey
// seed file) in its runtime directory.
const NATSKeyFile = "nats.nk"

// writeSecret writes a file only its owner (the module's user) can read.
func writeSecret(path, value string, as runAs) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("secret file: %w", err)
	}
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("secret file: %w", err)
	}
	if as.uid >= 0 {
		if err := f.Chown(as.uid, as.gid); err != nil {
			f.Close()
			return fmt.Errorf("secret file: %w", err)
		}
	}
	if _, err := f.WriteString(value); err != nil {
		f.Close()
		return fmt.Errorf("secret file: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("secret file: %w", err)
	}
	return nil
}

func chown(path string, as runAs) error {
	if as.uid < 0 {
		return nil
	}
	if err := os.Chown(path, as.uid, as.gid); err != nil {
		return fmt.Errorf("runtime directory: %w", err)
	}
	return nil
}

// moduleEnv builds a module's whole environment, in layers, each beating
// the one before: the base (PATH, HOME, USER), the selection's env, what
// the node sets (MESHBOX_*, NATS_URL, NATS_NKEY, NATS_INBOX_PREFIX, the grant files), and
// last the overrides. Nothing of the node's own environment is passed on:
// it may hold the database's password.
func moduleEnv(base, selection, node, overrides map[string]string) []string {
	all := map[string]string{}
	for _, layer := range []map[string]string{base, selection, node, overrides} {
		maps.Copy(all, layer)
	}
	out := make([]string, 0, len(all))
	for _, k := range slices.Sorted(maps.Keys(all)) {
		out = append(out, k+"="+all[k])
	}
	return out
}

// overrideEnv maps a module's overrides to environment variables: the
// manifest's name for the key, else OverrideEnv(key).
func overrideEnv(m *Manifest, overrides []cache.Override) map[string]string {
	env := map[string]string{}
	for _, o := range overrides {
		name := m.Overrides[o.Key]
		if name == "" {
			name = OverrideEnv(o.Key)
		}
		env[name] = o.Value
	}
	return env
}
