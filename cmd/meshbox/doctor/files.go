package doctor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/meshbox/meshbox/appliance/programs"
)

// fileOwner returns the uid owning fi (-1 where the platform does not say).
func fileOwner(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}

// checkDataDir: the data directory exists, is a directory, is private
// (no group or other bits: it holds grant credentials) and belongs to the
// user that runs the node.
func (d *Doctor) checkDataDir(context.Context) Check {
	const name = "data directory"
	dir := d.cfg.DataDir
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return warn(name, "meshbox run creates it (mode 0700); pass --data if the node uses another directory",
			"%s does not exist yet", dir)
	case err != nil:
		return fail(name, "", "%s: %v", dir, err)
	case !fi.IsDir():
		return fail(name, "point --data (MESHBOX_DATA) at a directory", "%s is not a directory", dir)
	}
	return checkPrivate(name, dir, fi, os.Geteuid(), "chmod 700 "+dir)
}

// checkPrivate checks that fi has no group or other permission bits and is
// owned by euid (root may look at anyone's).
func checkPrivate(name, path string, fi fs.FileInfo, euid int, fix string) Check {
	perm := fi.Mode().Perm()
	owner := fileOwner(fi)
	if perm&0o077 != 0 {
		return fail(name, fix, "%s has mode %#o: other users can read or change it (it holds the mesh's credentials)", path, perm)
	}
	if owner >= 0 && owner != euid {
		if euid == 0 {
			return ok(name, "%s: mode %#o, owned by uid %d (the service user)", path, perm, owner)
		}
		return fail(name, fmt.Sprintf("run doctor as the user that runs meshbox, or chown -R %d %s", euid, path),
			"%s is owned by uid %d, not by this user (uid %d)", path, owner, euid)
	}
	return ok(name, "%s: mode %#o, owned by uid %d", path, perm, owner)
}

// checkDataFiles: the cache, outbox and completed-ids files are private
// (0600) and owned like their directory.
func (d *Doctor) checkDataFiles(context.Context) Check {
	const name = "data files"
	dirInfo, err := os.Stat(d.cfg.DataDir)
	if err != nil || !dirInfo.IsDir() {
		return ok(name, "no data directory, no files to check")
	}
	var found []string
	for _, f := range []string{"cache.db", "outbox.db", "completed.db", programs.AdminFile} {
		path := filepath.Join(d.cfg.DataDir, f)
		fi, err := os.Stat(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fail(name, "", "%s: %v", path, err)
		}
		if !fi.Mode().IsRegular() {
			return fail(name, "move it away; the node creates the file", "%s is not a regular file", path)
		}
		if perm := fi.Mode().Perm(); perm&0o077 != 0 {
			return fail(name, "chmod 600 "+path, "%s has mode %#o: other users can read it", path, perm)
		}
		if o, do := fileOwner(fi), fileOwner(dirInfo); o != do {
			return fail(name, fmt.Sprintf("chown %d %s", do, path), "%s is owned by uid %d, its directory by uid %d", path, o, do)
		}
		found = append(found, f)
	}
	if len(found) == 0 {
		return ok(name, "none yet")
	}
	return ok(name, "%s: mode 0600", strings.Join(found, ", "))
}
