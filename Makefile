# meshbox — build, run, test.
#
#   make run    a standalone node on embedded defaults
#   make test   installs the services the tests need (RabbitMQ, PostgreSQL)
#               when missing, then runs every test, with the race detector
#               wherever a test runs the node in its own process; as root
#               (apt-get, and the package test's dpkg)
#   make bench  the benchmarks, each against its raw baseline in the same run
#   make bench-wan  only the WAN profile (25 ms each way between each node
#               and the broker: commands, requests, events, an outbox
#               drained, a blob on a 1 Mbit/s link, ordered handling by
#               round trip, a node joining a table of 100,000 rows) and
#               an idle node's bytes, several minutes
#   make soak   two nodes under mixed load and connection churn for 30 minutes
#               (SOAK_DURATION=5m for less); fails if memory grows after warm-up;
#               then the broker-cluster fault scenario with 10,000 commands
#               and 10,000 events
#   make dist   static, stripped binaries for linux/amd64, arm64 and arm (v7)
#               under dist/, with SHA256SUMS
#   make deb    a Debian package per architecture (DEB_ARCHES) from those binaries

export PATH := $(PATH):/usr/local/go/bin
GO      ?= go
BIN     := bin/meshbox
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null)
# The build date is the commit's time (or SOURCE_DATE_EPOCH), so rebuilding
# a commit does not change its stamp.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || date +%s)
BUILD_DATE ?= $(shell date -u -d @$(SOURCE_DATE_EPOCH) +%Y-%m-%dT%H:%M:%SZ)
LDFLAGS := -X github.com/meshbox/meshbox/appliance.version=$(VERSION) -X github.com/meshbox/meshbox/appliance.commit=$(COMMIT) -X github.com/meshbox/meshbox/appliance.buildDate=$(BUILD_DATE)
# make dist and make deb: Go architectures (arm is ARMv7, GOARM=7) and where
# the artefacts go.
DIST       ?= dist
DIST_ARCHES ?= amd64 arm64 arm
DEB_ARCHES ?= $(DIST_ARCHES)
# Arguments for `make run`, e.g. make run RUN_ARGS="--node alpha". Its data
# directory is the checkout's own (RUN_DATA), never a packaged node's
# /var/lib/meshbox: run as root it would leave files there that node's
# user cannot read.
RUN_ARGS ?=
RUN_DATA ?= .run
# Go's default 10m per test binary is too short for the fault tests under -race.
TEST_TIMEOUT ?= 30m
# Test binaries of the race-detected run at once. The end-to-end and
# package tests run beside them, two more: four at a time in all, as
# many as a 2-core machine takes while brokers boot (at five, a broker's
# boot took over two minutes once), the integration packages mostly
# waiting on brokers, databases and timers.
TEST_PARALLEL ?= 2
FUZZ_TIME ?= 10s
# make test gives each fuzz target a short run (its seeds also run as plain
# tests); make fuzz runs them for FUZZ_TIME. A count, not a duration: Go
# 1.26's fuzzing coordinator can fail a run whose -fuzztime deadline ends
# while a worker is busy ("context deadline exceeded", no failing input;
# Go issue 75804, fixed in 1.27); a count has no deadline to race.
TEST_FUZZ_TIME ?= 2000x
SOAK_DURATION ?= 30m

.PHONY: all build run test test-short services fuzz bench bench-wan bench-hops soak lint install clean dist deb

all: build

# Static and -trimpath, as make dist builds a release: the packages one
# compiles are the other's (and the tests' meshbox, testing/meshtest).
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/meshbox

run: build
	./$(BIN) run --data $(RUN_DATA) $(RUN_ARGS)

services:
	bash testing/services.sh

