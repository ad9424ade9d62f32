#!/bin/sh
# check-binary.sh BINARY GOARCH: checks with file(1) that BINARY is a static,
# stripped Linux executable for GOARCH (amd64, arm64 or arm), and prints its
# size.
set -eu
bin=$1
arch=$2
case $arch in
amd64) want='ELF 64-bit LSB executable, x86-64' ;;
arm64) want='ELF 64-bit LSB executable, ARM aarch64' ;;
arm) want='ELF 32-bit LSB executable, ARM, EABI5' ;;
*)
	echo "check-binary.sh: unknown architecture $arch" >&2
	exit 1
	;;
esac
if ! command -v file >/dev/null 2>&1; then
	echo "check-binary.sh: file(1) is missing (apt-get install file)" >&2
	exit 1
fi
desc=$(file -b "$bin")
for part in "$want" "statically linked" "stripped"; do
	case $desc in
	*"$part"*) ;;
	*)
		echo "check-binary.sh: $bin is not \"$part\": $desc" >&2
		exit 1
		;;
	esac
done
case $desc in
*"not stripped"*)
	echo "check-binary.sh: $bin is not stripped: $desc" >&2
	exit 1
	;;
esac
size=$(wc -c <"$bin")
echo "$bin: $arch, static, stripped, $((size / 1024)) KiB"
