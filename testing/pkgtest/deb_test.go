package pkgtest

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// debArch is this machine's Debian architecture.
func debArch(t *testing.T) string {
	t.Helper()
	switch runtime.GOARCH {
	case "amd64", "arm64":
		return runtime.GOARCH
	case "arm":
		return "armhf"
	}
	t.Fatalf("no Debian package for GOARCH %s (make deb builds amd64, arm64, arm)", runtime.GOARCH)
	return ""
}

// moduleRoot walks up from the working directory to go.mod.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// run runs name with args and returns its combined output; it fails the
// test when the command fails.
// rebuild is the environment of the test's own package builds after the
// first (make deb's, with the default compression, xz): gzip, which
// builds the same package with about a fortieth of the CPU.
var rebuild = []string{"DEB_COMPRESS=gzip"}

func run(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	out, err := runErr(env, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func runErr(env []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// scratchRoot is an empty root with a dpkg database, for dpkg --root.
func scratchRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates", "var/log"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "var/lib/dpkg/status"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

// dpkg runs dpkg on the scratch root. The maintainer scripts run without
// chroot, with DPKG_ROOT set to root.
func dpkg(t *testing.T, root string, args ...string) string {
	t.Helper()
	return run(t, nil, "dpkg", append([]string{"--root=" + root, "--force-script-chrootless",
		"--log=" + filepath.Join(root, "var/log/dpkg.log")}, args...)...)
}

// wantFile checks path's type, mode and owner (uid, gid).
func wantFile(t *testing.T, path string, mode fs.FileMode, uid, gid int) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Errorf("installed file: %v", err)
		return
	}
	if fi.Mode() != mode {
		t.Errorf("%s: got mode %v, want %v", path, fi.Mode(), mode)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if int(st.Uid) != uid || int(st.Gid) != gid {
		t.Errorf("%s: got owner %d:%d, want %d:%d", path, st.Uid, st.Gid, uid, gid)
	}
}

// readFile returns the content of path.
func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// systemUser returns the uid and gid of name in root's /etc/passwd.
func systemUser(t *testing.T, root, name string) (uid, gid int, home, shell string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if err != nil {
		t.Fatalf("system user %s: %v", name, err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Split(l, ":")
		if len(f) == 7 && f[0] == name {
			uid, _ = strconv.Atoi(f[2])
			gid, _ = strconv.Atoi(f[3])
			return uid, gid, f[5], f[6]
		}
	}
	t.Fatalf("system user %s: not in %s/etc/passwd:\n%s", name, root, data)
	return 0, 0, "", ""
}

// TestDebianPackage builds the package for this machine with make deb,
// installs it into a scratch root, checks what it installed and runs the
// installed binary; then installs a newer package over it (configuration
// and data kept), removes it (configuration and data kept) and purges it.
func TestDebianPackage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the package: not under -short")
	}
	if os.Geteuid() != 0 {
		t.Fatal("dpkg --root needs root to give the installed files their owners: run the test as root")
	}
	for _, tool := range []string{"make", "dpkg", "dpkg-deb", "file"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is missing (testing/services.sh installs it): %v", tool, err)
		}
	}
	arch := debArch(t)
	top := moduleRoot(t)
	dist := t.TempDir()
	start := time.Now()
	out := run(t, nil, "make", "-s", "-C", top, "deb", "DEB_ARCHES="+runtime.GOARCH, "DIST="+dist)
	t.Logf("make deb in %v:\n%s", time.Since(start).Round(time.Second), out)
	debs, _ := filepath.Glob(filepath.Join(dist, "meshbox_*_"+arch+".deb"))
	if len(debs) != 1 {
		t.Fatalf("make deb: got packages %v in %s, want one for %s", debs, dist, arch)
	}
	deb := debs[0]
	sums, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatalf("make deb: %v", err)
	}
	for _, name := range []string{"meshbox-linux-" + runtime.GOARCH, filepath.Base(deb)} {
		if !strings.Contains(string(sums), "  "+name+"\n") {
			t.Errorf("SHA256SUMS lacks %s:\n%s", name, sums)
		}
	}
	run(t, nil, "sh", "-c", "cd "+dist+" && sha256sum --check --quiet SHA256SUMS")

	info := run(t, nil, "dpkg-deb", "--field", deb, "Package", "Architecture", "Version")
	for _, want := range []string{"Package: meshbox", "Architecture: " + arch} {
		if !strings.Contains(info, want) {
			t.Errorf("control: lacks %q:\n%s", want, info)
		}
	}
	conffiles := run(t, nil, "sh", "-c", "dpkg-deb --info "+deb+" conffiles")
	if strings.TrimSpace(conffiles) != "/etc/meshbox/meshbox.env" {
		t.Errorf("conffiles: got %q, want /etc/meshbox/meshbox.env", conffiles)
	}

	// Install into a scratch root: the maintainer scripts make the user
	// and the data directory and print the next step.
	root := scratchRoot(t)
	out = dpkg(t, root, "--install", deb)
	for _, want := range []string{"nothing runs yet", "meshbox join TOKEN", "meshbox run", "systemctl enable --now meshbox",
		"sudo meshbox status"} {
		if !strings.Contains(out, want) {
			t.Errorf("first install: output lacks the next step %q:\n%s", want, out)
		}
	}
	uid, gid, home, shell := systemUser(t, root, "meshbox")
	if uid == 0 || home != "/var/lib/meshbox" || shell != "/usr/sbin/nologin" {
		t.Errorf("system user meshbox: got uid %d home %q shell %q, want a system uid, /var/lib/meshbox, /usr/sbin/nologin", uid, home, shell)
	}
	wantFile(t, filepath.Join(root, "usr/bin/meshbox"), 0o755, 0, 0)
	wantFile(t, filepath.Join(root, "usr/lib/systemd/system/meshbox.service"), 0o644, 0, 0)
	wantFile(t, filepath.Join(root, "usr/lib/systemd/system/meshbox.service.d/00-package.conf"), 0o644, 0, 0)
	// The backup's unit and timer, and where they write (root's alone).
	wantFile(t, filepath.Join(root, "usr/lib/systemd/system/meshbox-backup.service"), 0o644, 0, 0)
	wantFile(t, filepath.Join(root, "usr/lib/systemd/system/meshbox-backup.timer"), 0o644, 0, 0)
	wantFile(t, filepath.Join(root, "var/backups/meshbox"), fs.ModeDir|0o700, 0, 0)
	wantFile(t, filepath.Join(root, "etc/meshbox/meshbox.env"), 0o600, 0, 0)
	// The man page and bash completion, from the command table.
	wantFile(t, filepath.Join(root, "usr/share/man/man1/meshbox.1.gz"), 0o644, 0, 0)
	wantFile(t, filepath.Join(root, "usr/share/bash-completion/completions/meshbox"), 0o644, 0, 0)
	manGz, err := os.ReadFile(filepath.Join(root, "usr/share/man/man1/meshbox.1.gz"))
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(manGz))
	if err != nil {
		t.Fatalf("man page: %v", err)
	}
	man, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("man page: %v", err)
	}
	for _, want := range []string{".TH MESHBOX 1", ".SH COMMANDS", "\n.B program\n", "\n.B mesh\n", "-broker-admin"} {
		if !strings.Contains(string(man), want) {
			t.Errorf("man page lacks %q", want)
		}
	}
	if comp := readFile(t, filepath.Join(root, "usr/share/bash-completion/completions/meshbox")); !strings.Contains(comp, "complete -o default -F _meshbox meshbox") {
		t.Errorf("bash completion: got\n%s", comp)
	}
	wantFile(t, filepath.Join(root, "var/lib/meshbox"), fs.ModeDir|0o700, uid, gid)
	// The module catalog the unit names, and the drop-in that lets modules
	// run as their users.
	wantFile(t, filepath.Join(root, "etc/meshbox/modules"), fs.ModeDir|0o755, 0, 0)
	example := filepath.Join(root, "usr/share/doc/meshbox/examples/modules-as-users.conf")
	wantFile(t, example, 0o644, 0, 0)
	if got, want := readFile(t, example), readFile(t, filepath.Join(top, "deploy/modules-as-users.conf.example")); got != want {
		t.Errorf("%s is not deploy/modules-as-users.conf.example", example)
	}
	// Nothing enabled that the user did not ask for.
	if m, _ := filepath.Glob(filepath.Join(root, "etc/systemd/system/*/meshbox.service")); len(m) > 0 {
		t.Errorf("install enabled the unit: %v", m)
	}
	if m, _ := filepath.Glob(filepath.Join(root, "etc/systemd/system/*/meshbox-backup.timer")); len(m) > 0 {
		t.Errorf("install enabled the backup timer: %v", m)
	}
	status := run(t, nil, "dpkg-query", "--admindir="+filepath.Join(root, "var/lib/dpkg"),
		"--show", "--showformat=${Status}\n${Conffiles}\n", "meshbox")
	if !strings.Contains(status, "install ok installed") || !strings.Contains(status, "/etc/meshbox/meshbox.env ") {
		t.Errorf("dpkg status: got %q, want installed with the conffile /etc/meshbox/meshbox.env", status)
	}

	checkUnit(t, root)
	checkVersion(t, root)
	testUpgrade(t, root, deb, top, dist, uid, gid)
}

