package meshtest

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// pgShmID returns the System V shared memory id the server in dataDir
// recorded in its postmaster.pid (line 7: key and id), or -1.
func pgShmID(dataDir string) int {
	data, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return -1
	}
	lines := strings.Split(string(data), "\n")
	if len(lines) < 7 {
		return -1
	}
	f := strings.Fields(lines[6])
	if len(f) != 2 {
		return -1
	}
	id, err := strconv.Atoi(f[1])
	if err != nil {
		return -1
	}
	return id
}

// shmAttached reports how many processes have the segment id attached
// (0 when it is gone), from /proc/sysvipc/shm.
func shmAttached(id int) int {
	f, err := os.Open("/proc/sysvipc/shm")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 7 {
			continue
		}
		if sid, err := strconv.Atoi(fs[1]); err == nil && sid == id {
			n, _ := strconv.Atoi(fs[6])
			return n
		}
	}
	return 0
}

// waitShmDetached waits, up to d, until no process has the segment id
// attached: PostgreSQL refuses to start over a segment a killed backend
// still holds ("pre-existing shared memory block is still in use"), and
// SIGKILLed backends of a loaded machine can take a moment to go.
func waitShmDetached(id int, d time.Duration) bool {
	if id < 0 {
		return true
	}
	deadline := time.Now().Add(d)
	for shmAttached(id) > 0 {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond) // polling the kernel's table: nothing signals a detach
	}
	return true
}
