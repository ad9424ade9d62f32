package programs

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestStoreFilesTakeTheDataDirectorysOwner: root writing into a data
// directory another user owns (sudo meshbox program add, with the node
// running as its own user) gives the files to that user, so the node can
// read them. Needs root, as the package test does.
func TestStoreFilesTakeTheDataDirectorysOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (as make test runs): it gives files to another user")
	}
	data := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	const uid, gid = 65534, 65534 // nobody
	if err := os.Chown(data, uid, gid); err != nil {
		t.Fatal(err)
	}
	s, err := Open(Dir(data))
	if err != nil {
		t.Fatal(err)
	}
	path, err := s.Put(Program{Name: "sensor", Publish: []string{"temp"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{Dir(data), path, filepath.Join(Dir(data), "sensor.json")} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != uid || st.Gid != gid {
			t.Errorf("%s: owner %d:%d, want %d:%d (the data directory's)", p, st.Uid, st.Gid, uid, gid)
		}
	}
	// The control: a data directory of root's own keeps root's files.
	own := filepath.Join(t.TempDir(), "own")
	if err := os.Mkdir(own, 0o700); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(Dir(own))
	if err != nil {
		t.Fatal(err)
	}
	p2, err := s2.Put(Program{Name: "sensor", Publish: []string{"temp"}})
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(p2); fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("%s in root's own directory: owner %d, want root", p2, fi.Sys().(*syscall.Stat_t).Uid)
	}
}
