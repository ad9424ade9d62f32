package main

import (
	"os"
	"strconv"
	"syscall"
)

// streamID is f's "device:inode", as systemd writes $JOURNAL_STREAM.
func streamID(f *os.File) string {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return ""
	}
	return strconv.FormatUint(uint64(st.Dev), 10) + ":" + strconv.FormatUint(st.Ino, 10)
}
