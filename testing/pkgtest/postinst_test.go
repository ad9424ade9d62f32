package pkgtest

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestPostinstWithoutSystemd runs the package's postinst where systemd's
// tools are absent (a container, a minimal system): with only the
// commands its fallback uses on PATH, it must make the same system user
// and data directory as systemd-sysusers and systemd-tmpfiles do, and the
// configuration root-only. TestDebianPackage takes whichever path the
// machine offers; this one takes the fallback on every machine.
func TestPostinstWithoutSystemd(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the maintainer script: not under -short")
	}
	if os.Geteuid() != 0 {
		t.Fatal("postinst chowns the data directory: run the test as root")
	}
	top := moduleRoot(t)

	// Only what the fallback needs: no systemd-sysusers, no systemd-tmpfiles.
	bin := t.TempDir()
	for _, tool := range []string{"cat", "grep", "awk", "chown", "chmod", "mkdir", "useradd"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Fatalf("%s is missing: %v", tool, err)
		}
		if err := os.Symlink(p, filepath.Join(bin, tool)); err != nil {
			t.Fatal(err)
		}
	}

	// The root as dpkg leaves it before postinst: the conffile and the
	// data directory unpacked, here with looser modes for postinst to fix.
	root := t.TempDir()
	env := filepath.Join(root, "etc/meshbox/meshbox.env")
	data := filepath.Join(root, "var/lib/meshbox")
	if err := os.MkdirAll(filepath.Dir(env), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(env, []byte("# settings\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}

	postinst := filepath.Join(top, "deploy/deb/postinst")
	vars := []string{"PATH=" + bin, "DPKG_ROOT=" + root}
	out := run(t, vars, "/bin/sh", postinst, "configure")
	if !strings.Contains(out, "nothing runs yet") {
		t.Errorf("first install: output lacks the next steps:\n%s", out)
	}
	uid, gid, home, shell := systemUser(t, root, "meshbox")
	if uid == 0 || gid == 0 || home != "/var/lib/meshbox" || shell != "/usr/sbin/nologin" {
		t.Errorf("system user meshbox: got uid %d gid %d home %q shell %q, want a system user and group, /var/lib/meshbox, /usr/sbin/nologin",
			uid, gid, home, shell)
	}
	wantFile(t, data, fs.ModeDir|0o700, uid, gid)
	wantFile(t, env, 0o600, 0, 0)
	// The backup timer's directory: root's, as the backup service runs.
	wantFile(t, filepath.Join(root, "var/backups/meshbox"), fs.ModeDir|0o700, 0, 0)

	// An upgrade runs it again: the same user, no second one, no first-install text.
	out = run(t, vars, "/bin/sh", postinst, "configure", "0~20250101000000+abc")
	if strings.Contains(out, "nothing runs yet") {
		t.Errorf("upgrade: printed the first-install steps again:\n%s", out)
	}
	passwd, err := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count("\n"+string(passwd), "\nmeshbox:"); n != 1 {
		t.Errorf("upgrade: %d users meshbox in /etc/passwd, want 1:\n%s", n, passwd)
	}
	if u, g, _, _ := systemUser(t, root, "meshbox"); u != uid || g != gid {
		t.Errorf("upgrade: user meshbox is %d:%d, was %d:%d", u, g, uid, gid)
	}
	wantFile(t, data, fs.ModeDir|0o700, uid, gid)
}
