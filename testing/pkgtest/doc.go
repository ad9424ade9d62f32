// Package pkgtest checks the Debian package of meshbox the way a home
// server receives it: make deb builds the package for this machine's
// architecture, dpkg installs it into a scratch root (dpkg --root, the
// maintainer scripts run without chroot with DPKG_ROOT set, so they touch
// nothing of the machine that runs the test), and the test checks what is
// installed — files, modes, owners, the conffile, the system user, the
// data directory, the unit — runs the installed binary, then upgrades,
// removes and purges the package. The postinst is also run on its own
// with only the commands of its fallback on PATH (useradd, chown, chmod:
// no systemd-sysusers or systemd-tmpfiles, as in a container), so both
// ways of making the system user and the data directory are checked on
// every machine.
//
// It needs dpkg, dpkg-deb, make and file (testing/services.sh installs
// them) and root (dpkg chowns the files it installs); systemd-analyze,
// where present, verifies the unit.
package pkgtest