// checkUnit checks the installed unit: it runs the installed binary as the
// package's user, and systemd-analyze verify (where present) accepts it
// with its drop-in and says nothing.
func checkUnit(t *testing.T, root string) {
	t.Helper()
	unitDir := filepath.Join(root, "usr/lib/systemd/system")
	unit, err := os.ReadFile(filepath.Join(unitDir, "meshbox.service"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\nExecStart=/usr/bin/meshbox run\n", "\nEnvironmentFile=-/etc/meshbox/meshbox.env\n",
		"\nStateDirectory=meshbox\n", "\nEnvironment=MESHBOX_DATA=/var/lib/meshbox\n",
		"\nType=notify\n", "\nNotifyAccess=main\n"} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("meshbox.service lacks %q", strings.TrimSpace(want))
		}
	}
	dropIn, err := os.ReadFile(filepath.Join(unitDir, "meshbox.service.d/00-package.conf"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\nDynamicUser=no\n", "\nUser=meshbox\n", "\nGroup=meshbox\n"} {
		if !strings.Contains(string(dropIn), want) {
			t.Errorf("00-package.conf lacks %q", strings.TrimSpace(want))
		}
	}
	backupUnit, err := os.ReadFile(filepath.Join(unitDir, "meshbox-backup.service"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"exec /usr/bin/meshbox backup --out \"/var/backups/meshbox/", "--passphrase-file /etc/meshbox/backup.passphrase",
		"\nEnvironment=MESHBOX_DATA=/var/lib/meshbox\n", "\nType=oneshot\n"} {
		if !strings.Contains(string(backupUnit), want) {
			t.Errorf("meshbox-backup.service lacks %q", strings.TrimSpace(want))
		}
	}
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Logf("systemd-analyze not installed: unit not verified")
		return
	}
	// verify checks ExecStart's binary on this machine's file system: a
	// copy of the unit names the installed binary by its path in the root.
	dir := t.TempDir()
	fixed := strings.Replace(string(unit), "\nExecStart=/usr/bin/meshbox ", "\nExecStart="+filepath.Join(root, "usr/bin/meshbox")+" ", 1)
	if err := os.WriteFile(filepath.Join(dir, "meshbox.service"), []byte(fixed), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "meshbox.service.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "meshbox.service.d/00-package.conf"), dropIn, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runErr([]string{"SYSTEMD_UNIT_PATH=" + dir + ":"}, analyze, "verify", "--man=no", filepath.Join(dir, "meshbox.service"))
	if err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("systemd-analyze verify meshbox.service: %v\n%s", err, out)
	}
}

