# meshbox — build, run, test.
#
#   make run    a standalone node on embedded defaults
#   make test   installs the services the tests need (RabbitMQ, PostgreSQL)
#               when missing, then runs every test with the race detector
#   make bench  the benchmarks, each against its raw baseline in the same run
#   make soak   two nodes under mixed load and connection churn for 30 minutes
#               (SOAK_DURATION=5m for less); fails if memory grows after warm-up

export PATH := $(PATH):/usr/local/go/bin
GO      ?= go
BIN     := bin/meshbox
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS := -X github.com/meshbox/meshbox/appliance.version=$(VERSION) -X github.com/meshbox/meshbox/appliance.commit=$(COMMIT)
# Arguments for `make run`, e.g. make run RUN_ARGS="--node alpha".
RUN_ARGS ?=
# Go's default 10m per test binary is too short for the fault tests under -race.
TEST_TIMEOUT ?= 30m
FUZZ_TIME ?= 10s
# make test gives each fuzz target a short run (its seeds also run as plain
# tests); make fuzz runs them for FUZZ_TIME.
TEST_FUZZ_TIME ?= 4s
SOAK_DURATION ?= 30m

.PHONY: all build run test test-short services fuzz bench soak lint install clean

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/meshbox

run: build
	./$(BIN) run $(RUN_ARGS)

services:
	bash testing/services.sh

test: services
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...
	$(MAKE) --no-print-directory fuzz FUZZ_TIME=$(TEST_FUZZ_TIME)

# Unit tests only: integration tests skip under -short. Not what CI runs.
test-short:
	$(GO) test -short -race ./...

# Each fuzz target runs briefly; a longer run: make fuzz FUZZ_TIME=5m.
fuzz:
	@for pkg in ./internal/names ./appliance ./bridge ./node ./cache; do \
		for t in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
			echo "fuzz $$pkg $$t ($(FUZZ_TIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZ_TIME) $$pkg || exit 1; \
		done; \
	done

bench: services
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 30m ./testing/bench/ | tee bench.out | grep -E '^(BENCH|ok|FAIL|---)'

# Not part of `make test`: the soak test builds only with -tags soak.
soak: services
	SOAK_DURATION=$(SOAK_DURATION) $(GO) test -tags soak -run '^TestSoak$$' -count=1 -timeout 0 -v ./testing/soak/

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# Install on a home server: the binary, the systemd unit, the module
# catalog directory and (only when absent) the environment file. DESTDIR stages the files for a package.
#   sudo make install && sudo systemctl daemon-reload
PREFIX ?= /usr/local
install: build
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/meshbox
	install -d -m 0755 $(DESTDIR)/etc/systemd/system
	sed 's|/usr/local/bin/meshbox|$(PREFIX)/bin/meshbox|' deploy/meshbox.service > $(DESTDIR)/etc/systemd/system/meshbox.service
	chmod 0644 $(DESTDIR)/etc/systemd/system/meshbox.service
	install -d -m 0755 $(DESTDIR)/etc/meshbox/modules
	@if [ -e $(DESTDIR)/etc/meshbox/meshbox.env ]; then \
		echo "kept $(DESTDIR)/etc/meshbox/meshbox.env"; \
	else \
		install -D -m 0600 deploy/meshbox.env.example $(DESTDIR)/etc/meshbox/meshbox.env; \
	fi

clean:
	rm -rf bin bench.out