# The tests run the meshbox of make build (MESHTEST_MESHBOX) instead of
# each test binary building its own. -trimpath keeps the build cache's
# entries free of the checkout's path: a second clone, or a worktree,
# compiles nothing the first one compiled.
# Two runs of go test side by side. The packages whose tests run the
# node in their own process run with the race detector. The end-to-end
# and package tests (PROCESS_PKGS) run the node only as processes, the
# meshbox of make build, which the detector does not instrument: in
# their test binaries it would watch nothing but the harness, so they
# run without it, and from the start: the end-to-end package is the
# longest of all, and the others fill the cores beside it instead of
# leaving it alone at the end.
# The fuzz targets' short run goes beside the tests at the lowest CPU
# priority, its output held until they end: the suite leaves a core idle
# part of the time (tests that wait on brokers and timers), and the fuzz
# runs (100 s and 170 s of CPU on 2 cores) take that time instead of
# running after the tests. The run fails when any of the three fails.
PROCESS_PKGS := ./testing/e2e ./testing/pkgtest
# go test starts its packages' runs in the order it is given them: the
# race-detected ones go longest first (as measured in make test), so
# that what starts last is short and both slots end about together
# (in name order, the cluster's fault test, 100 s, started last).
RACE_FIRST := ./bridge ./appliance/rows ./testing/cluster ./cache/meshdb ./testing/meshtest ./appliance ./cmd/meshbox ./node ./bridge/brokeradmin
test: services build
	$(GO) vet -trimpath ./...
	$(GO) vet -trimpath -tags hoptrace ./bridge ./testing/bench
	@fuzzlog=$$(mktemp); \
	( nice -n 19 $(MAKE) --no-print-directory fuzz FUZZ_TIME=$(TEST_FUZZ_TIME) >"$$fuzzlog" 2>&1; echo $$? >"$$fuzzlog.rc" ) & \
	( MESHTEST_MESHBOX=$(abspath $(BIN)) $(GO) test -trimpath -count=1 -p 2 -timeout $(TEST_TIMEOUT) $(PROCESS_PKGS); echo $$? >"$$fuzzlog.prc" ) & \
	first=$$($(GO) list $(RACE_FIRST)) || exit 1; \
	inproc="$$first $$($(GO) list ./... | grep -v -x -e '.*/testing/e2e' -e '.*/testing/pkgtest' $$(printf -- '-e %s ' $$first))"; \
	echo "MESHTEST_MESHBOX=$(abspath $(BIN)) $(GO) test -trimpath -count=1 $(PROCESS_PKGS), and beside it -race -p $(TEST_PARALLEL) the other packages (fuzz targets beside them)"; \
	MESHTEST_MESHBOX=$(abspath $(BIN)) $(GO) test -trimpath -race -count=1 -p $(TEST_PARALLEL) -timeout $(TEST_TIMEOUT) $$inproc; rc=$$?; \
	wait; cat "$$fuzzlog"; frc=$$(cat "$$fuzzlog.rc" 2>/dev/null || echo 1); prc=$$(cat "$$fuzzlog.prc" 2>/dev/null || echo 1); \
	rm -f "$$fuzzlog" "$$fuzzlog.rc" "$$fuzzlog.prc"; \
	if [ $$frc -ne 0 ]; then echo "make test: the fuzz targets failed (above)"; fi; \
	if [ $$prc -ne 0 ]; then echo "make test: the end-to-end or package tests failed (above)"; fi; \
	[ $$rc -eq 0 ] && [ $$prc -eq 0 ] && [ $$frc -eq 0 ]

# Unit tests only: integration tests skip under -short. Not what CI runs.
test-short:
	$(GO) test -short -race ./...

# Each fuzz target runs briefly, two side by side (testing/fuzz.sh); a
# longer run: make fuzz FUZZ_TIME=5m.
FUZZ_PKGS ?= ./internal/names ./internal/seal ./appliance ./appliance/rows ./bridge ./bridge/outbox ./node ./cache
FUZZ_JOBS ?= 2
fuzz:
	@GOFLAGS="$(GOFLAGS) -trimpath" GO="$(GO)" FUZZ_TIME="$(FUZZ_TIME)" JOBS="$(FUZZ_JOBS)" sh testing/fuzz.sh $(FUZZ_PKGS)

# Every benchmark, the WAN profile's too. SWEEP lines are the raw
# baseline's settings the WAN profile tries before it picks the best.
bench: services
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 60m ./testing/bench/ | tee bench.out | grep -E '^(BENCH|SWEEP|ok|FAIL|---)'

# The WAN profile alone (BenchmarkWAN): each node, and each raw client,
# reaches the broker through a proxy that adds 25 ms each way.
bench-wan: services
	$(GO) test -run '^$$' -bench '^(BenchmarkWAN|BenchmarkWANBlob|BenchmarkWANRowsJoin|BenchmarkOrdered|BenchmarkIdleBytes)$$' -benchtime 1x -timeout 45m ./testing/bench/ | tee bench-wan.out | grep -E '^(BENCH|SWEEP|ok|FAIL|---)'