// checkVersion runs the installed binary's version command: a static
// binary runs from any root.
func checkVersion(t *testing.T, root string) {
	t.Helper()
	bin := filepath.Join(root, "usr/bin/meshbox")
	desc := run(t, nil, "file", "-b", bin)
	for _, want := range []string{"statically linked", "stripped"} {
		if !strings.Contains(desc, want) || strings.Contains(desc, "not stripped") {
			t.Errorf("installed binary: file says %q, want %q", desc, want)
		}
	}
	// No node answers on port 1: the command still prints the binary's build.
	out := run(t, []string{"MESHBOX_SERVER=nats://127.0.0.1:1"}, bin, "version")
	arch := runtime.GOOS + "/" + runtime.GOARCH
	if runtime.GOARCH == "arm" {
		arch += "/v7"
	}
	for _, want := range []string{"meshbox ", "commit", "built", runtime.Version(), "arch", arch} {
		if !strings.Contains(out, want) {
			t.Errorf("meshbox version: output lacks %q:\n%s", want, out)
		}
	}
	for _, bad := range []string{"meshbox dev\n", "built   -", "commit  -"} {
		if strings.Contains(out, bad) {
			t.Errorf("meshbox version: the build is not stamped (%q):\n%s", bad, out)
		}
	}
}

