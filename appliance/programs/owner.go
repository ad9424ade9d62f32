package programs

import (
	"os"
	"syscall"
)

// fileOwner is a user and group to give files to.
type fileOwner struct{ uid, gid int }

// ownerOf returns dir's owner when this process runs as root and dir
// belongs to another user, else nil.
func ownerOf(dir string) *fileOwner {
	if os.Geteuid() != 0 {
		return nil
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return nil
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || st.Uid == 0 {
		return nil
	}
	return &fileOwner{uid: int(st.Uid), gid: int(st.Gid)}
}