# The request round trip taken apart, stretch by stretch: the bridge
# records its points only in a build with -tags hoptrace.
bench-hops: services
	$(GO) test -tags hoptrace -run '^$$' -bench RequestHops -benchtime 1x -timeout 10m ./testing/bench/ | grep -E '^(HOPS|BENCH|ok|FAIL|---)'

# Not part of `make test`: the soak test builds only with -tags soak.
soak: services
	SOAK_DURATION=$(SOAK_DURATION) $(GO) test -tags soak -run '^TestSoak' -count=1 -timeout 0 -v ./testing/soak/

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags hoptrace ./bridge ./testing/bench

# Install on a home server: the binary, the systemd units (the node, and
# its backup timer, not enabled), the module
# catalog directory and (only when absent) the environment file. DESTDIR stages the files for a package.
#   sudo make install && sudo systemctl daemon-reload
PREFIX ?= /usr/local
install: build
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/meshbox
	install -d -m 0755 $(DESTDIR)/etc/systemd/system
	sed 's|/usr/local/bin/meshbox|$(PREFIX)/bin/meshbox|' deploy/meshbox.service > $(DESTDIR)/etc/systemd/system/meshbox.service
	chmod 0644 $(DESTDIR)/etc/systemd/system/meshbox.service
	sed 's|/usr/local/bin/meshbox|$(PREFIX)/bin/meshbox|' deploy/meshbox-backup.service > $(DESTDIR)/etc/systemd/system/meshbox-backup.service
	install -m 0644 deploy/meshbox-backup.timer $(DESTDIR)/etc/systemd/system/meshbox-backup.timer
	chmod 0644 $(DESTDIR)/etc/systemd/system/meshbox-backup.service
	install -d -m 0700 $(DESTDIR)/var/backups/meshbox
	install -d -m 0755 $(DESTDIR)/etc/meshbox/modules
	@if [ -e $(DESTDIR)/etc/meshbox/meshbox.env ]; then \
		echo "kept $(DESTDIR)/etc/meshbox/meshbox.env"; \
	else \
		install -D -m 0600 deploy/meshbox.env.example $(DESTDIR)/etc/meshbox/meshbox.env; \
	fi

# Static (no cgo), stripped, path-free binaries: dist/meshbox-linux-<arch>.
# Each is checked with file(1): a static executable of its architecture.
dist:
	@mkdir -p $(DIST)
	@for a in $(DIST_ARCHES); do \
		out=$(DIST)/meshbox-linux-$$a; \
		CGO_ENABLED=0 GOOS=linux GOARCH=$$a GOARM=7 $(GO) build -trimpath \
			-ldflags "-s -w $(LDFLAGS)" -o $$out ./cmd/meshbox || exit 1; \
		sh deploy/check-binary.sh $$out $$a || exit 1; \
	done
	@cd $(DIST) && sha256sum meshbox-linux-* $$(ls *.deb 2>/dev/null) > SHA256SUMS
	@cat $(DIST)/SHA256SUMS

# One .deb per architecture from the binaries of make dist, built with
# dpkg-deb (deploy/deb/build.sh says what goes in). The manual page and
# the completion script come from this machine's binary of make dist when
# it is one of them and runs here (the same program, and no second build
# of every package with go run's flags), else from go run.
HOST_ARCH := $(shell $(GO) env GOARCH 2>/dev/null)
deb:
	@$(MAKE) --no-print-directory dist DIST_ARCHES="$(DEB_ARCHES)"
	@if $(DIST)/meshbox-linux-$(HOST_ARCH) version >/dev/null 2>&1; then \
		gen() { $(DIST)/meshbox-linux-$(HOST_ARCH) "$$@"; }; \
	else \
		gen() { $(GO) run -ldflags "$(LDFLAGS)" ./cmd/meshbox "$$@"; }; \
	fi; \
	gen man | gzip -n -9 > $(DIST)/meshbox.1.gz && gen completion bash > $(DIST)/meshbox.bash
	@for a in $(DEB_ARCHES); do \
		sh deploy/deb/build.sh $(DIST)/meshbox-linux-$$a $$a "$(VERSION)" $(SOURCE_DATE_EPOCH) $(DIST) || exit 1; \
	done
	@cd $(DIST) && sha256sum meshbox-linux-* $$(ls *.deb 2>/dev/null) > SHA256SUMS

clean:
	rm -rf bin bench.out bench-wan.out $(DIST)
