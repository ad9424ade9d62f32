package appliance

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
)

// checkDataOwner refuses a data directory holding a file this node's user
// does not own, before anything fails on it with a bare "permission
// denied": typically what a command run as root left behind (make run, a
// root node once) in the directory of a node that runs as its own user.
// The error names the file, its owner, and the chown that fixes it. Root
// may use any directory.
func checkDataOwner(dir string) error {
	me := os.Geteuid()
	if me == 0 {
		return nil
	}
	var foreign string
	var owner uint32
	errStop := errors.New("stop")
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrPermission) {
				foreign = path
				if fi, serr := os.Lstat(path); serr == nil {
					if st, ok := fi.Sys().(*syscall.Stat_t); ok {
						owner = st.Uid
					}
				}
				return errStop
			}
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return nil // gone meanwhile
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != me {
			foreign, owner = path, st.Uid
			return errStop
		}
		return nil
	})
	if foreign == "" {
		if err != nil && !errors.Is(err, errStop) {
			return fmt.Errorf("data directory %s: %w", dir, err)
		}
		return nil
	}
	return fmt.Errorf("data directory %s: %s belongs to %s, and this node runs as %s: as root, run: chown -R %s: %s",
		dir, foreign, userName(int(owner)), userName(me), loginName(me), dir)
}

// userName is uid's name and number: "meshbox (uid 998)".
func userName(uid int) string {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		return fmt.Sprintf("%s (uid %d)", u.Username, uid)
	}
	return fmt.Sprintf("uid %d", uid)
}

// loginName is uid's name, or its number when it has none.
func loginName(uid int) string {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		return u.Username
	}
	return strconv.Itoa(uid)
}