// testUpgrade installs a newer package over the installed one: the
// configuration a user wrote (the conffile), its mode and the data files
// stay. Then remove keeps both; purge deletes both.
func testUpgrade(t *testing.T, root, deb, top, dist string, uid, gid int) {
	t.Helper()
	env := filepath.Join(root, "etc/meshbox/meshbox.env")
	joined := "# written by meshbox join\nMESHBOX_NODE=attic\nMESHBOX_DB=postgres://attic:secret@db.example.org/mesh\n"
	if err := os.WriteFile(env, []byte(joined), 0o600); err != nil {
		t.Fatal(err)
	}
	outbox := filepath.Join(root, "var/lib/meshbox/outbox.db")
	if err := os.WriteFile(outbox, []byte("not sent yet"), 0o600); err != nil {
		t.Fatal(err)
	}
	module := filepath.Join(root, "etc/meshbox/modules/greeter/manifest.json")
	if err := os.MkdirAll(filepath.Dir(module), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(module, []byte(`{"name": "greeter"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(outbox, uid, gid); err != nil {
		t.Fatal(err)
	}

	// The same binary as a newer version: build.sh is what make deb runs.
	old := run(t, nil, "dpkg-deb", "--field", deb, "Version")
	newer := filepath.Join(t.TempDir(), "newer")
	run(t, rebuild, "sh", filepath.Join(top, "deploy/deb/build.sh"), filepath.Join(dist, "meshbox-linux-"+runtime.GOARCH),
		runtime.GOARCH, "v99.0.0", strconv.FormatInt(time.Now().Unix(), 10), newer)
	debs, _ := filepath.Glob(filepath.Join(newer, "meshbox_99.0.0_*.deb"))
	if len(debs) != 1 {
		t.Fatalf("newer package: got %v", debs)
	}
	if out, err := runErr(nil, "dpkg", "--compare-versions", "99.0.0", "gt", strings.TrimSpace(old)); err != nil {
		t.Fatalf("version 99.0.0 does not sort after %s: %v %s", old, err, out)
	}
	out := dpkg(t, root, "--install", debs[0])
	if strings.Contains(out, "nothing runs yet") {
		t.Errorf("upgrade: printed the first-install steps again:\n%s", out)
	}
	got, err := os.ReadFile(env)
	if err != nil || string(got) != joined {
		t.Errorf("upgrade: configuration: got %q (%v), want the user's %q", got, err, joined)
	}
	wantFile(t, env, 0o600, 0, 0)
	if got, err := os.ReadFile(outbox); err != nil || string(got) != "not sent yet" {
		t.Errorf("upgrade: data file: got %q (%v), want it kept", got, err)
	}
	wantFile(t, filepath.Join(root, "var/lib/meshbox"), fs.ModeDir|0o700, uid, gid)
	if _, err := os.Stat(filepath.Join(root, "etc/meshbox/meshbox.env.dpkg-new")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("upgrade: left a meshbox.env.dpkg-new beside the configuration (%v)", err)
	}
	testUpgradeChangedSettings(t, root, top, dist, env, joined)

	dpkg(t, root, "--remove", "meshbox")
	if _, err := os.Stat(filepath.Join(root, "usr/bin/meshbox")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("remove: the binary is still there (%v)", err)
	}
	for _, p := range []string{env, outbox, module} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("remove: %s not kept: %v", p, err)
		}
	}
	dpkg(t, root, "--purge", "meshbox")
	for _, p := range []string{env, outbox, filepath.Join(root, "var/lib/meshbox"), filepath.Join(root, "etc/meshbox/modules")} {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("purge: %s still there (%v)", p, err)
		}
	}
	if t.Failed() {
		t.Log(run(t, nil, "find", root, "-not", "-path", "*/var/lib/dpkg/*"))
	}
}

// testUpgradeChangedSettings installs a newer package whose shipped
// settings file changed over a root where the user's differ (as after
// meshbox join). dpkg would ask which to keep; --force-confold, as the
// README says for unattended upgrades, keeps the user's without asking and
// leaves the package's beside it as meshbox.env.dpkg-dist, root-only too.
func testUpgradeChangedSettings(t *testing.T, root, top, dist, env, joined string) {
	t.Helper()
	// build.sh takes the example from the tree it is in: a copy with one
	// more line.
	tree := t.TempDir()
	run(t, nil, "cp", "-r", filepath.Join(top, "deploy"), filepath.Join(top, "README.md"), filepath.Join(top, "docs"), tree)
	f, err := os.OpenFile(filepath.Join(tree, "deploy/meshbox.env.example"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	const added = "#MESHBOX_SETTING_OF_A_NEWER_RELEASE=on\n"
	if _, err := f.WriteString(added); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	run(t, rebuild, "sh", filepath.Join(tree, "deploy/deb/build.sh"), filepath.Join(dist, "meshbox-linux-"+runtime.GOARCH),
		runtime.GOARCH, "v99.1.0", strconv.FormatInt(time.Now().Unix(), 10), out)
	debs, _ := filepath.Glob(filepath.Join(out, "meshbox_99.1.0_*.deb"))
	if len(debs) != 1 {
		t.Fatalf("package with changed settings: got %v", debs)
	}
	dpkg(t, root, "--force-confold", "--install", debs[0])
	if got, err := os.ReadFile(env); err != nil || string(got) != joined {
		t.Errorf("upgrade with changed settings: configuration: got %q (%v), want the user's %q", got, err, joined)
	}
	wantFile(t, env, 0o600, 0, 0)
	dist2 := env + ".dpkg-dist"
	if got, err := os.ReadFile(dist2); err != nil || !strings.HasSuffix(string(got), added) {
		t.Errorf("upgrade with changed settings: the package's version beside the user's: got %.60q... (%v), want it ending in %q", got, err, added)
	}
	wantFile(t, dist2, 0o600, 0, 0)
}

// TestDebianVersion checks how build.sh turns make's VERSION (git
// describe) into a Debian version that sorts newer builds higher: a bare
// commit, even one that starts with a digit, is 0~<commit time>+<commit>.
func TestDebianVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds packages: not under -short")
	}
	top := moduleRoot(t)
	bin := filepath.Join(t.TempDir(), "meshbox")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho stand-in\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	const epoch = "1764493200" // 2025-11-30T09:00:00Z
	tests := []struct{ version, want string }{
		{"v1.2.3-rc1", "1.2.3~rc1"},
		{"v1.2.3-rc1-2-g1234567", "1.2.3~rc1+2+g1234567"},
		{"v1.2.3", "1.2.3"},
		{"v1.2.3-4-gabcdef1", "1.2.3+4+gabcdef1"},
		{"v1.2.3-4-gabcdef1-dirty", "1.2.3+4+gabcdef1+dirty"},
		{"a82dede", "0~20251130090000+a82dede"},
		{"97e7ab2", "0~20251130090000+97e7ab2"},
		{"97e7ab2-dirty", "0~20251130090000+97e7ab2+dirty"},
	}
	var prev string
	for _, tt := range tests {
		out := t.TempDir()
		run(t, nil, "sh", filepath.Join(top, "deploy/deb/build.sh"), bin, "amd64", tt.version, epoch, out)
		got := strings.TrimSpace(run(t, nil, "sh", "-c", "dpkg-deb --field "+out+"/*.deb Version"))
		if got != tt.want {
			t.Errorf("VERSION %s: got Debian version %q, want %q", tt.version, got, tt.want)
		}
		if strings.HasPrefix(tt.version, "v") && prev != "" {
			if _, err := runErr(nil, "dpkg", "--compare-versions", got, "ge", prev); err != nil {
				t.Errorf("%s sorts before %s", got, prev)
			}
		}
		prev = got
	}
	if out, err := runErr([]string{"DEB_COMPRESS=zstd"}, "sh", filepath.Join(top, "deploy/deb/build.sh"), bin, "amd64", "v1.2.3", epoch, t.TempDir()); err == nil || !strings.Contains(out, "want xz, gzip or none") {
		t.Errorf("DEB_COMPRESS=zstd: %v, %q; want refused, naming the choices", err, out)
	}
	if _, err := runErr(nil, "sh", filepath.Join(top, "deploy/deb/build.sh"), bin, "amd64", "v1.2.3 4", epoch, t.TempDir()); err == nil {
		t.Error("VERSION with a space: built a package, want a refusal")
	}
}
