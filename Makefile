# Convenience targets; the README's commands work without make.
.PHONY: test bench demo check soak release

test:
	go test -race -count=1 ./...

bench:
	go run ./cmd/walrelay-bench -events 200000 -runs 3 -debezium -shards 2 -exactly-once -inbox 20000 -svg docs/latency.svg

demo:
	go run -tags demo ./cmd/walrelay demo --count 10

check:
	gofmt -l . && go vet ./... && go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./... && go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 -tags demo ./cmd/walrelay

# The chaos test for 10 minutes against kfake, then against a real Apache
# Kafka broker (WALRELAY_SOAK sets the length), in at-least-once and in
# exactly-once mode.
soak:
	WALRELAY_TEST_LONG=1 WALRELAY_SOAK=10m go test -count=1 -v -timeout 30m -run '^TestChaos$$' ./cmd/walrelay/
	WALRELAY_TEST_LONG=1 WALRELAY_SOAK=10m WALRELAY_TEST_KAFKA=real go test -count=1 -v -timeout 30m -run '^TestChaos$$' ./cmd/walrelay/
	WALRELAY_TEST_LONG=1 WALRELAY_SOAK=10m go test -count=1 -v -timeout 30m -run '^TestChaosExactlyOnce$$' ./cmd/walrelay/
	WALRELAY_TEST_LONG=1 WALRELAY_SOAK=10m WALRELAY_TEST_KAFKA=real go test -count=1 -v -timeout 30m -run '^TestChaosExactlyOnce$$' ./cmd/walrelay/

# Static binaries for linux/amd64 and linux/arm64 with checksums, in dist/:
# what the README's install section tells users to get. VERSION defaults to
# the nearest tag (or the commit).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
BUILD_DATE ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
LDFLAGS = -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.buildDate=$(BUILD_DATE)

release:
	rm -rf dist && mkdir -p dist
	for arch in amd64 arm64; do \
		CGO_ENABLED=0 GOOS=linux GOARCH=$$arch go build -trimpath -ldflags "$(LDFLAGS)" -o dist/walrelay-linux-$$arch ./cmd/walrelay || exit 1; \
	done
	cd dist && sha256sum walrelay-linux-* > SHA256SUMS
