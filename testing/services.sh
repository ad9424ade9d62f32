#!/bin/sh
# services.sh installs what the integration tests need and do not build
# themselves: the RabbitMQ server, the PostgreSQL server binaries and the
# AMQP command-line tools, the mosquitto MQTT clients, a headless browser
# (chromium) for the status page and WebSocket tests, make and file for the package test, and Node.js with the npm
# packages of the rows worker example (docs/examples/rows-worker/js) and
# of the browser tests' pages (testing/e2e/browser), at the versions their
# lock files pin. It is idempotent: it installs only what is missing and prints
# one line per package installed. The tests start their
# own broker and database servers (testing/meshtest); a system service a
# package may have started is neither used nor touched.
set -eu

have_rabbitmq() {
	[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] ||
		command -v rabbitmq-server >/dev/null 2>&1 ||
		[ -x /usr/sbin/rabbitmq-server ]
}

have_postgres() {
	for d in /usr/lib/postgresql/*/bin; do
		[ -x "$d/initdb" ] && [ -x "$d/postgres" ] && [ -x "$d/pg_ctl" ] && return 0
	done
	return 1
}

have_amqp_tools() {
	command -v amqp-publish >/dev/null 2>&1
}

# The status page test renders the page in a headless browser.
have_chromium() {
	command -v chromium >/dev/null 2>&1
}

# The package test (testing/pkgtest) builds the .deb with make and
# dpkg-deb and checks the binaries with file.
have_file() {
	command -v file >/dev/null 2>&1 && command -v make >/dev/null 2>&1
}

# The rows worker test (testing/e2e) runs the example's JavaScript worker.
have_node() {
	command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1
}

# The MQTT test (testing/e2e) uses Debian's mosquitto clients, as a
# device would.
have_mosquitto() {
	command -v mosquitto_pub >/dev/null 2>&1 && command -v mosquitto_sub >/dev/null 2>&1
}

missing=""
have_rabbitmq || missing="$missing rabbitmq-server"
have_postgres || missing="$missing postgresql"
have_amqp_tools || missing="$missing amqp-tools"
have_chromium || missing="$missing chromium fonts-dejavu-core"
have_file || missing="$missing file make"
have_node || missing="$missing nodejs npm"
have_mosquitto || missing="$missing mosquitto-clients"

log=$(mktemp)
trap 'rm -f "$log"' EXIT

if [ -n "$missing" ]; then
if [ "$(id -u)" -ne 0 ]; then
	echo "services.sh: missing:$missing (run as root to install)" >&2
	exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "services.sh: missing:$missing (no apt-get: install them by hand)" >&2
	exit 1
fi

export DEBIAN_FRONTEND=noninteractive
if ! apt-get update -q >"$log" 2>&1 ||
	! apt-get install -y -q --no-install-recommends $missing >>"$log" 2>&1; then
	cat "$log" >&2
	echo "services.sh: installing$missing failed" >&2
	exit 1
fi
for p in $missing; do
	echo "services.sh: installed $p"
done
fi

# The discovery tests use the official NATS CLI as a host and a caller, the
# way a user would. It comes from the Go module proxy, built once.
if ! command -v nats >/dev/null 2>&1 && [ ! -x "$(go env GOPATH)/bin/nats" ]; then
	if ! go install github.com/nats-io/natscli/nats@v0.5.0 >"$log" 2>&1; then
		cat "$log" >&2
		echo "services.sh: installing the nats CLI failed" >&2
		exit 1
	fi
	echo "services.sh: installed the nats CLI"
fi

# The npm packages of the rows worker example and of the browser tests'
# pages (the official nats.ws client), again whenever a lock file changed.
root="$(cd "$(dirname "$0")/.." && pwd)"
for js in "$root/docs/examples/rows-worker/js" "$root/testing/e2e/browser"; do
	if [ ! -f "$js/node_modules/.package-lock.json" ] || [ "$js/package-lock.json" -nt "$js/node_modules/.package-lock.json" ]; then
		if ! (cd "$js" && npm ci --no-audit --no-fund) >"$log" 2>&1; then
			cat "$log" >&2
			echo "services.sh: npm ci in $js failed" >&2
			exit 1
		fi
		echo "services.sh: installed the npm packages of ${js#"$root"/}"
	fi
done
