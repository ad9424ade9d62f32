#!/bin/sh
# build.sh BINARY GOARCH VERSION SOURCE_DATE_EPOCH OUTDIR builds
# OUTDIR/meshbox_<debian version>_<debian arch>.deb with dpkg-deb from a
# binary of make dist. Called by make deb.
#
# The package holds:
#   /usr/bin/meshbox                                  the binary
#   /usr/lib/systemd/system/meshbox.service           deploy/meshbox.service (ExecStart /usr/bin/meshbox)
#   /usr/lib/systemd/system/meshbox.service.d/00-package.conf
#                                                     runs the node as the system user meshbox
#   /usr/lib/systemd/system/meshbox-backup.service    deploy/meshbox-backup.service (a backup of the node)
#   /usr/lib/systemd/system/meshbox-backup.timer      deploy/meshbox-backup.timer (daily; not enabled)
#   /usr/lib/sysusers.d/meshbox.conf                  that user
#   /usr/lib/tmpfiles.d/meshbox.conf                  its data directory, 0700, and /var/backups/meshbox, 0700
#   /etc/meshbox/meshbox.env                          conffile, 0600: kept on upgrade
#   /etc/meshbox/modules                              the module catalog, empty (0755)
#   /var/lib/meshbox                                  the data directory (cache, outbox)
#   /usr/share/doc/meshbox/README.md, copyright
#   /usr/share/doc/meshbox/examples/modules-as-users.conf
#                                                     the drop-in that lets modules run as their users
#   /usr/share/man/man1/meshbox.1.gz                  OUTDIR/meshbox.1.gz (meshbox man)
#   /usr/share/bash-completion/completions/meshbox    OUTDIR/meshbox.bash (meshbox completion bash)
# and the maintainer scripts postinst, prerm and postrm of this directory.
# DEB_COMPRESS picks the compression of its data: xz (the default, the
# smallest download), gzip (about 40 times less CPU to build; the package
# test's rebuilds use it) or none.
set -eu

if [ $# -ne 5 ]; then
	echo "usage: build.sh BINARY GOARCH VERSION SOURCE_DATE_EPOCH OUTDIR" >&2
	exit 2
fi
bin=$1
goarch=$2
version=$3
epoch=$4
out=$5
compress=${DEB_COMPRESS:-xz}
case $compress in
xz | gzip | none) ;;
*)
	echo "build.sh: DEB_COMPRESS=$compress: want xz, gzip or none" >&2
	exit 2
	;;
esac
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)

case $goarch in
amd64) arch=amd64 ;;
arm64) arch=arm64 ;;
arm) arch=armhf ;;
*)
	echo "build.sh: no Debian architecture for GOARCH $goarch" >&2
	exit 1
	;;
esac

# A Debian version starts with a digit and sorts newer builds higher:
# v1.2.3 -> 1.2.3; v1.2.3-4-gabc -> 1.2.3+4+gabc; a pre-release sorts
# before its release: v1.2.3-rc1 -> 1.2.3~rc1; anything else (a bare
# commit, which may start with a digit too) -> 0~<commit time>+<commit>.
if echo "$version" | grep -Eq '^v?[0-9]+(\.[0-9]+)+([-+~.][A-Za-z0-9.+~-]*)?$'; then
	debversion=$(echo "${version#v}" | sed -E 's/^([0-9.]+)-(alpha|beta|rc|pre)/\1~\2/' | tr - +)
else
	debversion="0~$(date -u -d "@$epoch" +%Y%m%d%H%M%S)+$(echo "$version" | tr - +)"
fi
if ! echo "$debversion" | grep -Eq '^[0-9][A-Za-z0-9.+~]*$'; then
	echo "build.sh: version $version does not make a Debian version ($debversion)" >&2
	exit 1
fi

[ -x "$bin" ] || {
	echo "build.sh: $bin is not an executable (run make dist)" >&2
	exit 1
}

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/root
umask 022
install -d "$root/DEBIAN" "$root/usr/bin" "$root/usr/lib/systemd/system/meshbox.service.d" \
	"$root/usr/lib/sysusers.d" "$root/usr/lib/tmpfiles.d" "$root/etc/meshbox" \
	"$root/etc/meshbox/modules" "$root/usr/share/doc/meshbox/examples"
