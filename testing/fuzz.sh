#!/bin/sh
# fuzz.sh runs every fuzz target of the packages named for FUZZ_TIME
# (a duration like 10s, or a count like 2000x), JOBS targets at a time,
# each with one fuzzing worker: most of a short run is building the target
# and replaying its corpus, which one worker does as fast as two, so two
# targets side by side finish in about half the time on 2 cores. A
# target's output is printed when it fails (then the script fails), or its
# last line when it passes.
#
# usage: GO=go FUZZ_TIME=10s JOBS=2 sh testing/fuzz.sh PKG...
set -eu

: "${GO:=go}" "${FUZZ_TIME:=10s}" "${JOBS:=2}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# A package that cannot be listed (it does not build, or does not exist)
# fails the run with the go command's own error, and so does a run that
# finds no target at all: nothing is skipped without a word.
for pkg in "$@"; do
	if ! list=$($GO test -list '^Fuzz' "$pkg"); then
		echo "fuzz: cannot list the fuzz targets of $pkg" >&2
		exit 1
	fi
	for t in $(printf '%s\n' "$list" | grep '^Fuzz' || true); do
		echo "$pkg $t"
	done
done >"$out/targets"
if [ ! -s "$out/targets" ]; then
	echo "fuzz: no fuzz targets in $*" >&2
	exit 1
fi

# Each line "PKG TARGET" runs as one job; a failing job makes xargs
# stop starting new ones and exit non-zero.
export GO FUZZ_TIME out
xargs -P "$JOBS" -L 1 sh -c '
	log="$out/$(echo "$0.$1" | tr "/." "__").log"
	if $GO test -run "^\$" -fuzz "^$1\$" -fuzztime "$FUZZ_TIME" -parallel 1 "$0" >"$log" 2>&1; then
		last=$(grep -E "execs: [0-9]+" "$log" | tail -n 1 | sed "s/^fuzz: //")
		echo "fuzz $0 $1 ($FUZZ_TIME): ${last:-passed}"
	else
		echo "fuzz $0 $1 ($FUZZ_TIME) FAILED:"
		cat "$log"
		exit 255
	fi
' <"$out/targets"