install -d -m 0700 "$root/var/lib/meshbox"
install -m 0755 "$bin" "$root/usr/bin/meshbox"
sed 's|/usr/local/bin/meshbox|/usr/bin/meshbox|g' "$top/deploy/meshbox.service" >"$root/usr/lib/systemd/system/meshbox.service"
install -m 0644 "$here/00-package.conf" "$root/usr/lib/systemd/system/meshbox.service.d/00-package.conf"
sed 's|/usr/local/bin/meshbox|/usr/bin/meshbox|g' "$top/deploy/meshbox-backup.service" >"$root/usr/lib/systemd/system/meshbox-backup.service"
install -m 0644 "$top/deploy/meshbox-backup.timer" "$root/usr/lib/systemd/system/meshbox-backup.timer"
install -m 0644 "$here/sysusers.conf" "$root/usr/lib/sysusers.d/meshbox.conf"
install -m 0644 "$here/tmpfiles.conf" "$root/usr/lib/tmpfiles.d/meshbox.conf"
install -m 0600 "$top/deploy/meshbox.env.example" "$root/etc/meshbox/meshbox.env"
install -m 0644 "$top/README.md" "$root/usr/share/doc/meshbox/README.md"
install -d -m 0755 "$root/usr/share/doc/meshbox/docs"
install -m 0644 "$top"/docs/*.md "$root/usr/share/doc/meshbox/docs/"
install -m 0644 "$here/copyright" "$root/usr/share/doc/meshbox/copyright"
install -m 0644 "$top/deploy/modules-as-users.conf.example" "$root/usr/share/doc/meshbox/examples/modules-as-users.conf"
# The man page and bash completion, from the command table (meshbox man,
# meshbox completion bash): make deb writes them to OUTDIR with a binary
# of the building machine (a package's binary may be of another
# architecture); without them there, the package's binary makes them.
install -d -m 0755 "$root/usr/share/man/man1" "$root/usr/share/bash-completion/completions"
if [ -f "$out/meshbox.1.gz" ] && [ -f "$out/meshbox.bash" ]; then
	cp "$out/meshbox.1.gz" "$stage/meshbox.1.gz"
	cp "$out/meshbox.bash" "$stage/meshbox.bash"
else
	"$bin" man | gzip -n -9 >"$stage/meshbox.1.gz"
	"$bin" completion bash >"$stage/meshbox.bash"
fi
install -m 0644 "$stage/meshbox.1.gz" "$root/usr/share/man/man1/meshbox.1.gz"
install -m 0644 "$stage/meshbox.bash" "$root/usr/share/bash-completion/completions/meshbox"
for s in postinst prerm postrm; do
	install -m 0755 "$here/$s" "$root/DEBIAN/$s"
done
echo /etc/meshbox/meshbox.env >"$root/DEBIAN/conffiles"

size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<CONTROL
Package: meshbox
Version: $debversion
Architecture: $arch
Maintainer: meshbox authors <meshbox@invalid>
Installed-Size: $size
Section: net
Priority: optional
Homepage: https://github.com/meshbox/meshbox
Description: turns a home server into a node of a mesh
 meshbox is one static binary: an embedded NATS server for the programs on
 the machine, a cache of the mesh's bindings, and one outbound link to the
 mesh's RabbitMQ broker that carries requests, commands and events, with a
 durable outbox while the broker is away.
 .
 Nothing runs after installation: join a mesh with meshbox join TOKEN, or
 start a standalone node, then systemctl enable --now meshbox.
CONTROL

# Every file dated the commit's time, not the build's.
find "$root" -exec touch -h -d "@$epoch" {} +
mkdir -p "$out"
deb="$out/meshbox_${debversion}_${arch}.deb"
SOURCE_DATE_EPOCH=$epoch dpkg-deb --root-owner-group "-Z$compress" --build "$root" "$deb" >/dev/null
echo "$deb: $(($(wc -c <"$deb") / 1024)) KiB"
